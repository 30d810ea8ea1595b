"""The CPU backend: one prepared step function per node, over qrt._kernels.

``prepare(node, consts)`` is called once per node at load time. It turns the
node's constant tensors into kernel-ready objects (scalars extracted,
weights laid out and summed) and returns a function of the node's run-time
inputs, in port order, that returns the node's outputs.

One module per op family: quantize.py, linear.py, recurrent.py, tensor_ops.py (indexing, shapes,
embeddings), float_ops.py (the float math), attention.py (matmul, attention); each lists its ops in
IMPLEMENTATIONS. ``build_plan`` (qrt/plan.py) turns the prepared steps into the model's execution plan.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..graph import Node
from ..plan import build_plan
from . import attention, float_ops, linear, quantize, recurrent, tensor_ops
from .types import Prepare, Step

__all__ = ["IMPLEMENTATIONS", "build_plan", "prepare"]

IMPLEMENTATIONS: dict[str, Prepare] = {
    **quantize.IMPLEMENTATIONS,
    **linear.IMPLEMENTATIONS,
    **recurrent.IMPLEMENTATIONS,
    **tensor_ops.IMPLEMENTATIONS,
    **float_ops.IMPLEMENTATIONS,
    **attention.IMPLEMENTATIONS,
}


def prepare(node: Node, consts: Mapping[str, np.ndarray]) -> Step:
    return IMPLEMENTATIONS[node.op](node, consts)
