"""Lowerings of comparisons, masks, casts, clamps, norms and the values that follow free sizes.

Transformer encoders build their attention masks from the sizes of their inputs: ``arange(S)``,
``mask[arange(B)[:, None, None, None], arange(S)[None, None, None, :]]``, ``buffer[:, :S]``,
``x.expand(B, S)``. A size read from a tensor (``x.size(d)``) is a ``SizeOf`` in the walk
(tools/lower_values.py): an int that remembers its tensor and dimension, so that what is built from it
follows that dimension at run time (qrt's ``arange``, ``expand`` with ``like``, ``index_select``) instead
of being written as a constant.
Indexing with full aranges is rewritten exactly as the data movement it is (unsqueezes, a permute).
docs/CONVERTER.md lists what is rewritten and what runs.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F

from .lower_ops import _cat_names, _float_op, _index, _joined, extremum, operands, slice_to_size, unary, value_kind
from .lower_values import (
    TORCH_DTYPES,
    Const,
    LoweringError,
    SizeOf,
    Tensor,
    cast,
    dtype_name,
    dtype_of,
    has_size_of,
    is_tensor,
    lowers,
    moved,
    norm_dim,
    norm_dims,
    runtime_value,
    sizes_of,
    stored,
)

if TYPE_CHECKING:
    from .lower import Lowerer


# ------------------------------------------------------------ dtypes

@lowers(functions=(torch.cumsum,), methods=("cumsum",))
def _cumsum(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int, *, dtype: Any = None) -> Tensor:
    # torch sums float32 (and integers it is asked to sum as float32) in float64 on the CPU; qrt's cumsum counts
    if dtype_of(input) == "float32" or dtype_name(dtype or torch.int64) not in ("int32", "int64"):
        raise LoweringError("cumsum of a float32 tensor, or to a float dtype, is not supported (qrt's cumsum sums "
                            "integers or bool exactly; torch sums floats in float64)")
    rank = len(lw.shape(input))
    if rank == 0:  # torch's cumsum of a single value: the value, as its sum's dtype
        sums = cast(lw, node, input, "int64", "_value")
    else:
        sums = Tensor(lw.emit(node, "cumsum", {"x": input.name}, {"dim": norm_dim(dim, rank)}), "int64")
    # torch sums integers in int64, or in dtype where given: its low bits are the int64 sum's
    return sums if dtype is None else cast(lw, node, sums, dtype_name(dtype), "_cast")


# ------------------------------------------------------------ comparisons and logic


def _comparison(op: str):
    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any) -> Any:
        if not any(is_tensor(v) or isinstance(v, Const) for v in (input, other)):
            return getattr(operator, op)(input, other)  # sizes and other Python numbers
        lw.require_static(node)
        a, b = operands(lw, node, input, other)
        return Tensor(lw.emit(node, op, {"a": a.name, "b": b.name}), "bool")

    return lower


for _op, _fns, _ops in (
    ("eq", (torch.eq,), (operator.eq,)), ("ne", (torch.ne,), (operator.ne,)),
    ("lt", (torch.lt,), (operator.lt,)), ("le", (torch.le,), (operator.le,)),
    ("gt", (torch.gt,), (operator.gt,)), ("ge", (torch.ge,), (operator.ge,)),
):
    lowers(functions=_fns + _ops, methods=(_op,), sizes=True)(_comparison(_op))


def _logical(op: str):
    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any) -> Tensor:
        a, b = operands(lw, node, input, other)
        if a.dtype != "bool" or b.dtype != "bool":
            raise LoweringError(f"{op} of {a.dtype} and {b.dtype} values (qrt's logic takes bool)")
        return Tensor(lw.emit(node, f"logical_{op}", {"a": a.name, "b": b.name}), "bool")

    return lower


lowers(functions=(torch.logical_and, operator.and_, torch.bitwise_and), methods=("logical_and",))(
    _logical("and"))
lowers(functions=(torch.logical_or, operator.or_, torch.bitwise_or), methods=("logical_or",))(_logical("or"))


@lowers(functions=(torch.logical_not, torch.bitwise_not, operator.invert), methods=("logical_not",))
def _logical_not(lw: Lowerer, node: torch.fx.Node, input: Any) -> Tensor:
    if dtype_of(input) != "bool":
        raise LoweringError(f"not of a {dtype_of(input)} value (qrt's logic takes bool)")
    return Tensor(lw.emit(node, "logical_not", {"x": input.name}), "bool")


def _bool_input(input: Any) -> None:
    if dtype_of(input) != "bool":
        raise LoweringError(f"any / all of a {dtype_of(input)} value (qrt's logic takes bool)")


def _any(lw: Lowerer, node: torch.fx.Node, input: Any, dims: list[int], keepdim: bool, suffix: str = "") -> Tensor:
    # True where some element along dims is: the largest of the elements as 0.0 / 1.0 is 1.0 there
    ones = cast(lw, node, input, "float32", "_float")
    top = Tensor(lw.emit(node, "amax", {"x": ones.name}, {"dims": dims, "keepdim": bool(keepdim)}, "_amax"))
    return cast(lw, node, top, "bool", suffix)


@lowers(functions=(torch.any,), methods=("any",))
def _any_of(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    _bool_input(input)
    return _any(lw, node, input, norm_dims(dim, len(lw.shape(input))), keepdim)


@lowers(functions=(torch.all,), methods=("all",))
def _all(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    _bool_input(input)
    dims = norm_dims(dim, len(lw.shape(input)))
    # all(x) is not any(not x)
    negated = Tensor(lw.emit(node, "logical_not", {"x": input.name}, None, "_not"), "bool")
    return Tensor(lw.emit(node, "logical_not", {"x": _any(lw, node, negated, dims, keepdim, "_any").name}), "bool")


@lowers(functions=(torch.where,))
def _where(lw: Lowerer, node: torch.fx.Node, condition: Any, input: Any, other: Any) -> Tensor:
    if dtype_of(condition) != "bool":
        raise LoweringError("where's condition must be a bool tensor")
    a, b = operands(lw, node, input, other)
    if a.dtype != b.dtype:  # int32 against int64 (a stored number against ids): int64, as torch.where gives
        a, b = cast(lw, node, a, "int64", "_a"), cast(lw, node, b, "int64", "_b")
    return Tensor(lw.emit(node, "where", {"condition": condition.name, "a": a.name, "b": b.name}), a.dtype)


@lowers(methods=("masked_fill",))
def _masked_fill(lw: Lowerer, node: torch.fx.Node, x: Any, mask: Any, value: Any) -> Tensor:
    if isinstance(value, (bool, int, float)):
        value = Const(torch.tensor(value, dtype=TORCH_DTYPES[dtype_of(x)]))  # torch casts the value to x's dtype
    return _where(lw, node, mask, value, x)


# ------------------------------------------------------------ casts


@lowers(methods=("to", "type_as"))
def _to(lw: Lowerer, node: torch.fx.Node, x: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> Any:
    for a in args:  # .to(dtype), .to(device, dtype), .to(other tensor) are not all alike
        if isinstance(a, torch.dtype):
            dtype = a
        elif is_tensor(a):
            dtype = TORCH_DTYPES.get(dtype_of(a))
    return x if dtype is None else cast(lw, node, x, dtype_name(dtype), "")


for _method, _dtype in (("long", torch.int64), ("int", torch.int32), ("bool", torch.bool)):
    lowers(methods=(_method,))(lambda lw, node, x, _d=_dtype: cast(lw, node, x, dtype_name(_d), ""))


# ------------------------------------------------------------ clamp, square roots, powers, norms


def _bound(v: Any, what: str) -> float | None:
    if v is None:
        return None
    if is_tensor(v) or isinstance(v, Const):
        raise LoweringError(f"a tensor {what} is not supported (a number only)")
    return float(np.float32(v))  # torch clamps a float32 tensor at the bound rounded to float32


@lowers(functions=(torch.clamp, torch.clip), methods=("clamp", "clip"))
def _clamp(lw: Lowerer, node: torch.fx.Node, input: Any, min: Any = None, max: Any = None) -> Tensor:
    if dtype_of(input) in ("int32", "int64"):
        if any(type(b) not in (int, type(None)) for b in (min, max)):  # a float bound: float32, as torch promotes
            return _clamp(lw, node, cast(lw, node, input, "float32", "_float"), min, max)
        for bound, comparison in ((min, "gt"), (max, "lt")):  # DeBERTa's relative positions: exact
            if bound is not None:
                input = extremum(lw, node, input, bound, comparison)
        return input
    return Tensor(lw.emit(node, "clamp", {"x": lw.float_of(input)}, {"min": _bound(min, "min"),
                                                                       "max": _bound(max, "max")}))


@lowers(functions=(torch.clamp_min,), methods=("clamp_min",))
def _clamp_min(lw: Lowerer, node: torch.fx.Node, input: Any, min: Any) -> Tensor:
    return _clamp(lw, node, input, min=min)


@lowers(functions=(torch.clamp_max,), methods=("clamp_max",))
def _clamp_max(lw: Lowerer, node: torch.fx.Node, input: Any, max: Any) -> Tensor:
    return _clamp(lw, node, input, max=max)


for _op in ("sqrt", "rsqrt", "log", "sin", "cos", "ceil", "floor"):  # float32 functions of one input: one op each
    lowers(functions=(getattr(torch, _op),), methods=(_op,))(unary(_op)[0])


@lowers(functions=(torch.sign,), methods=("sign",))
def _sign(lw: Lowerer, node: torch.fx.Node, input: Any) -> Tensor:
    """where(x > 0, 1, where(x < 0, -1, 0)): exact; -0.0 and NaN give +0.0, as torch's sign does."""
    if dtype_of(input) not in ("float32", "int32", "int64"):
        raise LoweringError(f"sign of a {dtype_of(input)} value is not supported")
    x, zero = operands(lw, node, input, 0)
    picked = cast(lw, node, zero, x.dtype, "_zero")  # where gives its a's dtype: the constants in x's (int32 stored)
    for comparison, value in (("lt", -1), ("gt", 1)):
        one = cast(lw, node, operands(lw, node, input, value)[1], x.dtype, f"_{comparison}_value")
        side = lw.emit(node, comparison, {"a": x.name, "b": zero.name}, suffix=f"_{comparison}")
        picked = Tensor(lw.emit(node, "where", {"condition": side, "a": one.name, "b": picked.name},
                                suffix=f"_{comparison}_pick"), x.dtype)
    return picked


