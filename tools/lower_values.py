"""The converter's vocabulary: the values a walk over a model's graph holds, and the lowering table.

A node's value during the walk is a ``Tensor`` (a run-time value of the qrt graph), a quantized one (``Quant``,
``Deq``, ``DynQ``, ``DynDeq``, ``PendingLinear``), a ``Const`` (a parameter or buffer, known at conversion), a
Python value (an int, a shape, None; a size of a run-time tensor is a ``SizeOf``), or a tuple of values. The
table (``MODULES``, ``FUNCTIONS``, ``METHODS``, ``PATTERNS``) maps what PyTorch calls to the functions that
lower it: tools/lower_ops.py, tools/lower_masks.py and tools/lower_float_recurrent.py fill it with ``@lowers``,
and tools/lower.py walks the graph through it. The helpers here are the ones every lowering module shares:
dimensions, data movement, dtypes, casts and stored constants.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.fx

from .layers import LinearLayer

if TYPE_CHECKING:
    from .lower import Lowerer


class LoweringError(ValueError):
    """The graph holds something qrt cannot run; the message names every such node."""


# ------------------------------------------------------------ values during the walk
# A node's value is one of these, a Python value (an int, a shape, None, ...), or a tuple of values
# (a recurrent module's result, a tuple argument such as an LSTM's (h, c)).


@dataclass(frozen=True)
class Tensor:
    """A run-time tensor of the qrt graph (float32, or integer indices)."""

    name: str
    dtype: str = "float32"


@dataclass(frozen=True)
class Quant:
    """A quint8 per-tensor value in the qrt graph."""

    name: str
    scale: np.float32
    zero_point: int


@dataclass(frozen=True)
class Deq:
    """dequantize(q): becomes a qrt dequantize only if a float op reads it."""

    q: Quant

    @property
    def name(self) -> str:
        return self.q.name


@dataclass(frozen=True)
class DynQ:
    source: Tensor
    reduce_range: bool = True  # 7-bit activations (torch.ao's x86 flow); pt2e's dynamic schemes use all 8 bits

    @property
    def name(self) -> str:
        return self.source.name


@dataclass(frozen=True)
class DynDeq:
    """The float input of a dynamic op: the op quantizes it itself, per call."""

    source: Tensor
    reduce_range: bool = True

    @property
    def name(self) -> str:
        return self.source.name


@dataclass(frozen=True)
class PendingLinear:
    """A static reference Linear whose output quantize has not been seen yet."""

    name: str
    layer: LinearLayer
    x: Quant


@dataclass(frozen=True)
class Const:
    """A get_attr: a parameter, buffer or attribute of the model, known at conversion."""

    value: Any


TENSORS = (Tensor, Quant, Deq, DynQ, DynDeq, PendingLinear)


def is_tensor(v: Any) -> bool:
    return isinstance(v, TENSORS)


# ------------------------------------------------------------ the table


@dataclass(frozen=True)
class Lowering:
    """One table entry. ``sizes``: the lowering may be given sizes of free dimensions (it checks
    what it uses itself: a reshape takes its target from the observed shapes); otherwise the walk
    refuses a size that changes with a free dimension. ``keeps_dtype``: the result has the first
    argument's dtype (integer indices stay indices through it). ``index_args``: (position, name)
    of arguments that are integer indices, whose graph inputs are then int64."""

    fn: Callable[..., Any]
    sizes: bool = False
    keeps_dtype: bool = False
    index_args: tuple[tuple[int, str], ...] = ()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        try:
            inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:  # arguments the lowering does not take (a keyword it does not know, say)
            raise LoweringError(f"unsupported call arguments ({e})") from None
        return self.fn(*args, **kwargs)


MODULES: dict[type, Lowering] = {}
FUNCTIONS: dict[Any, Lowering] = {}
METHODS: dict[str, Lowering] = {}
PATTERNS: dict[str, Lowering] = {}


def lowers(
    *,
    modules: Sequence[type] = (),
    functions: Sequence[Any] = (),
    methods: Sequence[str] = (),
    patterns: Sequence[str] = (),
    **flags: Any,
) -> Callable:
    """Register a lowering for module classes, functions, method names or described patterns."""

    def register(fn: Callable) -> Callable:
        entry = Lowering(fn, **flags)
        for table, keys in ((MODULES, modules), (FUNCTIONS, functions), (METHODS, methods), (PATTERNS, patterns)):
            for key in keys:
                if key in table:
                    raise AssertionError(f"{key!r} is lowered twice")
                table[key] = entry
        return fn

    return register


# ------------------------------------------------------------ dimensions and data movement


def norm_dim(d: Any, rank: int, what: str = "dim") -> int:
    """A dim normalised to [0, rank) as torch does (negative counts from the end)."""
    if not isinstance(d, int) or isinstance(d, bool):
        raise LoweringError(f"{what} must be an int, got {d!r:.40}")
    if not -max(rank, 1) <= d < max(rank, 1):
        raise LoweringError(f"{what} {d} is out of range for a tensor of rank {rank}")
    return d % max(rank, 1)


def norm_dims(ds: Any, rank: int, what: str = "dim") -> list[int]:
    """One dim or a sequence of dims, normalised; None or () = every dim, as torch's reductions read it."""
    if ds is None or (isinstance(ds, (tuple, list)) and not ds):
        return list(range(rank))
    items = ds if isinstance(ds, (tuple, list)) else [ds]
    out = [norm_dim(d, rank, what) for d in items]
    if len(set(out)) != len(out):
        raise LoweringError(f"{what} {list(items)} names a dimension twice")
    return out


