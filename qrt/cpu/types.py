"""What every CPU op module returns: a prepared step over the node's run-time inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import numpy as np

from ..graph import Node

Step = Callable[..., tuple]  # run-time inputs in port order -> the node's outputs
Prepare = Callable[[Node, Mapping[str, np.ndarray]], Step]  # called once per node at load