@lowers(functions=(torch.abs,), methods=("abs",))
def _abs(lw: Lowerer, node: torch.fx.Node, input: Any) -> Tensor:
    """where(x <= 0, 0 - x, x): exact, -0.0 to +0.0 as torch; for integers the most negative stays itself, as
    torch's wraps. (A NaN keeps its sign bit, which torch clears: NaN bits are not part of the contract.)"""
    if dtype_of(input) not in ("float32", "int32", "int64"):
        raise LoweringError(f"abs of a {dtype_of(input)} value is not supported")
    x, zero = operands(lw, node, input, 0)
    at_most = lw.emit(node, "le", {"a": x.name, "b": zero.name}, suffix="_le")
    negated = lw.emit(node, "sub" if x.dtype == "float32" else "sub_int", {"a": zero.name, "b": x.name}, suffix="_neg")
    return Tensor(lw.emit(node, "where", {"condition": at_most, "a": negated, "b": x.name}), x.dtype)


@lowers(functions=(torch.minimum,), methods=("minimum",))
def _minimum(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any) -> Tensor:
    return extremum(lw, node, input, other, "lt")


@lowers(functions=(torch.maximum,), methods=("maximum",))
def _maximum(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any) -> Tensor:
    return extremum(lw, node, input, other, "gt")


