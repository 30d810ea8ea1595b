"""The float32 math ops on the device (in qrt.gpu.IMPLEMENTATIONS).

Bit-identical to the CPU backend (qrt/cpu/float_ops.py): the functions and reductions are
qrt/cuda/float_ops.cu, the CPU's float_ops_body.h order over the CPU's own scalar functions
(qrt/kernels/float_math.h as device code); the shapes, views and checks are the CPU's. NaN results
are NaN where the CPU's are, though not always with the CPU's bits (a GPU's NaN has one fixed pattern).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..cpu.float_ops import _broadcast_shape, batch_norm_terms, check_channels
from ..cpu.types import Prepare, Step
from ..graph import Node
from ..ops import channel_view
from .runtime import blocks, check_size, cupy, kernel
from .tensor_ops import contiguous

ROWS_PER_BLOCK = 16  # the reduction kernels run a row per half-warp, 256 threads a block


def _launch_rows(name: str, rows: int, *args: Any) -> None:
    """A reduction kernel of float_ops.cu over `rows` reduced rows (a half-warp each)."""
    kernel("float_ops.cu", name)((blocks(rows, ROWS_PER_BLOCK),), (256,), args)


def _unary(op: str) -> Prepare:
    """relu, sigmoid, tanh, silu, gelu, sqrt, rsqrt, log, sin, cos: elementwise."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        name = "unary_gelu_tanh" if op == "gelu" and node.attrs["approximate"] == "tanh" else f"unary_{op}"

        def step(x):
            x = contiguous(x, np.float32)
            check_size("x", x.size)
            y = cupy().empty(x.shape, np.float32)
            if x.size:
                kernel("float_ops.cu", name)((blocks(x.size),), (256,), (x, y, np.uint32(x.size)))
            return (y,)

        return step

    return prepare


MAX_RANK = 8  # float_ops.cu's QRT_MAX_RANK, the CPU's QRT_BINARY_MAX_RANK


