"""Recurrent modules kept in float32 -> qrt's float recurrent ops (``rnn/lstm/gru_float``, ``*_cell_float``).

A float ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` (or cell) reaches the lowering where nothing quantized it: torchao's
``quantize_`` quantizes Linear layers only, a rules file can keep a module in float (scheme ``"float"``), and a
prequantized model or program may hold one float. Its weights are stored as they are; qrt computes the layer
in float32 with linear_float's product (docs/NUMERICS.md), within a stated bound of torch's float modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from qrt.ops import layer_prefix

from .lower_ops import check_layers, emit_cell, emit_sequence
from .lower_values import LoweringError, Tensor, lowers

if TYPE_CHECKING:
    from .lower import Lowerer

_KINDS = {nn.RNN: "rnn", nn.LSTM: "lstm", nn.GRU: "gru", nn.RNNCell: "rnn", nn.LSTMCell: "lstm", nn.GRUCell: "gru"}


def _kind(module: nn.Module) -> str:
    return next(kind for cls, kind in _KINDS.items() if isinstance(module, cls))


def _array(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().numpy().copy()


def _weights(module: nn.Module, suffix: str, prefix: str) -> dict[str, np.ndarray | None]:
    """The float32 weights of one cell or layer direction (suffix "_l0", "_l0_reverse", or "" for a cell)."""
    return {
        f"{prefix}{side}_{what}": _array(getattr(module, f"{what}_{side}{suffix}", None))
        for side in ("ih", "hh")
        for what in ("weight", "bias")
    }


def _attrs(module: nn.Module, kind: str) -> dict[str, Any]:
    return {"nonlinearity": module.nonlinearity} if kind == "rnn" else {}


@lowers(modules=(nn.RNN, nn.LSTM, nn.GRU))
def _float_sequence(lw: Lowerer, node: torch.fx.Node, module: nn.RNNBase, input: Any, hx: Any = None) -> Any:
    """nn.RNN / LSTM / GRU in float -> rnn/lstm/gru_float; returns (y, h_n) or (y, (h_n, c_n)) as torch does."""
    kind = _kind(module)
    if getattr(module, "proj_size", 0):
        raise LoweringError("an LSTM with proj_size (projected hidden states) is not supported")
    check_layers(module.num_layers)
    weights: dict[str, Any] = {}
    for n in range(module.num_layers):
        for reverse in (False, True)[: 2 if module.bidirectional else 1]:
            weights.update(_weights(module, f"_l{n}{'_reverse' if reverse else ''}", layer_prefix(n, reverse)))
    attrs = {
        **_attrs(module, kind),
        "num_layers": module.num_layers,
        "bidirectional": module.bidirectional,
        "batch_first": module.batch_first,
    }
    y, final = emit_sequence(lw, node, f"{kind}_float", kind, input, hx, weights, attrs)
    lw.layers[str(node.target)] = y.name  # for `qrt compare`, layer by layer
    return (y, final)


@lowers(modules=(nn.RNNCell, nn.LSTMCell, nn.GRUCell))
def _float_cell(lw: Lowerer, node: torch.fx.Node, module: nn.RNNCellBase, input: Any, hx: Any = None) -> Any:
    """RNNCell / LSTMCell / GRUCell in float -> *_cell_float, the state given as an input."""
    kind = _kind(module)
    out = emit_cell(lw, node, f"{kind}_cell_float", kind, input, hx, _weights(module, "", ""), _attrs(module, kind))
    if kind == "lstm":
        lw.layers[str(node.target)] = out[0]
        return tuple(Tensor(o) for o in out)
    lw.layers[str(node.target)] = out
    return Tensor(out)