@lowers(functions=(torch.min,), methods=("min",))
def _min(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any = None) -> Tensor:
    if not (is_tensor(other) or isinstance(other, Const)):  # torch.min(x), torch.min(x, dim)
        raise LoweringError("torch.min(x) and torch.min(x, dim) are not supported (torch.min(a, b) of integers is)")
    return extremum(lw, node, input, other, "lt")


def _div(lw: Lowerer, node: torch.fx.Node, a: Any, b: Any, suffix: str) -> str:
    return lw.emit(node, "div", {"a": a, "b": b}, suffix=suffix)


@lowers(functions=(torch.pow, operator.pow), methods=("pow",), sizes=True)
def _pow(lw: Lowerer, node: torch.fx.Node, input: Any, exponent: Any) -> Any:
    """The exponents torch's float32 pow computes without libm's powf, each as torch computes it
    (aten's pow_tensor_scalar_optimized_kernel): 2 -> x*x, 3 -> x*x*x, 0.5 -> sqrt, -0.5 -> rsqrt,
    -1 -> 1/x, -2 -> 1/(x*x), 1 -> x. Others run powf, whose last bit varies by library: refused."""
    if not is_tensor(input):
        if is_tensor(exponent):
            raise LoweringError("a number raised to a tensor power is not supported")
        return input ** exponent
    lw.require_static(node)
    x = lw.float_of(input)
    one = np.asarray(np.float32(1))
    if exponent == 1:
        return input
    if exponent in (0.5, -0.5):
        return _float_op(lw, node, "sqrt" if exponent == 0.5 else "rsqrt", input)
    if exponent in (2, -2, 3):
        sq = lw.emit(node, "mul", {"a": x, "b": x}, suffix="_square" if exponent != 2 else "")
        if exponent == 3:
            return Tensor(lw.emit(node, "mul", {"a": sq, "b": x}))
        return Tensor(sq if exponent == 2 else _div(lw, node, one, sq, ""))
    if exponent == -1:
        return Tensor(_div(lw, node, one, x, ""))
    raise LoweringError(f"pow with exponent {exponent!r} (torch runs libm's powf, not bit-reproducible); "
                        "qrt lowers the exponents 1, 2, 3, 0.5, -0.5, -1 and -2")


