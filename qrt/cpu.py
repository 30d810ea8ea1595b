"""The CPU backend: one prepared step function per node, over qrt._kernels.

``prepare(node, consts)`` is called once per node at load time. It turns the
node's constant tensors into kernel-ready objects (scalars extracted,
weights laid out and summed) and returns a function of the node's run-time
inputs, in port order, that returns the node's outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Callable

import numpy as np

from . import _kernels as K
from . import cpu_float, cpu_tensor
from .graph import Node
from .ops import QUANT_DTYPES
from .recurrent import layer_runs, recurrent_kind, run_sequence

Step = Callable[..., tuple]

_NAN = "contains NaN, which quantization cannot represent"


def _quantize_per_tensor(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    scale, zp = np.float32(c["scale"]), int(c["zero_point"])
    dtype = QUANT_DTYPES[node.attrs["dtype"]]

    def step(x):
        y = np.empty(x.shape, dtype)
        if K.quantize_per_tensor(x.reshape(-1), scale, zp, y.reshape(-1)):
            raise ValueError(f"x {_NAN}")
        return (y,)

    return step


def _channel_view(shape: tuple, axis: int) -> tuple[int, int, int]:
    """[outer, channels, inner] view of a contiguous array for a per-channel op."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def _quantize_per_channel(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    # torch quantizes with 1.0f / (float)scale: only fl(scale) matters (numpy rounds float64 to nearest even)
    scale = np.ascontiguousarray(c["scale"], np.float32)
    zp = np.ascontiguousarray(c["zero_point"], np.int32)
    dtype, axis = QUANT_DTYPES[node.attrs["dtype"]], node.attrs["axis"]

    def step(x):
        y = np.empty(x.shape, dtype)
        view = _channel_view(x.shape, axis)
        if K.quantize_per_channel(x.reshape(view), scale, zp, y.reshape(view)):
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
        view = _channel_view(x.shape, axis)
        K.dequantize_per_channel(x.reshape(view), scale, zp, y.reshape(view))
        return (y,)

    return step_per_channel


def _rows(layer, out_dtype) -> Step:
    """Apply a [rows, in] -> [rows, out] layer to x of any rank >= 1."""

    n = layer.out_features

    def step(x):
        if x.ndim == 2:  # the common case needs no reshapes
            y = np.empty((x.shape[0], n), out_dtype)
            layer(x, y)
            return (y,)
        y = np.empty(x.shape[:-1] + (n,), out_dtype)
        layer(x.reshape(-1, layer.in_features), y.reshape(-1, n))
        return (y,)

    step.kernel = layer  # the execution plan (qrt/plan.py) calls the layer itself
    return step


def _linear(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    layer = K.StaticLinear(
        c["weight"],
        c["weight_scale"],
        c["weight_zero_point"],
        c.get("bias"),
        np.float32(c["x_scale"]),
        int(c["x_zero_point"]),
        np.float32(c["y_scale"]),
        int(c["y_zero_point"]),
        node.attrs["relu"],
    )
    return _rows(layer, np.uint8)


def dynamic_linear(c: Mapping[str, np.ndarray], reduce_range: bool, prefix: str = "") -> K.DynamicLinear:
    """The kernel object for a dynamic linear weight set (prefix: 'ih_', 'hh_', ...)."""
    return K.DynamicLinear(
        c[f"{prefix}weight"],
        c.get(f"{prefix}weight_scale"),
        c.get(f"{prefix}weight_zero_point"),
        c.get(f"{prefix}bias"),
        reduce_range,
    )


def _linear_dynamic(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    return _rows(dynamic_linear(c, node.attrs["reduce_range"]), np.float32)


def _linear_float(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    """Float32 linear as fma chains in the float16 kernel's order: the same bits on every CPU (not BLAS,
    whose order depends on the CPU), close to but not bit-exact with torch's float GEMM."""
    w = K.PackedFloat(c["weight"], half=False)
    bias = None if c.get("bias") is None else np.ascontiguousarray(c["bias"], np.float32)

    def step(x):
        rows = np.ascontiguousarray(x).reshape(-1, w.k)
        y = np.empty((rows.shape[0], w.n), np.float32)
        w(rows, bias, y)
        return (y.reshape(x.shape[:-1] + (w.n,)),)

    step.kernel, step.bias = w, bias  # for the execution plan
    return step


def _cell(op_kind: str) -> Callable[[Node, Mapping[str, np.ndarray]], Step]:
    """rnn/lstm/gru_cell_dynamic: one step, states in and new states out."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        rr = node.attrs["reduce_range"]
        cell = K.Recurrent(
            recurrent_kind(op_kind, node.attrs), dynamic_linear(c, rr, "ih_"), dynamic_linear(c, rr, "hh_")
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


def _sequence(op_kind: str) -> Callable[[Node, Mapping[str, np.ndarray]], Step]:
    """rnn/lstm/gru_dynamic: every layer and direction, each time loop in compiled code."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        runs = layer_runs(op_kind, node.attrs, c, K.Recurrent, dynamic_linear)
        return lambda x, *states: run_sequence(runs, node.attrs, op_kind == "lstm", x, states, np)

    return prepare


IMPLEMENTATIONS: dict[str, Callable[[Node, Mapping[str, np.ndarray]], Step]] = {
    "quantize_per_tensor": _quantize_per_tensor,
    "quantize_per_channel": _quantize_per_channel,
    "dequantize": _dequantize,
    "linear": _linear,
    "linear_dynamic": _linear_dynamic,
    "linear_float": _linear_float,
    **{f"{kind}_cell_dynamic": _cell(kind) for kind in ("rnn", "lstm", "gru")},
    **{f"{kind}_dynamic": _sequence(kind) for kind in ("rnn", "lstm", "gru")},
    **cpu_float.IMPLEMENTATIONS,  # relu, sigmoid .. layer_norm, add .. div
    **cpu_tensor.IMPLEMENTATIONS,  # select .. unsqueeze, flatten, embedding, embedding_bag
}


def prepare(node: Node, consts: Mapping[str, np.ndarray]) -> Step:
    return IMPLEMENTATIONS[node.op](node, consts)
