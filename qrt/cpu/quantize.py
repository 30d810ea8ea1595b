"""quantize_per_tensor, quantize_per_channel and dequantize on the CPU."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import _kernels as K
from ..graph import Node
from ..ops import QUANT_DTYPES, channel_view, rounds_first
from .types import Prepare, Step

_NAN = "contains NaN, which quantization cannot represent"


def _quantize_per_tensor(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    scale, zp = np.float32(c["scale"]), int(c["zero_point"])
    dtype, round_first = QUANT_DTYPES[node.attrs["dtype"]], rounds_first(node.attrs)

    def step(x):
        y = np.empty(x.shape, dtype)
        if K.quantize_per_tensor(x.reshape(-1), scale, zp, y.reshape(-1), round_first):
            raise ValueError(f"x {_NAN}")
        return (y,)

    return step


def _quantize_per_channel(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    # torch quantizes with 1.0f / (float)scale: only fl(scale) matters (numpy rounds float64 to nearest even)
    scale = np.ascontiguousarray(c["scale"], np.float32)
    zp = np.ascontiguousarray(c["zero_point"], np.int32)
    dtype, axis, round_first = QUANT_DTYPES[node.attrs["dtype"]], node.attrs["axis"], rounds_first(node.attrs)

    def step(x):
        y = np.empty(x.shape, dtype)
        view = channel_view(x.shape, axis)
        if K.quantize_per_channel(x.reshape(view), scale, zp, y.reshape(view), round_first):
            raise ValueError(f"x {_NAN}")
        return (y,)

    return step


def _dequantize(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    axis = node.attrs["axis"]
    if axis is None:
        scale, zp = np.float32(c["scale"]), int(c["zero_point"])

        def step(x):
            y = np.empty(x.shape, np.float32)
            K.dequantize_per_tensor(x.reshape(-1), scale, zp, y.reshape(-1))
            return (y,)

        return step
    # torch multiplies by the per-channel scale in double; float32 scales widen exactly
    scale = np.ascontiguousarray(c["scale"], np.float64)
    zp = np.ascontiguousarray(c["zero_point"], np.int32)

    def step_per_channel(x):
        y = np.empty(x.shape, np.float32)
        view = channel_view(x.shape, axis)
        K.dequantize_per_channel(x.reshape(view), scale, zp, y.reshape(view))
        return (y,)

    return step_per_channel


IMPLEMENTATIONS: dict[str, Prepare] = {
    "quantize_per_tensor": _quantize_per_tensor,
    "quantize_per_channel": _quantize_per_channel,
    "dequantize": _dequantize,
}