def _vector_norm(lw: Lowerer, node: torch.fx.Node, x: Any, dims: Any, keepdim: bool) -> str:
    """sqrt(sum(x * x)) over dims, in qrt's summation order (docs/NUMERICS.md)."""
    f = lw.float_of(x)
    sq = lw.emit(node, "mul", {"a": f, "b": f}, suffix="_square")
    total = lw.emit(node, "sum", {"x": sq}, {"dims": norm_dims(dims, len(lw.shape(x))), "keepdim": bool(keepdim)},
                    suffix="_sum")
    return lw.emit(node, "sqrt", {"x": total})


@lowers(functions=(torch.linalg.vector_norm,))
def _linalg_vector_norm(lw: Lowerer, node: torch.fx.Node, x: Any, ord: Any = 2, dim: Any = None,
                        keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    if ord != 2 or dtype not in (None, torch.float32):
        raise LoweringError(f"vector_norm with ord={ord!r}, dtype={dtype} (the 2-norm in float32 only)")
    return Tensor(_vector_norm(lw, node, x, dim, keepdim))


@lowers(functions=(torch.norm,), methods=("norm",))
def _norm(lw: Lowerer, node: torch.fx.Node, x: Any, p: Any = 2, dim: Any = None, keepdim: bool = False,
          dtype: Any = None) -> Tensor:
    return _linalg_vector_norm(lw, node, x, 2 if p in (2, "fro") else p, dim, keepdim, dtype=dtype)


@lowers(functions=(F.normalize,))
def _normalize(lw: Lowerer, node: torch.fx.Node, input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12,
               out: Any = None) -> Tensor:
    """x / max(||x||_2, eps) along dim, as F.normalize computes it (norm, clamp_min, expand_as, div)."""
    if p != 2 or out is not None:
        raise LoweringError(f"normalize with p={p!r} (p=2 only)")
    norm = _vector_norm(lw, node, input, dim, True)
    clamped = lw.emit(node, "clamp", {"x": norm}, {"min": _bound(eps, "eps")}, suffix="_clamp")
    return Tensor(lw.emit(node, "div", {"a": lw.float_of(input), "b": clamped}, suffix="_div"))


# ------------------------------------------------------------ values that follow free sizes


@lowers(functions=(torch.arange,), sizes=True)
def _arange(lw: Lowerer, node: torch.fx.Node, *args: Any, dtype: Any = None, device: Any = None,
            pin_memory: Any = None, layout: Any = None, requires_grad: bool = False) -> Any:
    if len(args) == 1 and isinstance(args[0], SizeOf):
        n = args[0]
        out = Tensor(lw.emit(node, "arange", {"x": n.value}, {"dim": n.dim}), "int64")
        return out if dtype in (None, torch.int64) else cast(lw, node, out, dtype_name(dtype))
    if has_size_of(args):
        raise LoweringError("arange over a free size needs the form arange(n)")
    lw.require_static(node)
    return Const(torch.arange(*args, dtype=dtype))


def _filled(lw: Lowerer, node: torch.fx.Node, size: Any, value: Any, dtype: torch.dtype) -> Any:
    """A new tensor of size filled with value (torch.full's rule for value in dtype). Of constant sizes: a
    constant. Sizes read from tensors (x.size(d), free ones too): a stored value expanded to them, then cast
    to dtype (integers are stored as int32)."""
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    if not has_size_of(size):
        lw.require_static(node)
        return Const(torch.full(size, value, dtype=dtype))
    one = Const(torch.full((1,) * len(size), value, dtype=dtype))
    return cast(lw, node, runtime_value(lw, node, _expand(lw, node, one, *size), "_filled"), dtype_name(dtype))


def _fixed_fill(lw: Lowerer, node: torch.fx.Node, position: int) -> None:
    """The fill value (argument position, or keyword fill_value) must not change with a free dimension: a length
    (torch.full((B,), x.size(1))) fixes that dimension, or is refused where it was declared free."""
    arg = node.kwargs.get("fill_value", node.args[position] if len(node.args) > position else None)
    if isinstance(arg, torch.fx.Node):
        lw.require_static(node, [arg], "fills a new tensor with")


def _dtype_or_default(dtype: Any, value: Any) -> torch.dtype:
    """torch.full's dtype: the one asked for, else the fill value's (bool, int64, or the default float32)."""
    return dtype if dtype is not None else torch.full((), value).dtype


@lowers(functions=(torch.zeros,), sizes=True)
def _zeros(lw: Lowerer, node: torch.fx.Node, *size: Any, dtype: Any = None, **kw: Any) -> Any:
    return _filled(lw, node, size, 0, dtype or torch.float32)


@lowers(functions=(torch.ones,), sizes=True)
def _ones(lw: Lowerer, node: torch.fx.Node, *size: Any, dtype: Any = None, **kw: Any) -> Any:
    return _filled(lw, node, size, 1, dtype or torch.float32)


@lowers(functions=(torch.full,), sizes=True)
def _full(lw: Lowerer, node: torch.fx.Node, size: Any, fill_value: Any, *, dtype: Any = None, **kw: Any) -> Any:
    _fixed_fill(lw, node, 1)
    return _filled(lw, node, (size,), fill_value, _dtype_or_default(dtype, fill_value))


def _torch_dtype(x: Any) -> torch.dtype:
    return x.value.dtype if isinstance(x, Const) and isinstance(x.value, torch.Tensor) else TORCH_DTYPES[dtype_of(x)]


@lowers(functions=(torch.Tensor.new_ones,), methods=("new_ones",), sizes=True)
def _new_ones(lw: Lowerer, node: torch.fx.Node, x: Any, *size: Any, dtype: Any = None, **kw: Any) -> Any:
    return _filled(lw, node, size, 1, dtype or _torch_dtype(x))


@lowers(functions=(torch.Tensor.new_zeros,), methods=("new_zeros",), sizes=True)
def _new_zeros(lw: Lowerer, node: torch.fx.Node, x: Any, *size: Any, dtype: Any = None, **kw: Any) -> Any:
    return _filled(lw, node, size, 0, dtype or _torch_dtype(x))


@lowers(functions=(torch.Tensor.new_full,), methods=("new_full",), sizes=True)
def _new_full(lw: Lowerer, node: torch.fx.Node, x: Any, size: Any, fill_value: Any, *, dtype: Any = None,
              **kw: Any) -> Any:
    _fixed_fill(lw, node, 2)
    return _filled(lw, node, (size,), fill_value, dtype or _torch_dtype(x))


def _full_like(lw: Lowerer, node: torch.fx.Node, input: Any, value: Any, dtype: Any) -> Any:
    """value in input's shape, free sizes too (F._canonical_mask's zeros under a padding mask): a stored value
    expanded to input's sizes, then cast to dtype (input's where none is asked for)."""
    if isinstance(input, Const):
        return Const(torch.full_like(input.value, value, dtype=dtype))
    dtype = dtype or _torch_dtype(input)
    if not lw.shape(input):  # of a run-time scalar: a run-time scalar (an output may be one), not a constant
        return cast(lw, node, stored(lw, node, torch.full((), value, dtype=dtype), "_filled"), dtype_name(dtype))
    return _filled(lw, node, sizes_of(lw, input, None), value, dtype)


@lowers(functions=(torch.zeros_like,))
def _zeros_like(lw: Lowerer, node: torch.fx.Node, input: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    return _full_like(lw, node, input, 0, dtype)


@lowers(functions=(torch.ones_like,))
def _ones_like(lw: Lowerer, node: torch.fx.Node, input: Any, *, dtype: Any = None, **kwargs: Any) -> Any:
    return _full_like(lw, node, input, 1, dtype)


@lowers(functions=(torch.full_like,))
def _full_like_fn(lw: Lowerer, node: torch.fx.Node, input: Any, fill_value: Any, *, dtype: Any = None,
                  **kwargs: Any) -> Any:
    _fixed_fill(lw, node, 1)
    return _full_like(lw, node, input, fill_value, dtype)


@lowers(methods=("expand",), sizes=True, keeps_dtype=True)
def _expand(lw: Lowerer, node: torch.fx.Node, x: Any, *sizes: Any) -> Any:
    """One qrt expand per tensor whose sizes are asked for (a BertModel's mask takes its batch from position_ids
    and its length from input_ids): each takes its sizes from its tensor, as torch does, in turn."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    ins, outs = lw.shapes(x), lw.node_shapes(node)
    if all(i == o for i, o in zip(ins, outs)):
        return x
    lead = len(sizes) - len(ins[0])
    shape, likes = [], {}  # likes: tensor -> {output dimension: its dimension}
    for i, s in enumerate(sizes):
        follows = i >= lead and all(o[i] == n[i - lead] for o, n in zip(outs, ins))
        if s == -1 or follows:
            shape.append(-1)
        elif isinstance(s, SizeOf):
            likes.setdefault(s.value, {})[i] = s.dim
            shape.append(-1 if i >= lead else 1)
        else:
            changed = {r for r, o in enumerate(outs) if o[i] != s}
            like = _sized_like(lw, [o[i] for o in outs]) if changed else None
            if like is not None:  # DeBERTa's q.size(0), exported as batch * heads: a value of that size gives it
                likes.setdefault(like[0], {})[i] = like[1]
                shape.append(-1 if i >= lead else 1)
                continue
            if changed:  # x.size(1) + 1: the free dimension it came from is fixed
                lw.varies(changed, f"makes a tensor of size {s} at dimension {i}, computed from a free size (qrt "
                                   "follows a free size only as read from a tensor, x.size(d))")
            shape.append(int(s))
    return _emit_expand(lw, node, runtime_value(lw, node, x, "_x"), shape, likes)


def _emit_expand(lw: Lowerer, node: torch.fx.Node, v: Tensor, shape: list[int], likes: dict,
                 suffix: str = "") -> Tensor:
    """v expanded to shape (-1: v's size), one qrt expand per tensor in likes ({tensor: {dimension: its
    dimension}}) whose sizes it takes, in turn."""
    out = v.name
    for k, (like, dims) in enumerate(likes.items() or [(None, {})]):
        attrs = {"shape": shape if k == 0 else [-1] * len(shape),
                 "like_dims": [dims.get(i) for i in range(len(shape))] if like is not None else []}
        out = lw.emit(node, "expand", {"x": out, "like": like}, attrs, suffix=suffix + (f"_{k}" if k else ""))
    return Tensor(out, v.dtype)


def _sized_like(lw: Lowerer, sizes: list[int]) -> tuple[str, int] | None:
    """A value computed so far and a dimension of it whose size is sizes[r] in every run r, the latest such,
    else None: for a size written as arithmetic on a free size (DeBERTa's batch * heads, as torch.export writes
    q.size(0)) rather than read from the tensor that has it. The runs change each free size alone from the
    example (n, then 2n + 3), so a size linear in it, as such sizes are, is known by its values there; two
    sizes that are not the same function could agree at both only by chance, and then qrt's expand refuses
    the mismatch at run time where the tensor it expands has that dimension."""
    for name, shapes in reversed(lw.observed.items()):
        for d in range(len(shapes[0])):
            if [shape[d] for shape in shapes] == sizes:
                return name, d
    return None


@lowers(methods=("repeat",), sizes=True, keeps_dtype=True)
def _repeat(lw: Lowerer, node: torch.fx.Node, x: Any, *sizes: Any) -> Any:
    """x.repeat(...). Dimensions of size 1 repeated are the expand they are (h.unsqueeze(1).repeat(1, T, 1), a
    decoder's state beside each source step); a larger one repeated c times (DeBERTa's position projections,
    [heads, 2k, e].repeat(batch, 1, 1)) is x's block written c times over: a new dimension of size c before it,
    expanded, then merged with it by a reshape. c may be a free size read from a tensor (x.size(0))."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    ins, outs = lw.shapes(x), lw.node_shapes(node)
    lead = len(sizes) - len(ins[0])
    if lead < 0:
        raise LoweringError(f"repeat with {len(sizes)} sizes for a tensor of rank {len(ins[0])}")
    tiled = [i for i, s in enumerate(sizes[lead:]) if (isinstance(s, SizeOf) or s != 1)
             and any(shape[i] != 1 for shape in ins)]
    if not tiled:
        return _expand(lw, node, x, *(-1 if k >= lead and s == 1 and not isinstance(s, SizeOf) else s
                                       for k, s in enumerate(sizes)))
    for k, s in enumerate(sizes):  # a count computed from a free size, not read from a tensor, fixes that size
        changed = {r for r, (o, i) in enumerate(zip(outs, ins)) if o[k] != s * (i[k - lead] if k >= lead else 1)}
        if not isinstance(s, SizeOf) and changed:
            lw.varies(changed, f"repeats dimension {k} a number of times computed from a free size (qrt follows a "
                               "free size only as read from a tensor, x.size(d))")
    v = runtime_value(lw, node, x, "_x")
    out = v.name
    for k, i in enumerate(tiled):  # the new dimension before each repeated one, in x's order
        out = lw.emit(node, "unsqueeze", {"x": out}, {"dim": i + k}, suffix=f"_tile{k}")
    shape, likes, at = [], {}, []  # at: where each output dimension lies in the expanded tiles
    for k, s in enumerate(sizes):
        if isinstance(s, SizeOf):
            likes.setdefault(s.value, {})[len(shape)] = s.dim
        at.append(len(shape))
        shape.append(1 if isinstance(s, SizeOf) else -1 if k >= lead and s == 1 else int(s))
        if k - lead in tiled:
            shape.append(-1)
    tiles = _emit_expand(lw, node, Tensor(out, v.dtype), shape, likes, suffix="_tiles")
    # the reshape merges each count with its dimension: a free size a merge makes is inferred (-1, one at most),
    # one the tiles have already is read from them
    free = [j for j in range(len(sizes)) if len({o[j] for o in outs}) > 1]
    merged_free = [j for j in free if j - lead in tiled]
    if len(merged_free) > 1:
        raise LoweringError(f"repeat tiles {len(merged_free)} dimensions of free size; qrt infers at most one")
    target = [-1 if j in merged_free else 1 if j in free else outs[0][j] for j in range(len(sizes))]
    like_dims = [at[j] if j in free and j not in merged_free else None for j in range(len(sizes))]
    kept = any(d is not None for d in like_dims)
    return Tensor(lw.emit(node, "reshape", {"x": tiles.name, "like": tiles.name if kept else None},
                          {"shape": target, "like_dims": like_dims if kept else []}), v.dtype)


