"""The linear ops on the CPU: static (quint8 in and out), dynamic (int8 or float16 weights), float."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import _kernels as K
from ..graph import Node
from .types import Prepare, Step


def _rows(layer, out_dtype) -> Step:
    """Apply a [rows, in] -> [rows, out] layer to x of any rank >= 1."""

    n, k = layer.out_features, layer.in_features

    def step(x):
        if x.shape[-1] != k:  # before the output is allocated: its size follows x's other dimensions
            raise ValueError(f"x has {x.shape[-1]} features, expected {k}")
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
        node.attrs["engine"] == "qnnpack",
    )
    return _rows(layer, np.uint8)


def dynamic_linear(
    c: Mapping[str, np.ndarray], reduce_range: bool, prefix: str = "", engine: str = "x86",
    activation: str = "per_tensor",
) -> K.DynamicLinear:
    """The kernel object for a dynamic linear weight set (prefix: 'ih_', 'hh_', ...) with engine's numerics
    and activation's quantization rule."""
    return K.DynamicLinear(
        c[f"{prefix}weight"],
        c.get(f"{prefix}weight_scale"),
        c.get(f"{prefix}weight_zero_point"),
        c.get(f"{prefix}bias"),
        reduce_range,
        engine == "qnnpack",
        activation == "per_row_symmetric",
    )


def _linear_dynamic(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    a = node.attrs
    return _rows(dynamic_linear(c, a["reduce_range"], engine=a["engine"], activation=a["activation"]), np.float32)


def _linear_float(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    """Float32 linear as fma chains in the float16 kernel's order: the same bits on every CPU (not BLAS,
    whose order depends on the CPU), close to but not bit-exact with torch's float GEMM."""
    w = K.PackedFloat(c["weight"], half=False)
    bias = None if c.get("bias") is None else np.ascontiguousarray(c["bias"], np.float32)

    def step(x):
        if x.shape[-1] != w.k:
            raise ValueError(f"x has {x.shape[-1]} features, expected {w.k}")
        rows = np.ascontiguousarray(x).reshape(-1, w.k)
        y = np.empty((rows.shape[0], w.n), np.float32)
        w(rows, bias, y)
        return (y.reshape(x.shape[:-1] + (w.n,)),)

    step.kernel, step.bias = w, bias  # for the execution plan
    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    "linear": _linear,
    "linear_dynamic": _linear_dynamic,
    "linear_float": _linear_float,
}
