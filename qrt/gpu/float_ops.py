"""The float32 math ops on the device (in qrt.gpu.IMPLEMENTATIONS)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Node
from .runtime import cupy, dev

_lock = threading.Lock()
_elementwise: dict[str, Any] = {}


def _relu(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    def step(x):
        with _lock:
            fn = _elementwise.get("relu")
            if fn is None:
                # np.maximum(x, 0) as numpy computes it: NaN kept, -0.0 -> +0.0
                fn = _elementwise["relu"] = cupy().ElementwiseKernel(
                    "float32 x", "float32 y", "y = (x > 0.0f || x != x) ? x : 0.0f", "qrt_relu"
                )
        return (fn(dev(x, np.float32)),)

    return step


def _add(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    def step(a, b):
        if a.shape != b.shape:  # no broadcasting: free dimensions must agree
            raise ValueError(f"operands have shapes {a.shape} and {b.shape}")
        return (dev(a, np.float32) + dev(b, np.float32),)  # one IEEE add: nothing to fuse

    return step



IMPLEMENTATIONS: dict[str, Prepare] = {"relu": _relu, "add": _add}
