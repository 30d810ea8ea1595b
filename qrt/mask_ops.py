"""Comparisons, logic, where, cast, clamp, integer arithmetic and the shape-following ops, written once for
both backends.

Each is exact in the backend's array library (NumPy on the CPU, CuPy on the GPU): a comparison, a
logical op, a selection (where, index_select, gather, expand, arange) or min / max (clamp) rounds
nothing, a cast rounds at most once as C's conversions define it (int64 -> float32 to nearest, ties
to even; float32 -> integer toward zero), and integer arithmetic and running sums wrap modulo 2**bits
(two's complement), the same on both. docs/NUMERICS.md says how each relates to torch. Each step returns a
C-contiguous array, as the kernels of the ops after it expect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from . import tensor_moves
from .cpu.types import Prepare, Step
from .graph import Node
from .ops import COMPARISONS, INTEGER_ARITHMETIC, integer_arithmetic_dtype, like_sizes

_UFUNCS = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
           "ge": "greater_equal", "logical_and": "logical_and", "logical_or": "logical_or",
           "add_int": "add", "sub_int": "subtract", "mul_int": "multiply"}


def _broadcast(shapes: list[tuple], names: list[str]) -> tuple:
    """numpy's broadcast of the shapes, or ValueError naming the operands."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            shown = " and ".join(f"{n} has shape {list(s)}" for n, s in zip(names, shapes))
            raise ValueError(f"{shown}, which do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def out_of_range(what: str, size: int, low: int, high: int) -> str | None:
    """The message for indices spanning [low, high] where [0, size) is allowed, or None if they fit."""
    if 0 <= low and high < size:
        return None
    return f"{what} must lie in [0, {size}), got values in [{low}, {high}]"


def host_check(index: np.ndarray, size: int, what: str) -> None:
    """Indices in [0, size), checked on the CPU before they are read."""
    if index.size:
        message = out_of_range(what, size, int(index.min()), int(index.max()))
        if message is not None:
            raise ValueError(message)


def implementations(
    array_library: Callable[[], Any],
    check_indices: Callable[[Any, int, str], None] = host_check,
    gather_along: Callable[[Any, Any, int], Any] | None = None,
) -> dict[str, Prepare]:
    """The ops' preparations over the array library that ``array_library()`` returns; ``check_indices(index,
    size, what)`` raises (or has the run raise) the ValueError for indices outside [0, size).
    ``gather_along(x, index, dim)``: take_along_axis with the indices checked as check_indices does, where a
    backend has its own (the CPU's in C); else the array library's after check_indices."""

    def contiguous(a: Any) -> Any:
        return tensor_moves.contiguous_of(array_library(), a)

    def binary(op: str) -> Prepare:
        """A comparison or logical and / or (bool), or integer arithmetic, with numpy broadcasting."""

        def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
            arithmetic = op.endswith("_int")

            def step(a, b):
                xp = array_library()
                _broadcast([a.shape, b.shape], ["a", "b"])
                # integers of two widths compare exactly: numpy and CuPy widen int32 to int64. Arithmetic runs in
                # its output dtype, named (numpy 1.x would keep int32 against an int64 [] array), and wraps
                # modulo 2**bits
                dtype = {"dtype": integer_arithmetic_dtype(a.dtype.name, b.dtype.name)} if arithmetic else {}
                return (contiguous(getattr(xp, _UFUNCS[op])(xp.asarray(a), xp.asarray(b), **dtype)),)

            return step

        return prepare

    def logical_not(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        return lambda x: (contiguous(array_library().logical_not(x)),)

    def where(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        def step(condition, a, b):
            xp = array_library()
            _broadcast([condition.shape, a.shape, b.shape], ["condition", "a", "b"])
            return (contiguous(xp.where(xp.asarray(condition), xp.asarray(a), xp.asarray(b))),)

        return step

    def cast(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dtype = np.dtype(node.attrs["dtype"])

        def step(x):
            xp = array_library()
            x = xp.asarray(x)
            if dtype == np.bool_:
                return (contiguous(x != 0),)  # NaN != 0: True, as torch
            with np.errstate(invalid="ignore"):  # NaN or out of range: undefined, as in torch; no warning
                return (contiguous(x.astype(dtype)),)

        return step

    def clamp(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        lo, hi = (None if node.attrs[k] is None else np.float32(node.attrs[k]) for k in ("min", "max"))

        def step(x):
            xp = array_library()
            y = xp.asarray(x, np.float32)
            # maximum / minimum keep a NaN x, as torch.clamp does
            if lo is not None:
                y = xp.maximum(y, lo)
            if hi is not None:
                y = xp.minimum(y, hi)
            return (contiguous(y),)

        return step

    def amax(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dims, keepdim = sorted(node.attrs["dims"]), node.attrs["keepdim"]

        def step(x):
            xp = array_library()
            x = xp.asarray(x)
            rest = [d for d in range(x.ndim) if d not in dims]
            if any(x.shape[d] == 0 for d in dims):
                raise ValueError(f"amax over an empty dimension: x has shape {list(x.shape)}, dims {dims}")
            # the listed dimensions last, flattened: argmax picks the first NaN, else the first maximum (so the
            # sign of a zero maximum is its first zero's, whatever the library's vector lanes)
            kept = tuple(x.shape[d] for d in rest)  # may be empty (a batch of 0): y is then empty too
            lines = xp.transpose(x, rest + dims).reshape(kept + (math.prod(x.shape[d] for d in dims),))
            y = xp.take_along_axis(lines, xp.argmax(lines, axis=-1)[..., None], axis=-1)[..., 0]
            if keepdim:
                y = y.reshape(tuple(1 if d in dims else n for d, n in enumerate(x.shape)))
            return (contiguous(y),)

        return step

    def arange(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]
        return lambda x: (array_library().arange(x.shape[dim], dtype=np.int64),)

    def cumsum(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]
        # one int64 running sum per line, in index order: exact modulo 2**64, the order immaterial
        return lambda x: (contiguous(array_library().cumsum(x, axis=dim, dtype=np.int64)),)

    def expand(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        shape, like_dims = node.attrs["shape"], node.attrs["like_dims"]

        def step(x, like=None):
            lead = len(shape) - x.ndim
            sizes = like_sizes(like_dims, like.shape) if like_dims else {}
            target = [sizes[i] if i in sizes else x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape)]
            for i in range(x.ndim):
                if x.shape[i] not in (1, target[lead + i]):
                    raise ValueError(f"x has shape {list(x.shape)}, which cannot be expanded to {target}")
            xp = array_library()
            return (xp.ascontiguousarray(xp.broadcast_to(xp.asarray(x), tuple(target))),)

        return step

    def index_select(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]

        def step(x, index):
            xp = array_library()
            index = xp.asarray(index)
            check_indices(index, x.shape[dim], "index")
            return (contiguous(xp.take(xp.asarray(x), index.astype(np.int64), axis=dim)),)

        return step

    def gather(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        dim = node.attrs["dim"]

        def step(x, index):
            xp = array_library()
            index = xp.asarray(index)
            for d, (i, n) in enumerate(zip(index.shape, x.shape)):
                if d != dim and i > n:
                    raise ValueError(f"index has shape {list(index.shape)}, larger than x's {list(x.shape)} "
                                     f"at dimension {d}")
            part = xp.asarray(x)[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(index.shape))]
            if gather_along is not None:
                return (gather_along(part, index, dim),)
            check_indices(index, x.shape[dim], "index")
            return (contiguous(xp.take_along_axis(part, index.astype(np.int64), axis=dim)),)

        return step

    return {
        **{op: binary(op) for op in (*COMPARISONS, "logical_and", "logical_or")},
        **{f"{op}_int": binary(f"{op}_int") for op in INTEGER_ARITHMETIC},
        "cumsum": cumsum,
        "logical_not": logical_not,
        "where": where,
        "cast": cast,
        "clamp": clamp,
        "amax": amax,
        "arange": arange,
        "expand": expand,
        "index_select": index_select,
        "gather": gather,
    }
