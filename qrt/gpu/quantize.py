"""Quantize and dequantize on the device, and the dynamic quantization of activations.

Bit-identical to the CPU backend (qrt/cuda/quantize.cu, dynamic_quant.cu): every float step names its
rounding. The dynamic quantization stays on the device (its parameters in device memory, no host
synchronisation), so a NaN input cannot raise ValueError as on the CPU: the products it feeds become
NaN, and quantize stores the type's minimum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Node
from ..ops import QUANT_DTYPES
from .runtime import blocks, check_size, cupy, dev, kernel

SMALL_QUANT = 1 << 16  # inputs up to this many values are quantized by one block


MAX_PARTS = 1024  # dq_partial blocks at most


def dq_workspace(m: int, kp: int) -> tuple[Any, Any, Any]:
    """Buffers for quantize_dynamic of m rows (q, params, partials), for a time loop to reuse."""
    cp = cupy()
    check_size("the quantized input", m * kp)
    return cp.empty((m, kp), cp.uint8), cp.empty(4, cp.int32), cp.empty(3 * MAX_PARTS, cp.float32)


def quantize_dynamic(x: Any, kp: int, qmax: int, ws: tuple | None = None) -> tuple[Any, Any]:
    """quint8 q_x[m, kp] (zero-padded) and device QParams for float x[m, k].

    ws: buffers from dq_workspace(m, kp), reused instead of allocated (the
    kernels are stream-ordered, so reuse across steps is safe).
    """
    cp = cupy()
    m, k = x.shape
    if ws is None:
        check_size("the quantized input", m * kp)
        q, params, part = cp.empty((m, kp), cp.uint8), cp.empty(4, cp.int32), None
    else:
        q, params, part = ws
        assert q.shape == (m, kp), "workspace for another shape"
    n = m * k
    i32 = np.int32
    if n == 0:  # as the CPU: scale 0, zero point 0, and all-zero q_x
        q.fill(0)
        params.fill(0)
    elif n <= SMALL_QUANT:
        args = (x, i32(m), i32(k), i32(kp), params, q)
        kernel("dynamic_quant.cu", "dq_small")((1,), (1024,), args + args + (i32(qmax),))
    else:
        parts = min(MAX_PARTS, -(-n // 2048))
        if part is None:
            part = cp.empty(3 * parts, cp.float32)
        kernel("dynamic_quant.cu", "dq_partial")((parts,), (256,), (x, np.uint32(n), part))
        kernel("dynamic_quant.cu", "dq_finish")(
            (blocks(m * kp, 1024, 2048),), (256,), (x, i32(m), i32(k), i32(kp), part, i32(parts), i32(qmax), params, q)
        )
    return q, params


def quantize_dynamic_pair(x: Any, kx: int, h: Any, kh: int, qmax: int) -> tuple[Any, Any, Any, Any]:
    """quantize_dynamic of two small tensors (an RNN step's x and h) in one launch."""
    cp = cupy()
    if not (0 < x.size <= SMALL_QUANT and 0 < h.size <= SMALL_QUANT):
        return (*quantize_dynamic(x, kx, qmax), *quantize_dynamic(h, kh, qmax))
    i32 = np.int32
    qx, px = cp.empty((x.shape[0], kx), cp.uint8), cp.empty(4, cp.int32)
    qh, ph = cp.empty((h.shape[0], kh), cp.uint8), cp.empty(4, cp.int32)
    kernel("dynamic_quant.cu", "dq_small")(
        (2,),
        (1024,),
        (x, i32(x.shape[0]), i32(x.shape[1]), i32(kx), px, qx, h, i32(h.shape[0]), i32(h.shape[1]), i32(kh), ph, qh,
         i32(qmax)),
    )
    return qx, px, qh, ph


def row_sums(q: Any, sums: Any = None) -> Any:
    cp = cupy()
    m, kp = q.shape
    sums = cp.empty(m, cp.int32) if sums is None else sums
    kernel("dynamic_quant.cu", "row_sums_u8")((blocks(m, 1, 4096),), (256,), (q, np.int32(m), np.int32(kp), sums))
    return sums


def _quantize_per_tensor(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    scale, zp = np.float32(c["scale"]), np.int32(c["zero_point"])
    dtype = QUANT_DTYPES[node.attrs["dtype"]]

    def step(x):
        cp = cupy()
        x = dev(x, np.float32)
        check_size("x", x.size)
        y = cp.empty(x.shape, dtype)
        if x.size:
            fn = kernel("quantize.cu", f"quantize_per_tensor_{dtype}")
            fn((blocks(x.size),), (256,), (x, np.uint32(x.size), scale, zp, y))
        return (y,)

    return step


def _channel_args(shape: tuple, axis: int) -> tuple:
    return np.uint32(shape[axis]), np.uint32(math.prod(shape[axis + 1 :]))


def _per_channel_params(c: Mapping[str, np.ndarray], scale_dtype: Any) -> tuple[Any, Any]:
    scale = np.ascontiguousarray(c["scale"], scale_dtype)
    return dev(scale), dev(np.ascontiguousarray(c["zero_point"], np.int32))


def _quantize_per_channel(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    # torch quantizes with 1.0f / (float)scale: only fl(scale) matters (numpy rounds float64 to nearest even)
    scale, zp = _per_channel_params(c, np.float32)
    dtype, axis = QUANT_DTYPES[node.attrs["dtype"]], node.attrs["axis"]

    def step(x):
        cp = cupy()
        x = dev(x, np.float32)
        check_size("x", x.size)
        y = cp.empty(x.shape, dtype)
        if x.size:
            channels, inner = _channel_args(x.shape, axis)
            fn = kernel("quantize.cu", f"quantize_per_channel_{dtype}")
            fn((blocks(x.size),), (256,), (x, np.uint32(x.size), channels, inner, scale, zp, y))
        return (y,)

    return step


def _dequantize(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    axis = node.attrs["axis"]
    if axis is None:
        scale, zp = np.float32(c["scale"]), np.int32(c["zero_point"])
    else:  # torch multiplies by the per-channel scale in double; float32 scales widen exactly
        scale, zp = _per_channel_params(c, np.float64)

    def step(x):
        cp = cupy()
        x = dev(x)
        check_size("x", x.size)
        y = cp.empty(x.shape, cp.float32)
        if x.size:
            n = np.uint32(x.size)
            if axis is None:
                fn = kernel("quantize.cu", f"dequantize_per_tensor_{x.dtype}")
                fn((blocks(x.size),), (256,), (x, n, scale, zp, y))
            else:
                channels, inner = _channel_args(x.shape, axis)
                fn = kernel("quantize.cu", f"dequantize_per_channel_{x.dtype}")
                fn((blocks(x.size),), (256,), (x, n, channels, inner, scale, zp, y))
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    "quantize_per_tensor": _quantize_per_tensor,
    "quantize_per_channel": _quantize_per_channel,
    "dequantize": _dequantize,
}
