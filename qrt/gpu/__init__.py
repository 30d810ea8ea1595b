"""The CUDA backend: the CPU backend's ops as CuPy raw kernels (qrt/cuda/*.cu), in the CPU backend's shape.

``prepare(node, consts)`` runs once per node at load time and uploads the node's weights; the step it
returns takes the node's run-time inputs (device arrays) and returns device arrays, launching kernels
only (no host synchronisation), so that a whole model can be captured into one CUDA graph
(qrt/gpu/plan.py). One module per op family, as qrt.cpu: quantize.py, linear.py, recurrent.py,
tensor_ops.py, float_ops.py, attention.py; runtime.py compiles the sources and holds what they share.

Every result is bit-identical to the CPU backend: every float step in the kernels names its
rounding, the sources are compiled with --fmad=false and without flush-to-zero, and the float
functions are the CPU's own C (qrt/kernels/gate_math.h, float_math.h) compiled as device code.

CuPy is imported only when a CUDA model is loaded; ``import qrt`` never does.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Graph, Node
from . import attention, float_ops, linear, quantize, recurrent, tensor_ops
from .plan import build_plan
from .runtime import (
    NVRTC_OPTIONS,
    SOURCE_DIR,
    CUDAUnavailableError,
    array_module,
    kernel_source,
    require_cuda,
)

__all__ = [
    "IMPLEMENTATIONS",
    "NVRTC_OPTIONS",
    "SOURCE_DIR",
    "CUDAUnavailableError",
    "array_module",
    "build_plan",
    "kernel_source",
    "prepare",
    "refuse_unsupported",
    "require_cuda",
]

IMPLEMENTATIONS: dict[str, Prepare] = {
    **quantize.IMPLEMENTATIONS,
    **linear.IMPLEMENTATIONS,
    **recurrent.IMPLEMENTATIONS,
    **tensor_ops.IMPLEMENTATIONS,
    **float_ops.IMPLEMENTATIONS,
    **attention.IMPLEMENTATIONS,
}


def refuse_unsupported(graph: Graph) -> None:
    """Refuse, before anything is uploaded, what the CUDA kernels do not implement: torch's qnnpack
    numerics (attribute engine, docs/NUMERICS.md) exist on the CPU only."""
    nodes = [n.name for n in graph.nodes if n.attrs.get("engine", "x86") != "x86"]
    if nodes:
        raise NotImplementedError(
            f"engine 'qnnpack' is implemented on the CPU only; nodes {nodes} use it: load this model with device='cpu'"
        )


def prepare(node: Node, consts: Mapping[str, np.ndarray]) -> Step:
    """Upload a node's constants once; return its step over run-time inputs."""
    return IMPLEMENTATIONS[node.op](node, consts)
