"""The tensor ops that move values and compute none, written once for both backends.

select, slice, cat, stack, reshape, permute, squeeze, unsqueeze and flatten are exact: indexing,
reshapes and copies in the backend's array library (NumPy on the CPU, CuPy on the GPU), with the same
checks and messages on both. Each step returns a C-contiguous array (a view of its input where the
library gives one), as the kernels of the ops after it expect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from .cpu.types import Prepare, Step
from .graph import Node
from .ops import flattened, like_sizes, reshape_target, reshaped


def contiguous_of(xp: Any, a: Any) -> Any:
    """a as an array of the library xp (numpy or CuPy) in C order: itself where it already is
    (xp.ascontiguousarray would make a 0-d array 1-d)."""
    a = xp.asarray(a)
    return a if a.flags.c_contiguous else a.copy()


def implementations(array_library: Callable[[], Any]) -> dict[str, Prepare]:
    """The ops' preparations over the array library that ``array_library()`` returns (imported when
    a step first runs: CuPy only once a GPU model runs)."""

    def contiguous(a: Any) -> Any:
        return contiguous_of(array_library(), a)

    def select(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim, index = node.attrs["dim"], node.attrs["index"]

        def step(x):
            size = x.shape[dim]
            i = index + size if index < 0 else index
            if not 0 <= i < size:
                raise ValueError(f"index {index} is out of range for dimension {dim} of x, shape {list(x.shape)}")
            return (contiguous(x[(slice(None),) * dim + (i, Ellipsis)]),)  # the Ellipsis keeps a 0-d result an array

        return step

    def slice_(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim, start, end, stride = (node.attrs[a] for a in ("dim", "start", "end", "step"))

        def step(x):
            # clamped in Python integers first: an attribute beyond int64 never reaches the library
            lo, hi, st = slice(start, end, stride).indices(x.shape[dim])
            return (contiguous(x[(slice(None),) * dim + (slice(lo, hi, st),)]),)

        return step

    def joined(stack: bool) -> Prepare:
        """cat (sizes along dim may differ) and stack (every shape the same)."""

        def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
            dim = node.attrs["dim"]

            def step(*xs):
                ref = xs[0].shape
                for i, x in enumerate(xs[1:], 1):
                    if any(a != b for k, (a, b) in enumerate(zip(x.shape, ref)) if stack or k != dim):
                        but = "" if stack else f" except at dimension {dim}"
                        raise ValueError(f"x{i} has shape {list(x.shape)} and x0 {list(ref)}: they must agree{but}")
                xp = array_library()
                return ((xp.stack if stack else xp.concatenate)([xp.asarray(x) for x in xs], axis=dim),)

            return step

        return prepare

    def reshape(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        shape, like_dims = node.attrs["shape"], node.attrs["like_dims"]

        def step(x, like=None):
            sizes = like_sizes(like_dims, like.shape) if like_dims else {}
            out = reshaped(x.shape, shape, sizes)
            if out is None:
                target = reshape_target(shape, sizes)
                raise ValueError(f"x has shape {list(x.shape)}, which cannot be reshaped to {target}")
            return (contiguous(x).reshape(out),)

        return step

    def permute(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        perm = tuple(node.attrs["perm"])
        return lambda x: (contiguous(x.transpose(perm)),)

    def squeeze(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dims = node.attrs["dims"]

        def step(x):
            for d in dims:
                if x.shape[d] != 1:  # a free dimension: checked now
                    raise ValueError(f"x has shape {list(x.shape)}: dimension {d} must have size 1 to be squeezed")
            return (contiguous(x).reshape([n for i, n in enumerate(x.shape) if i not in dims]),)

        return step

    def unsqueeze(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]
        return lambda x: (contiguous(x).reshape(x.shape[:dim] + (1,) + x.shape[dim:]),)

    def flatten(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        start, end = node.attrs["start_dim"], node.attrs["end_dim"]
        return lambda x: (contiguous(x).reshape(flattened(x.shape, start, end)),)

    return {
        "select": select,
        "slice": slice_,
        "cat": joined(False),
        "stack": joined(True),
        "reshape": reshape,
        "permute": permute,
        "squeeze": squeeze,
        "unsqueeze": unsqueeze,
        "flatten": flatten,
    }
