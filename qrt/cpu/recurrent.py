"""The recurrent ops on the CPU: one cell step, and whole sequences with their time loops compiled.

Both families run the same K.Recurrent (gates, time loop); they differ in its two linears only: dynamic
quantized (int8 or float16 weights) for ``*_dynamic``, float32 weights in linear_float's product for
``*_float``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from .. import _kernels as K
from ..graph import Node
from ..recurrent import check_state_batches, layer_runs, recurrent_kind, run_sequence
from .linear import dynamic_linear
from .types import Prepare, Step

# (consts, attrs) -> linear(consts, prefix) for the weight set at prefix ('ih_', 'l0_reverse_hh_', ...)
Linears = Callable[[Mapping[str, Any]], Callable[[Mapping[str, np.ndarray], str], K.DynamicLinear]]


def _dynamic(attrs: Mapping[str, Any]) -> Callable[[Mapping[str, np.ndarray], str], K.DynamicLinear]:
    return lambda c, prefix: dynamic_linear(c, attrs["reduce_range"], prefix, attrs["engine"])


def _float(attrs: Mapping[str, Any]) -> Callable[[Mapping[str, np.ndarray], str], K.DynamicLinear]:
    """float32 weights: K.DynamicLinear runs them as PackedFloat chains, linear_float's product."""
    return lambda c, prefix: K.DynamicLinear(c[f"{prefix}weight"], bias=c.get(f"{prefix}bias"))


def _cell(op_kind: str, linears: Linears) -> Prepare:
    """rnn/lstm/gru_cell_*: one step, states in and new states out."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        linear = linears(node.attrs)
        cell = K.Recurrent(recurrent_kind(op_kind, node.attrs), linear(c, "ih_"), linear(c, "hh_"))

        def step(x, h, c_state=None):
            check_state_batches(x, {"h": h} if c_state is None else {"h": h, "c": c_state})
            c_in = h if c_state is None else c_state
            h_out = np.empty(h.shape, np.float32)
            c_out = h_out if c_state is None else np.empty(h.shape, np.float32)
            cell.step(x, h, c_in, h_out, c_out)
            return (h_out,) if c_state is None else (h_out, c_out)

        step.kernel = cell  # for the execution plan
        return step

    return prepare


def _sequence(op_kind: str, linears: Linears) -> Prepare:
    """rnn/lstm/gru_*: every layer and direction, each time loop in compiled code."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        runs = layer_runs(op_kind, node.attrs, c, K.Recurrent, linears(node.attrs))
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
    op: make(kind, linears)
    for family, linears in (("dynamic", _dynamic), ("float", _float))
    for kind in ("rnn", "lstm", "gru")
    for op, make in ((f"{kind}_cell_{family}", _cell), (f"{kind}_{family}", _sequence))
}
