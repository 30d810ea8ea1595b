"""The recurrent ops on the CPU: one cell step, and whole sequences with their time loops compiled."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np

from .. import _kernels as K
from ..graph import Node
from ..recurrent import layer_runs, recurrent_kind, run_sequence
from .linear import dynamic_linear
from .types import Prepare, Step


def _cell(op_kind: str) -> Prepare:
    """rnn/lstm/gru_cell_dynamic: one step, states in and new states out."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        rr, engine = node.attrs["reduce_range"], node.attrs["engine"]
        cell = K.Recurrent(
            recurrent_kind(op_kind, node.attrs),
            dynamic_linear(c, rr, "ih_", engine),
            dynamic_linear(c, rr, "hh_", engine),
        )

        def step(x, h, c_state=None):
            c_in = h if c_state is None else c_state
            if x.shape[0] != h.shape[0] or x.shape[0] != c_in.shape[0]:
                raise ValueError(f"x has batch {x.shape[0]} but the state has batch {h.shape[0]}")
            h_out = np.empty(h.shape, np.float32)
            c_out = h_out if c_state is None else np.empty(h.shape, np.float32)
            cell.step(x, h, c_in, h_out, c_out)
            return (h_out,) if c_state is None else (h_out, c_out)

        step.kernel = cell  # for the execution plan
        return step

    return prepare


def _sequence(op_kind: str) -> Prepare:
    """rnn/lstm/gru_dynamic: every layer and direction, each time loop in compiled code."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        runs = layer_runs(op_kind, node.attrs, c, K.Recurrent, partial(dynamic_linear, engine=node.attrs["engine"]))
        has_cell = op_kind == "lstm"
        # the states given, by port: c0 alone is the initial c with h starting at zeros
        ports = [p for p in ("h0", "c0") if p in node.inputs]

        def step(x, *states):
            given = dict(zip(ports, states))
            return run_sequence(runs, node.attrs, has_cell, x, (given.get("h0"), given.get("c0")), np)

        step.runs = runs  # for the execution plan (K.SequenceStep)
        return step

    return prepare


IMPLEMENTATIONS: dict[str, Prepare] = {
    **{f"{kind}_cell_dynamic": _cell(kind) for kind in ("rnn", "lstm", "gru")},
    **{f"{kind}_dynamic": _sequence(kind) for kind in ("rnn", "lstm", "gru")},
}
