"""Whole-sequence recurrent ops (rnn/lstm/gru, _dynamic and _float), shared by the CPU and GPU backends.

A backend brings its array module, the op family's ``linear(consts, prefix)`` (dynamic quantized, or
float32) and its ``Recurrent(kind, ih, hh)``: one direction of one layer, with ``.hidden`` and
``.sequence(x, y, y_offset, reverse, h, c)`` running that direction's time loop (h and c hold the
initial state on entry and the final one on return). Layers, directions, ``batch_first`` and the
states are arranged here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

from .ops import layer_prefix


def recurrent_kind(op_kind: str, attrs: Mapping[str, Any]) -> str:
    """The kernels' cell kind: rnn_tanh, rnn_relu, lstm or gru."""
    return f"rnn_{attrs['nonlinearity']}" if op_kind == "rnn" else op_kind


def check_state_batches(x: Any, states: Mapping[str, Any]) -> None:
    """A cell step's states (by name: h, c) have x's batch: a free dimension, known only per call."""
    for name, state in states.items():
        if state.shape[0] != x.shape[0]:
            raise ValueError(f"x has batch {x.shape[0]} but {name} has batch {state.shape[0]}")


def layer_runs(
    op_kind: str,
    attrs: Mapping[str, Any],
    consts: Mapping[str, Any],
    make_recurrent: Callable[[str, Any, Any], Any],
    linear: Callable[[Mapping[str, Any], str], Any],
) -> list[list[Any]]:
    """One Recurrent per layer and direction, weights prepared once."""
    dirs = 2 if attrs["bidirectional"] else 1
    kind = recurrent_kind(op_kind, attrs)
    return [
        [
            make_recurrent(
                kind,
                linear(consts, layer_prefix(n, d == 1) + "ih_"),
                linear(consts, layer_prefix(n, d == 1) + "hh_"),
            )
            for d in range(dirs)
        ]
        for n in range(attrs["num_layers"])
    ]


def run_sequence(
    runs: list[list[Any]],
    attrs: Mapping[str, Any],
    has_cell: bool,
    x: Any,
    states: Sequence[Any],
    xp: Any,
    check_size: Callable[[str, int], None] | None = None,
) -> tuple:
    """y, h_n (, c_n) for x [T, B, I] (or [B, T, I]) and optional h0 (, c0), as torch returns them."""
    layers, dirs, hidden = len(runs), len(runs[0]), runs[0][0].hidden
    if attrs["batch_first"]:
        x = x.transpose(1, 0, 2)
    x = xp.ascontiguousarray(x)
    seq, batch = x.shape[:2]
    given = iter(states)
    h0 = next(given, None)
    c0 = next(given, None) if has_cell else None
    shape = (layers * dirs, batch, hidden)
    for name, s in (("h0", h0), ("c0", c0)):
        if s is not None and s.shape != shape:
            raise ValueError(f"{name} has shape {list(s.shape)}, expected {list(shape)}")
    # copies: h_n[i], c_n[i] start as the initial state and are updated in place to the final one
    h_n = xp.zeros(shape, xp.float32) if h0 is None else xp.array(h0, xp.float32, order="C")
    c_n = xp.zeros(shape, xp.float32) if c0 is None else xp.array(c0, xp.float32, order="C")
    for n, layer in enumerate(runs):
        if check_size is not None:
            check_size("the layer output", seq * batch * dirs * hidden)
        y = xp.empty((seq, batch, dirs * hidden), xp.float32)
        for d, run in enumerate(layer):
            i = n * dirs + d
            run.sequence(x, y, d * hidden, d == 1, h_n[i], c_n[i] if has_cell else h_n[i])
        x = y
    if attrs["batch_first"]:
        x = xp.ascontiguousarray(x.transpose(1, 0, 2))
    return (x, h_n, c_n) if has_cell else (x, h_n)
