"""The tensor ops on the device (in qrt.gpu.IMPLEMENTATIONS)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Node
from ..ops import flattened
from .runtime import dev


def _flatten(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    start, end = node.attrs["start_dim"], node.attrs["end_dim"]
    return lambda x: (dev(x).reshape(flattened(x.shape, start, end)),)



IMPLEMENTATIONS: dict[str, Prepare] = {"flatten": _flatten}