@lowers(functions=(F.pad,), keeps_dtype=True)
def _pad(lw: Lowerer, node: torch.fx.Node, input: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
    """F.pad(x, (left, right, ...), value=v), the pairs from the last dimension back (MobileBERT's trigram
    embeddings pad the sequence by one token): x between blocks of v along each padded dimension (cat), each
    block x's size elsewhere (free sizes read from x at run time). Exact. Cropping (a negative amount) and the
    modes other than "constant" are refused by name."""
    if mode != "constant":
        raise LoweringError(f"F.pad mode {mode!r} is not supported (\"constant\" only)")
    amounts = list(pad)
    if len(amounts) % 2 or len(amounts) > 2 * len(lw.shape(input)):
        raise LoweringError(f"F.pad's pad {amounts} must be pairs, at most two per dimension")
    if any(not isinstance(a, int) or isinstance(a, SizeOf) or a < 0 for a in amounts):
        raise LoweringError(f"F.pad by {amounts}: qrt pads by constant amounts of at least 0 (no cropping)")
    x = runtime_value(lw, node, input, "_x")
    rank, size = len(lw.shape(x)), list(lw.shape(x))  # size: x's at the example, padded as x is
    free = [k for k in range(rank) if len({s[k] for s in lw.shapes(x)}) > 1]
    dtype = TORCH_DTYPES[x.dtype]
    for p in range(len(amounts) // 2):
        d = rank - 1 - p
        blocks = []
        for side, amount in (("before", amounts[2 * p]), ("after", amounts[2 * p + 1])):
            if amount == 0:
                blocks.append(None)
                continue
            one = stored(lw, node, torch.full((1,) * rank, 0 if value is None else value, dtype=dtype), f"_{side}{d}")
            shape = [amount if k == d else 1 if k in free else size[k] for k in range(rank)]
            likes = {x.name: {k: k for k in free if k != d}} if set(free) - {d} else {}
            block = _emit_expand(lw, node, one, shape, likes, suffix=f"_{side}{d}")
            blocks.append(cast(lw, node, block, x.dtype, f"_{side}{d}_cast"))
        names, wrap = _joined(lw, [b for b in (blocks[0], x, blocks[1]) if b is not None])
        x = _cat_names(lw, node, names, d, wrap, start=p) if len(names) > 1 else x
        size[d] += amounts[2 * p] + amounts[2 * p + 1]
    return x


@lowers(methods=("expand_as",), keeps_dtype=True)
def _expand_as(lw: Lowerer, node: torch.fx.Node, x: Any, other: Any) -> Any:
    return _expand(lw, node, x, *sizes_of(lw, other, None))


@lowers(functions=(torch.gather,), keeps_dtype=True)
def _gather(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    x, i = runtime_value(lw, node, input, "_x"), runtime_value(lw, node, index, "_index")
    if i.dtype not in ("int32", "int64"):
        raise LoweringError("gather's index must be an integer tensor")
    return Tensor(lw.emit(node, "gather", {"x": x.name, "index": i.name}, {"dim": norm_dim(dim, len(lw.shape(input)))}),
                  x.dtype)


def _traced(fn: Any, args: tuple) -> Any:
    """fn's call as a node of the graph being traced, if one is (torch.fx re-tracing the raised graph to
    quantize it), else None."""
    leaves: list = []
    torch.fx.node.map_aggregate(args, leaves.append)
    proxy = next((a for a in leaves if isinstance(a, torch.fx.Proxy)), None)
    return None if proxy is None else proxy.tracer.create_proxy("call_function", fn, args, {})


def index_tensors(x: torch.Tensor, indices: list) -> torch.Tensor:
    """x[i0, i1, ...] with index tensors (None: a whole dimension), as aten.index computes it: what the
    export front end writes for tensor indexing."""
    traced = _traced(index_tensors, (x, indices))
    return traced if traced is not None else torch.ops.aten.index.Tensor(x, indices)


def slice_dim(x: torch.Tensor, dim: int, start: Any, end: Any, step: int) -> torch.Tensor:
    """x[start:end:step] along dim where a bound is a size read from a tensor: what the export front end
    writes for aten.slice with a symbolic bound (x[:, :n] with n = y.size(1))."""
    traced = _traced(slice_dim, (x, dim, start, end, step))
    return traced if traced is not None else x[(slice(None),) * dim + (slice(start, end, step),)]


@lowers(functions=(slice_dim,), sizes=True, keeps_dtype=True)
def _slice_dim(lw: Lowerer, node: torch.fx.Node, x: Any, dim: int, start: Any, end: Any, step: int) -> Any:
    if isinstance(end, SizeOf) and start in (None, 0) and step == 1 and not isinstance(start, SizeOf):
        return slice_to_size(lw, node, x, dim, end)
    lw.require_static(node)
    return _index(lw, node, runtime_value(lw, node, x, "_x"), (slice(None),) * dim + (slice(start, end, step),))


def _iota_axis(lw: Lowerer, n: Any) -> tuple[int, torch.fx.Node] | None:
    """(axis, arange node) if the fx node n is arange(k) (+ 0) unsqueezed to some rank: the values
    0 .. k-1 along one axis, every other axis of size 1."""
    rank_adds = []  # the unsqueezes' dims, outermost first
    while isinstance(n, torch.fx.Node):
        if n.target in (torch.unsqueeze,) or (n.op == "call_method" and n.target == "unsqueeze"):
            rank_adds.append(n.args[1])
            n = n.args[0]
        elif n.target in (operator.add, operator.sub) and n.args[1] == 0:
            n = n.args[0]
        elif n.target is torch.arange and len(n.args) == 1:
            axis, rank = 0, 1
            for d in reversed(rank_adds):
                rank += 1
                axis += 1 if d % rank <= axis else 0
            return axis, n
        else:
            return None
    return None


@lowers(functions=(index_tensors,), keeps_dtype=True)
def _index_tensors(lw: Lowerer, node: torch.fx.Node, x: Any, indices: Any) -> Any:
    """Full aranges along distinct axes (a mask's rows and columns picked out, as transformers' mask
    builders do): the data movement they are, exactly. One 1-D index: index_select."""
    fx_indices = node.args[1]
    xs, outs = lw.shapes(x), lw.node_shapes(node)
    given = [k for k, i in enumerate(indices) if i is not None]
    if any(value_kind(i.value if isinstance(i, Const) else i) == "bool" for i in indices if i is not None):
        raise LoweringError("indexing with a bool mask (its result's size depends on the values)")
    if len(given) == 1 and len(lw.shape(indices[given[0]])) == 1:
        k = given[0]
        i = runtime_value(lw, node, indices[k], "_index")
        return Tensor(lw.emit(node, "index_select", {"x": runtime_value(lw, node, x, "_x").name, "index": i.name},
                              {"dim": k}), dtype_of(x) if is_tensor(x) else "float32")
    if any(i is None for i in indices):
        raise LoweringError("tensor indexing with whole dimensions between index tensors")
    v = runtime_value(lw, node, x, "_x")
    axes = []
    for k, n in enumerate(fx_indices):
        found = _iota_axis(lw, n)
        if found is None:
            raise LoweringError("tensor indexing other than by full aranges or one 1-D index is not supported")
        axis, arange = found
        if any(a[0] != s[k] for a, s in zip(lw.node_shapes(arange), xs)):
            # an arange shorter than x's dimension in some run: x's first entries there, as many as it has
            index = runtime_value(lw, node, lw.env[arange], f"_index{k}")
            v = Tensor(lw.emit(node, "index_select", {"x": v.name, "index": index.name}, {"dim": k},
                               f"_select{k}"), v.dtype)
        axes.append(axis)
    rank = len(outs[0]) - (len(xs[0]) - len(indices))  # of the indices broadcast together, right-aligned
    axes = [a + rank - len(lw.node_shapes(n)[0]) for a, n in zip(axes, fx_indices)]
    if len(set(axes)) != len(axes) or any(o[a] != 1 for o in outs for a in range(rank) if a not in axes):
        raise LoweringError("index tensors that are not aranges along distinct axes")
    # x's indexed dimensions in the order of their axes, then the size-1 axes put in, then x's other dimensions
    order = sorted(range(len(axes)), key=lambda k: axes[k])
    perm = order + list(range(len(axes), len(xs[0])))
    if perm != sorted(perm):
        v = moved(lw, node, v, "permute", {"perm": perm}, "_permute")
    for a in range(rank):
        if a not in axes:
            v = moved(lw, node, v, "unsqueeze", {"dim": a}, f"_unsqueeze{a}")
    return v
