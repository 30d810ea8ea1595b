"""Neutral descriptions of quantized layers: what a front end hands the lowering.

A front end (tools/qrt_backend.py for torch.ao's FX flow) turns each quantized
module it knows into one of these (numpy integers, scales, biases), so the
lowering (tools/lower.py, tools/lower_ops.py) never touches ``torch.ao`` and
another front end (pt2e) can reuse it. ``pattern`` keys the lowering table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class QWeight:
    """A weight as the runtime stores it: int8 + scale/zero point (per tensor or per row), or float16."""

    values: np.ndarray  # int8 or float16, [out, in]
    scale: np.ndarray | None = None  # float32, shape () or (out,)
    zero_point: np.ndarray | None = None  # int32, same shape as scale

    def ports(self, prefix: str = "") -> dict[str, np.ndarray]:
        out = {f"{prefix}weight": self.values}
        if self.scale is not None:
            out[f"{prefix}weight_scale"] = self.scale
            out[f"{prefix}weight_zero_point"] = self.zero_point
        return out


@dataclass(frozen=True)
class LinearLayer:
    """Linear (+ ReLU). mode: None for a reference module (the graph around it decides
    static or dynamic), "dynamic" or "static" for PyTorch's native quantized modules."""

    pattern: str
    weight: QWeight
    bias: np.ndarray | None
    relu: bool
    mode: str | None = None
    output_qparams: tuple[np.float32, int] | None = None  # native static modules only


@dataclass(frozen=True)
class RNNCellLayer:
    """One recurrent weight set: the input and hidden dynamic linears of a cell (or of one layer
    direction of a sequence). pattern: "rnn_cell", "lstm_cell" or "gru_cell" (for a sequence's
    weight sets, the cell kind it is made of); nonlinearity matters for rnn only."""

    pattern: str
    ih_weight: QWeight
    ih_bias: np.ndarray | None
    hh_weight: QWeight
    hh_bias: np.ndarray | None
    nonlinearity: str = "tanh"

    def ports(self, prefix: str = "") -> dict[str, np.ndarray | None]:
        return {
            **self.ih_weight.ports(f"{prefix}ih_"),
            f"{prefix}ih_bias": self.ih_bias,
            **self.hh_weight.ports(f"{prefix}hh_"),
            f"{prefix}hh_bias": self.hh_bias,
        }


@dataclass(frozen=True)
class SequenceLayer:
    """nn.RNN / nn.LSTM / nn.GRU (pattern "rnn", "lstm", "gru"), dynamic.

    ``directions`` holds one weight set per layer and direction, in torch's order
    (l0, l0_reverse, l1, ...).
    """

    pattern: str
    directions: tuple[RNNCellLayer, ...]
    num_layers: int
    bidirectional: bool
    batch_first: bool
    nonlinearity: str = "tanh"


@dataclass(frozen=True)
class EmbeddingLayer:
    """An embedding table (pattern "embedding") or bag (pattern "embedding_bag").

    bits 32: ``weight`` float32 [num, dim], no scale or bias. bits 8: uint8 [num, dim] with float32
    ``scale`` / ``bias`` [num]; bits 4: uint8 [num, ceil(dim / 2)] (two values a byte, low nibble
    first) with float16 scale / bias: each exactly as torch's prepacked rows hold them (row value =
    scale * q + bias). ``mode``: a bag's reduction ("sum", "mean", "max").
    """

    pattern: str
    bits: int
    weight: np.ndarray
    dim: int
    scale: np.ndarray | None = None
    bias: np.ndarray | None = None
    mode: str = "mean"
    include_last_offset: bool = False

    def ports(self) -> dict[str, np.ndarray | None]:
        return {"weight": self.weight, "weight_scale": self.scale, "weight_bias": self.bias}


@dataclass(frozen=True)
class StubLayer:
    """Eager mode's QuantStub / DeQuantStub after torch.ao's convert: pattern "quantize" (float -> quantized
    at the stub's observed ``scale`` / ``zero_point``, as torch.quantize_per_tensor) or "dequantize" (at the
    input's own qparams: no fields)."""

    pattern: str
    scale: float | None = None
    zero_point: int | None = None
    dtype: torch.dtype | None = None


Layer = LinearLayer | RNNCellLayer | SequenceLayer | EmbeddingLayer | StubLayer
Describe = Callable[[nn.Module], "Layer | None"]
