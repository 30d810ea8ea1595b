"""The CPU backend's float32 math ops (in qrt.cpu.IMPLEMENTATIONS).

The functions, reductions and arithmetic run in C (qrt/_float_ops.pxi over qrt/kernels/float_ops_body.h):
one fixed sequence of IEEE operations per op, so the same bits on every CPU and build, whatever the
layout of the input or the number of threads (docs/NUMERICS.md). Not numpy's exp/tanh/log, whose float32
kernels are chosen by CPU; and not numpy's arithmetic either, whose floating-point warnings would cost an
errstate per call to silence. relu is a numpy selection, exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .. import _kernels as K
from .. import tensor_moves
from ..graph import Node
from ..ops import channel_view
from .types import Prepare, Step


def _relu(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    zero = np.float32(0)
    return lambda x: (np.where(x < zero, zero, x),)  # torch.relu: NaN and -0.0 stay (np.maximum makes -0.0 +0.0)


def _unary(op: str) -> Prepare:
    """sigmoid, tanh, silu, gelu, sqrt, rsqrt, log, sin, cos: elementwise."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        kernel = K.FloatOps()
        name = "gelu_tanh" if op == "gelu" and node.attrs["approximate"] == "tanh" else op

        def step(x):
            y = np.empty(x.shape, np.float32)
            kernel.unary(name, tensor_moves.contiguous_of(np, x).reshape(-1), y.reshape(-1))
            return (y,)

        step.kernel, step.unary = kernel, name  # for the execution plan
        return step

    return prepare


def _broadcast_shape(a: tuple, b: tuple) -> tuple:
    """numpy's broadcast of two shapes, or ValueError naming both."""
    if a == b:
        return a
    rank = max(len(a), len(b))
    out = []
    for p, q in zip((1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b):
        if p != q and p != 1 and q != 1:
            raise ValueError(f"a has shape {list(a)} and b has shape {list(b)}, which do not broadcast")
        out.append(q if p == 1 else p)
    return tuple(out)


def _binary(op: str) -> Prepare:
    """add, sub, mul, div: one IEEE operation per element, with numpy broadcasting."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        kernel = K.FloatOps()

        def step(a, b):
            y = np.empty(_broadcast_shape(a.shape, b.shape), np.float32)
            kernel.binary(op, tensor_moves.contiguous_of(np, a), tensor_moves.contiguous_of(np, b), y)
            return (y,)

        step.kernel, step.binary = kernel, op  # for the execution plan
        return step

    return prepare


def _softmax(log: bool) -> Prepare:
    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        kernel, dim = K.FloatOps(), node.attrs["dim"]

        def step(x):
            view = channel_view(x.shape, dim)
            y = np.empty(x.shape, np.float32)
            kernel.softmax(log, tensor_moves.contiguous_of(np, x).reshape(view), y.reshape(view))
            return (y,)

        step.kernel = kernel  # for the execution plan
        return step

    return prepare


def _reduce(mean: bool) -> Prepare:
    """sum, mean over a set of dimensions.

    The reduced elements are summed in the row-major order of their indices along the reduced dimensions
    (in increasing dimension order), whatever the layout: adjacent dimensions are reduced in place as one,
    others are first moved to the end of a copy, which gives the same order.
    """

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        kernel = K.FloatOps()
        dims, keepdim = sorted(node.attrs["dims"]), node.attrs["keepdim"]
        adjacent = dims == list(range(dims[0], dims[-1] + 1))

        def step(x):
            if adjacent:
                view, src = channel_view(x.shape, dims[0], dims[-1] + 1), tensor_moves.contiguous_of(np, x)
            else:
                kept = [d for d in range(x.ndim) if d not in dims]
                src = np.ascontiguousarray(x.transpose(kept + dims))
                view = (math.prod(x.shape[d] for d in kept), math.prod(x.shape[d] for d in dims), 1)
            if keepdim:
                shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
            else:
                shape = tuple(s for d, s in enumerate(x.shape) if d not in dims)
            y = np.empty(shape, np.float32)
            kernel.sum(mean, src.reshape(view), y.reshape(view[0], view[2]))
            return (y,)

        step.kernel, step.sum_dims = kernel, dims  # for the execution plan
        return step

    return prepare


def _layer_norm(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel, k, eps = K.FloatOps(), node.attrs["normalized_dims"], float(node.attrs["eps"])
    w, b = (None if c.get(p) is None else np.ascontiguousarray(c[p], np.float32).reshape(-1)
            for p in ("weight", "bias"))
    stored = next((c[p].shape for p in ("weight", "bias") if c.get(p) is not None), None)

    def step(x):
        lead, tail = x.shape[: x.ndim - k], x.shape[x.ndim - k :]
        if stored is not None and tail != stored:
            raise ValueError(
                f"x's last {k} dimension(s) are {list(tail)}, expected {list(stored)} (the weight's shape)"
            )
        rows, n = math.prod(lead), math.prod(tail)
        y = np.empty(x.shape, np.float32)
        kernel.layer_norm(tensor_moves.contiguous_of(np, x).reshape(rows, n), w, b, eps, y.reshape(rows, n))
        return (y,)

    step.kernel = kernel  # for the execution plan
    return step


def batch_norm_terms(node: Node, c: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """batch_norm's alpha and beta per channel, as torch's CPU kernel collects them (float_ops.h): both backends'."""
    channels = c["mean"].shape[0]
    alpha, beta = np.empty(channels, np.float32), np.empty(channels, np.float32)
    K.batch_norm_terms(*(np.ascontiguousarray(c[p], np.float32) for p in ("mean", "var", "weight", "bias")),
                       float(node.attrs["eps"]), alpha, beta)
    return alpha, beta


def check_channels(shape: tuple, channels: int) -> None:
    if shape[1] != channels:
        raise ValueError(f"x has {shape[1]} channels (dimension 1 of {list(shape)}), expected {channels}")


def _batch_norm(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel, (alpha, beta) = K.FloatOps(), batch_norm_terms(node, c)

    def step(x):
        check_channels(x.shape, alpha.shape[0])
        view = channel_view(x.shape, 1)
        y = np.empty(x.shape, np.float32)
        kernel.batch_norm(tensor_moves.contiguous_of(np, x).reshape(view), alpha, beta, y.reshape(view))
        return (y,)

    step.kernel, step.terms = kernel, (alpha, beta)  # for the execution plan
    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    "relu": _relu,
    **{op: _unary(op) for op in ("sigmoid", "tanh", "silu", "gelu", "sqrt", "rsqrt", "log", "sin", "cos", "ceil",
                                        "floor")},
    **{op: _binary(op) for op in ("add", "sub", "mul", "div")},
    "softmax": _softmax(False),
    "log_softmax": _softmax(True),
    "sum": _reduce(False),
    "mean": _reduce(True),
    "layer_norm": _layer_norm,
    "batch_norm": _batch_norm,
}