def moved(lw: Lowerer, node: torch.fx.Node, x: Any, op: str, attrs: dict, suffix: str = "", **more: str) -> Any:
    """A data-movement op (select, reshape, ...): keeps the dtype, and a quantized tensor's scale and zero point.
    more: further input ports (reshape's like)."""
    if isinstance(x, Quant):
        return Quant(lw.emit(node, op, {"x": x.name, **more}, attrs, suffix), x.scale, x.zero_point)
    if isinstance(x, Tensor):
        return Tensor(lw.emit(node, op, {"x": x.name, **more}, attrs, suffix), x.dtype)
    return Tensor(lw.emit(node, op, {"x": lw.float_of(x), **more}, attrs, suffix))


# ------------------------------------------------------------ sizes that follow a tensor


class SizeOf(int):
    """A size of a run-time tensor's dimension: value (a qrt value name) and dim say which."""

    value: str
    dim: int

    def __new__(cls, size: int, value: str, dim: int) -> SizeOf:
        out = super().__new__(cls, size)
        out.value, out.dim = value, dim
        return out


def sizes_of(lw: Lowerer, x: Any, dim: int | None) -> Any:
    """x.size(dim) (x.size() without dim: all of them), each a SizeOf where x is a run-time tensor."""
    shape = lw.shape(x)
    if not is_tensor(x):
        return shape if dim is None else shape[dim]
    if dim is None:
        return tuple(SizeOf(s, x.name, d) for d, s in enumerate(shape))
    return SizeOf(shape[dim], x.name, dim)


def has_size_of(v: Any) -> bool:
    leaves: list = []
    torch.fx.node.map_aggregate(v, leaves.append)
    return any(isinstance(x, SizeOf) for x in leaves)


# ------------------------------------------------------------ dtypes and stored constants

_DTYPES = {torch.float32: "float32", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool"}
TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}


def dtype_name(dtype: Any) -> str:
    if dtype not in _DTYPES:
        raise LoweringError(f"dtype {dtype} is not supported (float32, int32, int64 or bool)")
    return _DTYPES[dtype]


def dtype_kind(dtype: str) -> str:
    return "integer" if dtype in ("int32", "int64") else dtype


def dtype_of(v: Any) -> str:
    if isinstance(v, Tensor):
        return v.dtype
    if is_tensor(v):
        return "float32"
    raise LoweringError(f"needs a tensor, got {type(v).__name__}")


def cast(lw: Lowerer, node: torch.fx.Node, x: Any, dtype: str, suffix: str = "_cast") -> Tensor:
    """x as dtype (torch's .to(dtype)); x itself where it has that dtype."""
    if isinstance(x, Const) and isinstance(x.value, torch.Tensor):  # a stored value: converted here, by torch
        return Const(x.value.to(TORCH_DTYPES[dtype]))
    if dtype_of(x) == dtype:
        return x
    source = x.name if isinstance(x, Tensor) else lw.float_of(x)
    return Tensor(lw.emit(node, "cast", {"x": source}, {"dtype": dtype}, suffix), dtype)


def stored(lw: Lowerer, node: torch.fx.Node, t: torch.Tensor, suffix: str) -> Tensor:
    """A constant tensor as a run-time value. qrt stores no int64 or bool tensor: integers are stored as
    int32 (where every value fits) and bool as uint8, each cast back at run time."""
    a = t.detach().cpu().numpy()
    if t.dtype == torch.float32:
        return Tensor(lw.b.tensor(lw.unique(node.name + suffix), a.copy()))
    if t.dtype in (torch.int32, torch.int64):
        if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
            raise LoweringError(f"an integer constant beyond int32's range ({int(a.min())} .. {int(a.max())}): qrt "
                                "stores integers as int32")
        name = lw.b.tensor(lw.unique(node.name + suffix), a.astype(np.int32))
        return Tensor(name, "int32")
    if t.dtype == torch.bool:
        name = lw.b.tensor(lw.unique(node.name + suffix), a.astype(np.uint8))
        return Tensor(lw.emit(node, "cast", {"x": name}, {"dtype": "bool"}, suffix + "_bool"), "bool")
    raise LoweringError(f"a constant of dtype {t.dtype} (float32, integers or bool)")


def runtime_value(lw: Lowerer, node: torch.fx.Node, x: Any, suffix: str) -> Tensor:
    """x as a run-time value (a constant stored)."""
    if isinstance(x, Const) and isinstance(x.value, torch.Tensor):
        return stored(lw, node, x.value, suffix)
    if isinstance(x, Tensor):
        return x
    return Tensor(lw.float_of(x))