def _broadcast_view(a: tuple, b: tuple) -> tuple[list[int], list[int], list[int]]:
    """The output's dimensions innermost first and each operand's stride along them (0 where broadcast),
    size-1 dimensions dropped and adjacent ones merged where both operands run on contiguously (the CPU's
    qrt_binary walk)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    shape: list[int] = []
    sa: list[int] = []
    sb: list[int] = []
    step_a = step_b = 1
    for p, q in zip(reversed(a), reversed(b)):
        n, ta, tb = q if p == 1 else p, 0 if p == 1 else step_a, 0 if q == 1 else step_b
        step_a, step_b = step_a * p, step_b * q
        if n == 1:
            continue
        if shape and ta == sa[-1] * shape[-1] and tb == sb[-1] * shape[-1]:
            shape[-1] *= n
        else:
            shape.append(n)
            sa.append(ta)
            sb.append(tb)
    return shape, sa, sb


def _binary(op: str) -> Prepare:
    """add, sub, mul, div: one IEEE operation per element, with numpy broadcasting."""
    name = f"binary_{op}"

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        def step(a, b):
            y = cupy().empty(_broadcast_shape(a.shape, b.shape), np.float32)
            if y.ndim > MAX_RANK:
                raise ValueError("FloatOps.binary: rank mismatch")
            check_size("y", y.size)
            if y.size:
                shape, sa, sb = _broadcast_view(a.shape, b.shape)
                pad = [0] * (MAX_RANK - len(shape))
                dims = [np.uint32(v) for v in (shape + pad + sa + pad + sb + pad)]
                kernel("float_ops.cu", name)(
                    (blocks(y.size),), (256,),
                    (contiguous(a, np.float32), contiguous(b, np.float32), y, np.uint32(y.size), np.int32(len(shape)),
                     *dims),
                )
            return (y,)

        return step

    return prepare


def _softmax(log: bool) -> Prepare:
    name = "log_softmax_f32" if log else "softmax_f32"

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]

        def step(x):
            x = contiguous(x, np.float32)
            check_size("x", x.size)
            outer, n, inner = channel_view(x.shape, dim)
            y = cupy().empty(x.shape, np.float32)
            if x.size:
                _launch_rows(name, outer * inner, x, y, np.uint32(outer), np.uint32(n), np.uint32(inner))
            return (y,)

        return step

    return prepare


def _reduce(mean: bool) -> Prepare:
    """sum, mean over a set of dimensions, summed in the row-major order of the reduced indices (as
    the CPU: adjacent dimensions reduced in place as one, others first moved to the end of a copy)."""
    name = "mean_f32" if mean else "sum_f32"

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        cp = cupy()
        dims, keepdim = sorted(node.attrs["dims"]), node.attrs["keepdim"]
        adjacent = dims == list(range(dims[0], dims[-1] + 1))

        def step(x):
            x = contiguous(x, np.float32)
            check_size("x", x.size)
            if adjacent:
                (outer, n, inner), src = channel_view(x.shape, dims[0], dims[-1] + 1), x
            else:
                kept = [d for d in range(x.ndim) if d not in dims]
                src = cp.ascontiguousarray(x.transpose(kept + dims))
                outer, n, inner = math.prod(x.shape[d] for d in kept), math.prod(x.shape[d] for d in dims), 1
            if keepdim:
                shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
            else:
                shape = tuple(s for d, s in enumerate(x.shape) if d not in dims)
            y = cp.empty(shape, np.float32)
            if outer * inner:
                _launch_rows(name, outer * inner, src, y, np.uint32(outer), np.uint32(n), np.uint32(inner))
            return (y,)

        return step

    return prepare


def _layer_norm(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    k, eps = node.attrs["normalized_dims"], np.float32(node.attrs["eps"])
    w, b = (None if c.get(p) is None else contiguous(np.asarray(c[p], np.float32).reshape(-1))
            for p in ("weight", "bias"))
    stored = next((c[p].shape for p in ("weight", "bias") if c.get(p) is not None), None)
    null = np.uintp(0)  # an absent weight or bias: the kernel skips its step

    def step(x):
        x = contiguous(x, np.float32)
        lead, tail = x.shape[: x.ndim - k], x.shape[x.ndim - k :]
        if stored is not None and tail != stored:
            raise ValueError(
                f"x's last {k} dimension(s) are {list(tail)}, expected {list(stored)} (the weight's shape)"
            )
        check_size("x", x.size)
        rows, n = math.prod(lead), math.prod(tail)
        y = cupy().empty(x.shape, np.float32)
        if x.size:
            _launch_rows("layer_norm_f32", rows, x, null if w is None else w, null if b is None else b, eps, y,
                         np.uint32(rows), np.uint32(n))
        return (y,)

    return step


def _batch_norm(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    alpha, beta = (cupy().asarray(t) for t in batch_norm_terms(node, c))  # the CPU's terms, so the CPU's bits
    channels = alpha.shape[0]

    def step(x):
        x = contiguous(x, np.float32)
        check_channels(x.shape, channels)
        check_size("x", x.size)
        y = cupy().empty(x.shape, np.float32)
        if x.size:
            _, _, inner = channel_view(x.shape, 1)
            kernel("float_ops.cu", "batch_norm_f32")((blocks(x.size),), (256,),
                                                    (x, alpha, beta, y, np.uint32(x.size), np.uint32(channels),
                                                     np.uint32(inner)))
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    **{op: _unary(op) for op in ("relu", "sigmoid", "tanh", "silu", "gelu", "sqrt", "rsqrt", "log", "sin", "cos",
                                        "ceil", "floor")},
    **{op: _binary(op) for op in ("add", "sub", "mul", "div")},
    "softmax": _softmax(False),
    "log_softmax": _softmax(True),
    "sum": _reduce(False),
    "mean": _reduce(True),
    "layer_norm": _layer_norm,
    "batch_norm": _batch_norm,
}
