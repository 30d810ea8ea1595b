"""Lowerings of PyTorch's quantized layers, float modules and functions, arithmetic, indexing and shapes.

As qrt/ops.py's OPS is for the runtime, the lowering table (tools/lower_values.py) is the one place that
says what the converter lowers: ``MODULES`` (float module classes), ``FUNCTIONS`` (call_function targets),
``METHODS`` (tensor method names) and ``PATTERNS`` (quantized layers the front end describes, by pattern
name). This module fills most of it; tools/lower_masks.py (comparisons, masks, casts, what follows free
sizes), tools/lower_float_recurrent.py and tools/torchao_frontend.py the rest. ``find_unsupported``
(tools/lower.py) derives what is supported from the table, and the walk dispatches through it; adding an
op is one ``@lowers(...)`` function.

A lowering gets the walk (``lw``: emitting nodes, float values of a tensor, observed shapes),
the fx node, and the call's arguments with fx nodes replaced by walk values (below); module
lowerings get the module after the node. Argument errors raise ``LoweringError`` with a plain
message: the walk adds which module or function it is about.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.dropout import _DropoutNd

from qrt.ops import MAX_LAYERS, layer_prefix

from .layers import EmbeddingLayer, LinearLayer, RNNCellLayer, SequenceLayer, StubLayer
from .lower_values import (
    MODULES,
    TORCH_DTYPES,
    Const,
    Deq,
    DynDeq,
    DynQ,
    Lowering,
    LoweringError,
    PendingLinear,
    Quant,
    SizeOf,
    Tensor,
    cast,
    dtype_kind,
    dtype_name,
    dtype_of,
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


def float_linear_relu(m: nn.Module) -> bool:
    """A float Linear -> ReLU that prepare_fx fused (nni.LinearReLU, a Sequential) and left unquantized."""
    return (
        isinstance(m, nn.Sequential) and len(m) == 2 and type(m[0]) is nn.Linear and isinstance(m[1], nn.ReLU)
    )


def module_lowering(m: nn.Module) -> Lowering | None:
    """The entry for a float module: by its class or the nearest base class in MODULES."""
    if float_linear_relu(m):
        return _FUSED_LINEAR_RELU
    for cls in type(m).__mro__:
        if cls in MODULES:
            return MODULES[cls]
    return None


# ------------------------------------------------------------ helpers


def _float_op(lw: Lowerer, node: torch.fx.Node, op: str, x: Any, attrs: dict | None = None) -> Tensor:
    return Tensor(lw.emit(node, op, {"x": lw.float_of(x)}, attrs))


def _no_dtype(dtype: Any) -> None:
    if dtype not in (None, torch.float32):
        raise LoweringError(f"dtype={dtype} is not supported (float32 only)")


def _items(v: Any, what: str) -> list:
    if not isinstance(v, (tuple, list)) or not v:
        raise LoweringError(f"{what} must be a non-empty list or tuple of tensors")
    return list(v)


def _array(c: Any, what: str) -> np.ndarray:
    """A float32 array from a stored parameter or buffer."""
    t = c.value if isinstance(c, Const) else c
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise LoweringError(f"{what} must be a float32 parameter or buffer of the model, got {type(t).__name__}")
    return t.detach().numpy().copy()


# ------------------------------------------------------------ quantize / dequantize

# convert_fx runs these ops on the quantized tensor itself when they sit between a dequantize and a
# quantize, keeping the input's scale and zero point and dropping that quantize (torch 2.13
# _lower_to_native_backend: is_copy_node, is_general_tensor_shape_node, is_default_node). Its observed
# qparams are ignored, so the lowering must ignore them too. Exact types, as torch matches them;
# only those that move data unchanged (copying q at the same qparams is exact).
_NATIVE_COPY_MODULES = (nn.ReLU, nn.Dropout, nn.Identity)
_NATIVE_COPY_FUNCS = (F.relu, torch.flatten, torch.narrow, torch.transpose, torch.squeeze, torch.unsqueeze)
_NATIVE_COPY_METHODS = (
    "relu", "contiguous", "detach", "permute", "reshape", "squeeze", "transpose", "unsqueeze", "view",
)


def _native_copy_input(lw: Lowerer, src: Any) -> Quant | None:
    """The quantized input of a dequantize -> copy op -> quantize chain, as convert_fx matches it."""
    if not isinstance(src, torch.fx.Node) or not src.args or not isinstance(src.args[0], torch.fx.Node):
        return None
    copy_op = (
        (src.op == "call_module" and type(lw.modules[src.target]) in _NATIVE_COPY_MODULES)
        or (src.op == "call_function" and src.target in _NATIVE_COPY_FUNCS)
        or (src.op == "call_method" and src.target in _NATIVE_COPY_METHODS)
    )
    dq = src.args[0]
    if not copy_op or not (dq.op == "call_method" and dq.target == "dequantize"):
        return None
    v = lw.env[dq]
    return v.q if isinstance(v, Deq) else None


def emit_static_linear(lw: Lowerer, p: PendingLinear, y_scale: np.float32, y_zp: int) -> Quant:
    layer, x = p.layer, p.x
    if layer.weight.values.dtype != np.int8:
        raise LoweringError("a static Linear needs qint8 weights")
    out = lw.b.node(
        "linear",
        {
            "x": x.name,
            "x_scale": np.float32(x.scale),
            "x_zero_point": np.int32(x.zero_point),
            **layer.weight.ports(),
            "bias": layer.bias,
            "y_scale": np.float32(y_scale),
            "y_zero_point": np.int32(y_zp),
        },
        {"relu": layer.relu, **lw.engine_attrs},
        name=p.name,
    )
    return Quant(out, np.float32(y_scale), y_zp)


@lowers(functions=(torch.quantize_per_tensor,))
def _quantize(lw: Lowerer, node: torch.fx.Node, x: Any, scale: Any, zero_point: Any, dtype: Any) -> Quant:
    scale, zero_point, dtype = (c.value if isinstance(c, Const) else c for c in (scale, zero_point, dtype))
    if dtype != torch.quint8:
        raise LoweringError(f"quantize to {dtype} is not supported (quint8 only)")
    s = float(scale)
    if float(np.float32(s)) != s:
        raise LoweringError(f"scale {s!r} is not a float32 value")
    s32, z = np.float32(s), int(zero_point)
    if isinstance(x, PendingLinear):
        return emit_static_linear(lw, x, s32, z)
    kept = _native_copy_input(lw, node.args[0])
    if kept is not None:
        # relu / flatten / a reshape of a quint8 value at its own qparams is exact: max(q, zp) or q.
        s32, z = kept.scale, kept.zero_point
    # qnnpack's quantization is ARM torch's (the zero point added after rounding): the engine says so
    out = lw.emit(node, "quantize_per_tensor", {"x": lw.float_of(x), "scale": s32, "zero_point": np.int32(z)},
                  {"dtype": "quint8", **lw.quantize_attrs})
    return Quant(out, s32, z)


@lowers(functions=(torch.quantize_per_tensor_dynamic,))
def _quantize_dynamic(lw: Lowerer, node: torch.fx.Node, x: Any, dtype: Any = None, reduce_range: Any = None) -> DynQ:
    # torch.ao's graphs say reduce_range False, but nnqd.Linear reduces the range on x86 whatever the
    # observer says (NUMERICS.md): 7-bit activations.
    return DynQ(Tensor(lw.float_of(x)))


def quantize_dynamic_8bit(x: torch.Tensor) -> torch.Tensor:
    """pt2e's dynamic activation quantize (choose_qparams + quantize + dequantize over all 8 bits), as the
    export front end writes it into its graphs. The value for the shape runs is x itself."""
    return x


@lowers(functions=(quantize_dynamic_8bit,))
def _quantize_dynamic_8bit(lw: Lowerer, node: torch.fx.Node, x: Any) -> DynQ:
    return DynQ(Tensor(lw.float_of(x)), reduce_range=False)


@lowers(methods=("dequantize",))
def _dequantize(lw: Lowerer, node: torch.fx.Node, x: Any) -> Any:
    if isinstance(x, Quant):
        return Deq(x)
    if isinstance(x, DynQ):
        return DynDeq(x.source, x.reduce_range)
    if isinstance(x, PendingLinear):
        raise LoweringError("a static Linear's output is dequantized unquantized")
    return x  # dequantize of a float tensor is the identity


@lowers(patterns=("quantize",))
def _quant_stub(lw: Lowerer, node: torch.fx.Node, layer: StubLayer, x: Any) -> Quant:
    return _quantize(lw, node, x, layer.scale, layer.zero_point, layer.dtype)


@lowers(patterns=("dequantize",))
def _dequant_stub(lw: Lowerer, node: torch.fx.Node, layer: StubLayer, x: Any) -> Any:
    return _dequantize(lw, node, x)


# ------------------------------------------------------------ identities


@lowers(modules=(nn.Identity,), keeps_dtype=True)
def _identity_module(lw: Lowerer, node: torch.fx.Node, m: nn.Module, x: Any) -> Any:
    return x


@lowers(modules=(_DropoutNd,), keeps_dtype=True)
def _dropout_module(lw: Lowerer, node: torch.fx.Node, m: nn.Module, x: Any) -> Any:
    return x  # the identity in eval mode (the converter runs the model in eval mode)


@lowers(
    functions=(F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout),
    keeps_dtype=True,
)
def _dropout(lw: Lowerer, node: torch.fx.Node, input: Any, p: float = 0.5, training: bool = True,
             inplace: bool = False) -> Any:
    if training:
        raise LoweringError("dropout with training=True is random at inference; pass training=self.training")
    return input


@lowers(functions=(torch.dropout,), keeps_dtype=True)
def _torch_dropout(lw: Lowerer, node: torch.fx.Node, input: Any, p: float, train: bool) -> Any:
    return _dropout(lw, node, input, p, train)


@lowers(methods=("contiguous", "detach", "clone", "requires_grad_"), keeps_dtype=True)
def _same(lw: Lowerer, node: torch.fx.Node, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@lowers(methods=("float",))
def _float(lw: Lowerer, node: torch.fx.Node, x: Any) -> Any:
    return cast(lw, node, x, "float32", "") if isinstance(x, Tensor) else x


@lowers(functions=(torch.fx._symbolic_trace._assert_is_none,))
def _assert_is_none(lw: Lowerer, node: torch.fx.Node, value: Any, msg: str) -> None:
    """fx's guard for an argument bound to its default None when tracing."""
    return None


@lowers(functions=(torch._assert,))
def _assert(lw: Lowerer, node: torch.fx.Node, condition: Any, message: str) -> None:
    """fx's guard for an argument bound to another default (`scale == 0.5`), true by construction; an
    assertion the model makes on its tensors is not run."""
    if condition is True:
        return None
    raise LoweringError(f"the model asserts {message!r}, which qrt does not check when it runs")


# ------------------------------------------------------------ sizes (Python values, folded)


@lowers(methods=("size",), sizes=True)
def _size(lw: Lowerer, node: torch.fx.Node, x: Any, dim: int | None = None) -> Any:
    return sizes_of(lw, x, None if dim is None else norm_dim(dim, len(lw.shape(x))))


@lowers(methods=("dim",))
def _rank(lw: Lowerer, node: torch.fx.Node, x: Any) -> int:
    return len(lw.shape(x))


@lowers(functions=(getattr,), sizes=True)
def _getattr(lw: Lowerer, node: torch.fx.Node, x: Any, name: str) -> Any:
    if name == "shape" and is_tensor(x):
        return sizes_of(lw, x, None)  # sizes that remember their tensor: torch.zeros(x.shape[0]) follows it
    if name == "ndim" and is_tensor(x):
        return len(lw.shape(x))
    if name == "device" and is_tensor(x):
        return torch.device("cpu")  # torch.zeros(..., device=x.device): the device is the runtime's
    if name == "dtype" and isinstance(x, Tensor):
        return TORCH_DTYPES[x.dtype]
    if name == "values" and isinstance(x, tuple):  # torch.max(x, dim).values
        return x[0]
    raise LoweringError(f"reading .{name} of a tensor is not supported")


# ------------------------------------------------------------ indexing and slicing


def slice_to_size(lw: Lowerer, node: torch.fx.Node, x: Any, dim: int, stop: SizeOf) -> Tensor:
    """x[..., :n] along dim with n a free size: x's first n entries there (index_select of arange(n);
    n beyond x's size raises at run time where Python's slice would clamp)."""
    v = runtime_value(lw, node, x, "_x")
    n = lw.emit(node, "arange", {"x": stop.value}, {"dim": stop.dim}, suffix="_arange")
    return Tensor(lw.emit(node, "index_select", {"x": v.name, "index": n}, {"dim": dim}), v.dtype)


@lowers(functions=(operator.getitem,), sizes=True, keeps_dtype=True)
def _getitem(lw: Lowerer, node: torch.fx.Node, obj: Any, index: Any) -> Any:
    """A tuple's item (a recurrent module's result, a tuple argument, a shape), or tensor indexing."""
    if isinstance(obj, (tuple, list)):
        if isinstance(index, (int, slice)) and not isinstance(index, bool):
            return obj[index]
        raise LoweringError(f"indexing a tuple with {index!r:.40}")
    items = index if isinstance(index, tuple) else (index,)
    to_size = [k for k, it in enumerate(items) if isinstance(it, slice) and isinstance(it.stop, SizeOf)]
    if len(to_size) == 1 and items[to_size[0]].start in (None, 0) and items[to_size[0]].step in (None, 1) \
            and all(it == slice(None) for it in items[: to_size[0]]):
        # x[:, :n], n a free size (transformers' position ids): follows n at run time
        return slice_to_size(lw, node, obj, to_size[0], items[to_size[0]].stop)
    if not is_tensor(obj):
        raise LoweringError(f"indexing a {type(obj).__name__}")
    lw.require_static(node)
    return _index(lw, node, obj, index)


def _index(lw: Lowerer, node: torch.fx.Node, x: Any, index: Any) -> Any:
    """x[i, a:b, None, ...] -> select / slice / unsqueeze, left to right, as torch reads the index."""
    items = list(index) if isinstance(index, tuple) else [index]
    for it in items:
        simple = it is None or it is Ellipsis or isinstance(it, slice) or isinstance(it, int)
        if isinstance(it, bool) or not simple or (isinstance(it, slice) and not all(
                v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (it.start, it.stop, it.step))):
            raise LoweringError(
                f"indexing with {it!r:.40} is not supported; qrt indexes with ints, slices, None and ... "
                "(no tensors or lists: advanced indexing)"
            )
    if items.count(Ellipsis) > 1:
        raise LoweringError("an index can have only one ...")
    rank = len(lw.shape(x))
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    if consumed > rank:
        raise LoweringError(f"too many indices ({consumed}) for a tensor of rank {rank}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (rank - consumed)
    pos, v, emitted = 0, x, 0
    for it in items:
        suffix = f"_{emitted}" if emitted else ""
        if it is None:
            v, pos, emitted = moved(lw, node, v, "unsqueeze", {"dim": pos}, suffix), pos + 1, emitted + 1
        elif isinstance(it, int):
            v, emitted = moved(lw, node, v, "select", {"dim": pos, "index": it}, suffix), emitted + 1
        elif it == slice(None) or it == slice(None, None, 1):
            pos += 1
        else:
            step = 1 if it.step is None else it.step
            if step < 1:
                raise LoweringError(f"slice step must be positive, got {step}")
            attrs = {"dim": pos, "start": it.start or 0, "end": it.stop, "step": step}
            v, pos, emitted = moved(lw, node, v, "slice", attrs, suffix), pos + 1, emitted + 1
    return v


@lowers(functions=(torch.select,), methods=("select",), keeps_dtype=True)
def _select(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int, index: int) -> Any:
    if not isinstance(index, int) or isinstance(index, bool):
        raise LoweringError(f"index must be an int, got {index!r:.40}")
    return moved(lw, node, input, "select", {"dim": norm_dim(dim, len(lw.shape(input))), "index": index})


@lowers(functions=(torch.narrow,), methods=("narrow",), keeps_dtype=True)
def _narrow(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int, start: int, length: int) -> Any:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, length)):
        raise LoweringError("narrow's start and length must be ints")
    end = start + length
    attrs = {"dim": norm_dim(dim, len(lw.shape(input))), "start": start, "end": None if start < 0 <= end else end}
    return moved(lw, node, input, "slice", attrs)


# ------------------------------------------------------------ splitting: tuples of slices or selects


def _fixed_dim(lw: Lowerer, x: Any, dim: Any, what: str) -> tuple[int, int]:
    """(dim normalised, its size). The pieces' count and bounds are written in the file, so a free dimension that
    the size follows is fixed (as a size used as a number fixes it: Lowerer.varies)."""
    d = norm_dim(dim, len(lw.shape(x)))
    changed = {r for r, shape in enumerate(lw.shapes(x)) if shape[d] != lw.shape(x)[d]}
    if changed:
        lw.varies(changed, f"cuts dimension {d} into pieces ({what}), whose count and bounds the file holds")
    return d, lw.shape(x)[d]


def _pieces(lw: Lowerer, node: torch.fx.Node, x: Any, dim: Any, sizes: Callable[[int], list[int]],
            what: str) -> tuple:
    """x cut along dim into consecutive pieces of the sizes that sizes(dim's size) gives: one slice each."""
    d, size = _fixed_dim(lw, x, dim, what)
    out, start = [], 0
    for i, n in enumerate(sizes(size)):
        attrs = {"dim": d, "start": start, "end": start + n, "step": 1}
        out.append(moved(lw, node, x, "slice", attrs, f"_{i}"))
        start += n
    return tuple(out)


@lowers(functions=(torch.chunk,), methods=("chunk",), keeps_dtype=True)
def _chunk(lw: Lowerer, node: torch.fx.Node, input: Any, chunks: int, dim: int = 0) -> tuple:
    # torch's rule: pieces of ceil(size / chunks), the last the rest (so possibly fewer than chunks)
    def sizes(size: int) -> list[int]:
        step = max(-(-size // chunks), 1)
        return [min(step, size - s) for s in range(0, size, step)]

    return _pieces(lw, node, input, dim, sizes, "chunk")


@lowers(functions=(torch.split, torch.split_with_sizes), methods=("split", "split_with_sizes"), keeps_dtype=True)
def _split(lw: Lowerer, node: torch.fx.Node, tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple:
    def sizes(size: int) -> list[int]:
        if isinstance(split_size_or_sections, int):
            return [min(split_size_or_sections, size - s) for s in range(0, size, split_size_or_sections)]
        if sum(split_size_or_sections) != size:
            raise LoweringError(f"split sizes {list(split_size_or_sections)} do not add up to the size {size}")
        return list(split_size_or_sections)

    return _pieces(lw, node, tensor, dim, sizes, "split")


@lowers(functions=(torch.unbind,), methods=("unbind",), keeps_dtype=True)
def _unbind(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int = 0) -> tuple:
    d, size = _fixed_dim(lw, input, dim, "unbind")
    return tuple(moved(lw, node, input, "select", {"dim": d, "index": i}, f"_{i}") for i in range(size))


# ------------------------------------------------------------ joining


_MAX_JOIN = 16  # cat / stack take x0 .. x15


def _joined(lw: Lowerer, tensors: list) -> tuple[list[str], Callable[[str], Any]]:
    """The names of tensors to join, all of one dtype, and how to wrap the result."""
    if all(isinstance(t, Tensor) and t.dtype != "float32" for t in tensors):
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise LoweringError(f"joining tensors of dtypes {sorted(dtypes)} is not supported")
        dtype = dtypes.pop()
        return [t.name for t in tensors], lambda name: Tensor(name, dtype)
    return [lw.float_of(t) for t in tensors], Tensor


def _cat_names(lw: Lowerer, node: torch.fx.Node, names: list[str], dim: int, wrap: Callable, start: int = 0) -> Any:
    """cat in chunks of 16 (cat is associative along dim)."""
    out, i, part = None, 0, 0
    while i < len(names):
        take = names[i : i + _MAX_JOIN - (out is not None)]
        ins = ([out] if out is not None else []) + take
        suffix = f"_{start + part}" if start + part else ""
        out = lw.emit(node, "cat", {f"x{k}": n for k, n in enumerate(ins)}, {"dim": dim}, suffix)
        i, part = i + len(take), part + 1
    return wrap(out)


@lowers(functions=(torch.cat, torch.concat), keeps_dtype=True)
def _cat(lw: Lowerer, node: torch.fx.Node, tensors: Any, dim: int = 0) -> Any:
    items = _items(tensors, "tensors")
    if len(items) == 1:
        return items[0]
    names, wrap = _joined(lw, items)
    return _cat_names(lw, node, names, norm_dim(dim, len(lw.shape(items[0]))), wrap)


@lowers(functions=(torch.concatenate,), keeps_dtype=True)
def _concatenate(lw: Lowerer, node: torch.fx.Node, tensors: Any, axis: int = 0) -> Any:
    return _cat(lw, node, tensors, axis)


@lowers(functions=(torch.stack,), keeps_dtype=True)
def _stack(lw: Lowerer, node: torch.fx.Node, tensors: Any, dim: int = 0) -> Any:
    items = _items(tensors, "tensors")
    d = norm_dim(dim, len(lw.shape(items[0])) + 1)
    names, wrap = _joined(lw, items)
    if len(names) <= _MAX_JOIN:
        return wrap(lw.emit(node, "stack", {f"x{k}": n for k, n in enumerate(names)}, {"dim": d}))
    # More than 16: unsqueeze each, then cat.
    parts = [lw.emit(node, "unsqueeze", {"x": n}, {"dim": d}, f"_u{k}") for k, n in enumerate(names)]
    return _cat_names(lw, node, parts, d, wrap)


# ------------------------------------------------------------ shapes


def _reshape_observed(lw: Lowerer, node: torch.fx.Node, x: Any, asked: Sequence[Any] = ()) -> Any:
    """A reshape whose target comes from the shapes the runs observed: a size that stays the same is
    written as it is, one that follows the input's size at the same position as 0, and one other
    that changes as -1 (ONNX semantics), so the reshape stays right at every size of a free dimension.
    Where several change, those the call asked for as sizes of one other tensor (asked: the call's sizes,
    ``q.size(0)`` a SizeOf) are taken from it at run time (reshape's like)."""
    ins, outs = lw.shapes(x), lw.node_shapes(node)
    if all(i == o for i, o in zip(ins, outs)):
        return x
    target, inferred = [], []
    for j, size in enumerate(outs[0]):
        column = [o[j] for o in outs]
        if all(c == size for c in column) and size > 0:
            target.append(size)
        elif j < len(ins[0]) and all(o[j] == i[j] for o, i in zip(outs, ins)):
            target.append(0)
        else:
            target.append(-1)
            inferred.append(j)
    followed = {j: s for j, s in enumerate(asked) if j in inferred and isinstance(s, SizeOf)
                and all(o[j] == shape[s.dim] for o, shape in zip(outs, lw.observed[s.value]))}
    sources = [s.value for s in followed.values()]
    like = max(sources, key=sources.count, default=None)  # the tensor most sizes come from; the first of a tie
    like_dims = [followed[j].dim if j in followed and followed[j].value == like else None for j in range(len(target))]
    if len(inferred) > 1 and like is not None:
        inferred = [j for j in inferred if like_dims[j] is None]
        target = [outs[0][j] if d is not None else t for j, (t, d) in enumerate(zip(target, like_dims))]
    else:
        like = None
    if len(inferred) > 1 or (outs[0] and 0 in outs[0] and not inferred):
        runs = {r for r, o in enumerate(outs) for j in inferred[1:] if o[j] != outs[0][j]}
        lw.varies(runs, f"its result {list(outs[0])} has several sizes that follow free dimensions")
    if like is None:
        return moved(lw, node, x, "reshape", {"shape": target})
    return moved(lw, node, x, "reshape", {"shape": target, "like_dims": like_dims}, like=like)


def _sizes(shape: Any) -> tuple:
    """view(2, 3) and view((2, 3)) alike."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


@lowers(methods=("view", "reshape"), sizes=True, keeps_dtype=True)
def _view(lw: Lowerer, node: torch.fx.Node, x: Any, *shape: Any) -> Any:
    return _reshape_observed(lw, node, x, _sizes(shape))


@lowers(functions=(torch.reshape,), sizes=True, keeps_dtype=True)
def _reshape(lw: Lowerer, node: torch.fx.Node, input: Any, shape: Any) -> Any:
    return _reshape_observed(lw, node, input, _sizes((shape,)))


@lowers(methods=("view_as", "reshape_as"), keeps_dtype=True)
def _view_as(lw: Lowerer, node: torch.fx.Node, x: Any, other: Any) -> Any:
    return _reshape_observed(lw, node, x, sizes_of(lw, other, None))


@lowers(methods=("unflatten",), sizes=True, keeps_dtype=True)
def _unflatten(lw: Lowerer, node: torch.fx.Node, x: Any, dim: int, sizes: Any) -> Any:
    return _reshape_observed(lw, node, x)


@lowers(modules=(nn.Unflatten,), keeps_dtype=True)
def _unflatten_module(lw: Lowerer, node: torch.fx.Node, m: nn.Unflatten, x: Any) -> Any:
    return _reshape_observed(lw, node, x)


@lowers(functions=(torch.flatten,), methods=("flatten",), keeps_dtype=True)
def _flatten(lw: Lowerer, node: torch.fx.Node, input: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    rank = len(lw.shape(input))
    if rank == 0:
        return _reshape_observed(lw, node, input)
    start, end = norm_dim(start_dim, rank, "start_dim"), norm_dim(end_dim, rank, "end_dim")
    if start > end:
        raise LoweringError(f"flatten's start_dim {start_dim} comes after its end_dim {end_dim}")
    if start == end:
        return input
    attrs = {"start_dim": start} if end == rank - 1 else {"start_dim": start, "end_dim": end}
    return moved(lw, node, input, "flatten", attrs)


@lowers(modules=(nn.Flatten,), keeps_dtype=True)
def _flatten_module(lw: Lowerer, node: torch.fx.Node, m: nn.Flatten, x: Any) -> Any:
    return _flatten(lw, node, x, m.start_dim, m.end_dim)


def _permute_to(lw: Lowerer, node: torch.fx.Node, x: Any, perm: list[int]) -> Any:
    return x if perm == sorted(perm) else moved(lw, node, x, "permute", {"perm": perm})


@lowers(methods=("permute",), keeps_dtype=True)
def _permute_method(lw: Lowerer, node: torch.fx.Node, x: Any, *dims: Any) -> Any:
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    return _permute(lw, node, x, dims)


@lowers(functions=(torch.permute,), keeps_dtype=True)
def _permute(lw: Lowerer, node: torch.fx.Node, input: Any, dims: Any) -> Any:
    rank = len(lw.shape(input))
    perm = [norm_dim(d, rank) for d in dims]
    if sorted(perm) != list(range(rank)):
        raise LoweringError(f"{list(dims)} is not a permutation of the {rank} dims")
    return _permute_to(lw, node, input, perm)


@lowers(functions=(torch.transpose, torch.swapaxes, torch.swapdims), methods=("transpose", "swapaxes", "swapdims"),
        keeps_dtype=True)
def _transpose(lw: Lowerer, node: torch.fx.Node, input: Any, dim0: int, dim1: int) -> Any:
    rank = len(lw.shape(input))
    perm = list(range(rank))
    a, b = norm_dim(dim0, rank), norm_dim(dim1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute_to(lw, node, input, perm)


@lowers(functions=(torch.t,), methods=("t",), keeps_dtype=True)
def _t(lw: Lowerer, node: torch.fx.Node, input: Any) -> Any:
    return _permute_to(lw, node, input, [1, 0]) if len(lw.shape(input)) == 2 else input


@lowers(functions=(torch.squeeze,), methods=("squeeze",), keeps_dtype=True)
def _squeeze(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None) -> Any:
    shape = lw.shape(input)
    # torch leaves a dim whose size is not 1 alone, so which dims go depends on the sizes: a free one
    # would be squeezed at size 1 only, so a dim squeeze may remove cannot be free
    candidates = norm_dims(dim, len(shape)) if shape else []
    changing = {r for r, s in enumerate(lw.shapes(input)) for d in candidates if s[d] != shape[d]}
    if changing:
        lw.varies(changing, "squeeze removes a dimension only where its size is 1")
    dims = [d for d in candidates if shape[d] == 1]
    return moved(lw, node, input, "squeeze", {"dims": dims}) if dims else input


@lowers(functions=(torch.unsqueeze,), methods=("unsqueeze",), keeps_dtype=True)
def _unsqueeze(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int) -> Any:
    return moved(lw, node, input, "unsqueeze", {"dim": norm_dim(dim, len(lw.shape(input)) + 1)})


# ------------------------------------------------------------ float math


@lowers(functions=(F.relu, torch.relu), methods=("relu",))
def _relu(lw: Lowerer, node: torch.fx.Node, input: Any, inplace: bool = False) -> Tensor | Quant:
    if isinstance(input, Quant):
        # A quantized tensor's relu (native models) keeps its qparams: max(q, zp), which
        # dequantize -> relu -> quantize at the same qparams computes exactly.
        y = lw.emit(node, "relu", {"x": lw.float_of(Deq(input))})
        q = lw.emit(node, "quantize_per_tensor",
                    {"x": y, "scale": np.float32(input.scale), "zero_point": np.int32(input.zero_point)},
                    {"dtype": "quint8"}, "_quantize")
        return Quant(q, input.scale, input.zero_point)
    return _float_op(lw, node, "relu", input)


@lowers(modules=(nn.ReLU,))
def _relu_module(lw: Lowerer, node: torch.fx.Node, m: nn.Module, x: Any) -> Any:
    return _relu(lw, node, x)


def unary(op: str) -> Callable:
    """The lowerings of a float32 function of one input to its one op: (as a function or method, as a module)."""

    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, inplace: bool = False) -> Tensor:
        return _float_op(lw, node, op, input)

    def lower_module(lw: Lowerer, node: torch.fx.Node, m: nn.Module, x: Any) -> Tensor:
        return _float_op(lw, node, op, x)

    return lower, lower_module


for _op, _module, _functions in (
    ("sigmoid", nn.Sigmoid, (torch.sigmoid, F.sigmoid)),
    ("tanh", nn.Tanh, (torch.tanh, F.tanh)),
    ("silu", nn.SiLU, (F.silu,)),
):
    _fn, _module_fn = unary(_op)
    lowers(functions=_functions, methods=(_op,) if _op != "silu" else ())(_fn)
    lowers(modules=(_module,))(_module_fn)


@lowers(functions=(F.gelu,))
def _gelu(lw: Lowerer, node: torch.fx.Node, input: Any, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise LoweringError(f"gelu approximate={approximate!r} is not supported ('none' or 'tanh')")
    return _float_op(lw, node, "gelu", input, {"approximate": approximate})


@lowers(modules=(nn.GELU,))
def _gelu_module(lw: Lowerer, node: torch.fx.Node, m: nn.GELU, x: Any) -> Tensor:
    return _gelu(lw, node, x, m.approximate)


def _softmax_dim(dim: Any, rank: int) -> int:
    # torch's rule for a softmax called without dim (F._get_softmax_dim): deprecated, but still what runs
    return (0 if rank in (0, 1, 3) else 1) if dim is None else norm_dim(dim, rank)


def _softmaxes(op: str) -> None:
    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None, _stacklevel: int = 3,
              dtype: Any = None) -> Tensor:
        _no_dtype(dtype)
        return _float_op(lw, node, op, input, {"dim": _softmax_dim(dim, len(lw.shape(input)))})

    def lower_torch(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any, dtype: Any = None) -> Tensor:
        return lower(lw, node, input, dim, dtype=dtype)

    def lower_module(lw: Lowerer, node: torch.fx.Node, m: nn.Module, x: Any) -> Tensor:
        return lower(lw, node, x, m.dim)

    def lower_aten(lw: Lowerer, node: torch.fx.Node, input: Any, dim: int, half_to_float: bool) -> Tensor:
        # run_decompositions()'s form: the kernel torch.softmax runs, asked for float32 from float32
        if half_to_float:
            raise LoweringError(f"_{op} with half_to_float (a float16 input) is not supported (float32 only)")
        return lower(lw, node, input, dim)

    lowers(functions=(getattr(F, op),))(lower)
    lowers(functions=(getattr(torch, op),), methods=(op,))(lower_torch)
    lowers(functions=(getattr(torch, f"_{op}"),))(lower_aten)
    lowers(modules=(nn.Softmax if op == "softmax" else nn.LogSoftmax,))(lower_module)


_softmaxes("softmax")
_softmaxes("log_softmax")


@lowers(functions=(F.layer_norm,))
def _layer_norm(lw: Lowerer, node: torch.fx.Node, input: Any, normalized_shape: Any, weight: Any = None,
                bias: Any = None, eps: float = 1e-5) -> Tensor:
    dims = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    shape = lw.shape(input)
    if not dims or list(shape[len(shape) - len(dims):]) != dims:
        raise LoweringError(f"normalized_shape {dims} is not the input's trailing shape {list(shape)}")
    ports = {
        "x": lw.float_of(input),
        "weight": None if weight is None else _array(weight, "layer_norm's weight"),
        "bias": None if bias is None else _array(bias, "layer_norm's bias"),
    }
    return Tensor(lw.emit(node, "layer_norm", ports, {"normalized_dims": len(dims), "eps": float(eps)}))


@lowers(functions=(torch.layer_norm,))
def _torch_layer_norm(lw: Lowerer, node: torch.fx.Node, input: Any, normalized_shape: Any, weight: Any = None,
                      bias: Any = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Tensor:
    return _layer_norm(lw, node, input, normalized_shape, weight, bias, eps)


@lowers(functions=(torch.native_layer_norm,))
def _native_layer_norm(lw: Lowerer, node: torch.fx.Node, input: Any, normalized_shape: Any, weight: Any, bias: Any,
                       eps: float) -> tuple:
    """What run_decompositions() makes of a layer norm (the kernel torch.layer_norm runs): (y, mean, 1 / std),
    of which the program reads y."""
    _only_first_item(node, "native_layer_norm")
    return _layer_norm(lw, node, input, normalized_shape, weight, bias, eps), None, None


@lowers(modules=(nn.LayerNorm,))
def _layer_norm_module(lw: Lowerer, node: torch.fx.Node, m: nn.LayerNorm, x: Any) -> Tensor:
    return _layer_norm(lw, node, x, m.normalized_shape, m.weight, m.bias, m.eps)


# Batch normalisation in inference: the running statistics, stored. In training (or without running statistics)
# each batch is normalised by its own mean and variance, which qrt's batch_norm does not compute.


def _only_first_item(node: torch.fx.Node, op: str) -> None:
    """Refuse a use of a decomposed normalisation's saved statistics (items 1 and 2: training's)."""
    if not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in node.users):
        raise LoweringError(f"only the output (item 0) of {op} is supported")


def _per_channel(c: Any, what: str) -> np.ndarray | None:
    """A stored float32 statistic or affine term; None for a term left None (a non-affine BatchNorm's)."""
    if c is None:
        return None
    if is_tensor(c):
        raise LoweringError(f"batch_norm's {what} is computed when the model runs; qrt's batch_norm takes stored "
                            "statistics and terms (parameters or buffers of the model)")
    return _array(c, f"batch_norm's {what}")


def _channel_terms(terms: dict[str, np.ndarray | None], channels: int) -> dict[str, np.ndarray]:
    """Each term as float32[channels] (torch checked their lengths when the model ran on the example); a missing
    weight 1 and bias 0, as torch's kernel takes them."""
    return {port: np.full(channels, 1.0 if port == "weight" else 0.0, np.float32) if a is None else a
            for port, a in terms.items()}


@lowers(functions=(F.batch_norm,))
def _batch_norm(lw: Lowerer, node: torch.fx.Node, input: Any, running_mean: Any, running_var: Any,
                weight: Any = None, bias: Any = None, training: bool = False, momentum: Any = 0.1,
                eps: float = 1e-5) -> Tensor:
    if running_mean is None or running_var is None:
        raise LoweringError("batch_norm without running statistics (track_running_stats=False) normalises each "
                            "batch by its own mean and variance, which qrt does not compute; qrt runs batch norm in "
                            "inference, with stored running_mean and running_var")
    if training:
        raise LoweringError("batch_norm with training=True normalises each batch by its own mean and variance; qrt "
                            "runs it in inference, with the running statistics (call model.eval(), or pass "
                            "training=self.training)")
    terms = {"mean": _per_channel(running_mean, "running_mean"), "var": _per_channel(running_var, "running_var"),
             "weight": _per_channel(weight, "weight"), "bias": _per_channel(bias, "bias")}
    # torch refused an input without channels at dimension 1 when the model ran on the example
    ports = {"x": lw.float_of(input), **_channel_terms(terms, lw.shape(input)[1])}
    return Tensor(lw.emit(node, "batch_norm", ports, {"eps": float(eps)}))


@lowers(functions=(torch.batch_norm,))  # also aten.batch_norm, as torch.export writes an eval BatchNorm
def _torch_batch_norm(lw: Lowerer, node: torch.fx.Node, input: Any, weight: Any, bias: Any, running_mean: Any,
                      running_var: Any, training: bool, momentum: Any, eps: float, cudnn_enabled: bool) -> Tensor:
    return _batch_norm(lw, node, input, running_mean, running_var, weight, bias, training, momentum, eps)


@lowers(functions=(torch._native_batch_norm_legit_no_training,))
def _batch_norm_no_training(lw: Lowerer, node: torch.fx.Node, input: Any, weight: Any, bias: Any,
                            running_mean: Any, running_var: Any, momentum: Any, eps: float) -> tuple:
    """What run_decompositions() makes of an eval BatchNorm (a saved .pt2): (y, saved mean, saved 1 / std), of
    which the program reads y."""
    _only_first_item(node, "_native_batch_norm_legit_no_training")
    return _batch_norm(lw, node, input, running_mean, running_var, weight, bias, False, momentum, eps), None, None


@lowers(modules=(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d))
def _batch_norm_module(lw: Lowerer, node: torch.fx.Node, m: nn.modules.batchnorm._BatchNorm, x: Any) -> Tensor:
    # as the module's forward: in training, or without running statistics, it uses the batch's
    return _batch_norm(lw, node, x, m.running_mean, m.running_var, m.weight, m.bias, m.training, m.momentum, m.eps)


def _reductions(op: str) -> None:
    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None, keepdim: bool = False, *,
              dtype: Any = None) -> Tensor:
        _no_dtype(dtype)
        dims = norm_dims(dim, len(lw.shape(input)))
        return _float_op(lw, node, op, input, {"dims": dims, "keepdim": bool(keepdim)})

    lowers(functions=(getattr(torch, op),), methods=(op,))(lower)


_reductions("mean")
_reductions("sum")


@lowers(functions=(torch.amax,), methods=("amax",))
def _amax(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    return _float_op(lw, node, "amax", input, {"dims": norm_dims(dim, len(lw.shape(input))), "keepdim": bool(keepdim)})


def extremum(lw: Lowerer, node: torch.fx.Node, a: Any, b: Any, comparison: str) -> Tensor:
    """torch.minimum (comparison "lt") or maximum ("gt") of integers: where(b < a, b, a), exact. Floats are
    refused: torch's NaN and signed-zero rules there are not one comparison."""
    x, y = operands(lw, node, a, b)
    if x.dtype != y.dtype:  # int32 against int64: int64, as torch promotes
        x, y = cast(lw, node, x, "int64", "_a"), cast(lw, node, y, "int64", "_b")
    if x.dtype not in ("int32", "int64"):
        what = "minimum" if comparison == "lt" else "maximum"
        raise LoweringError(f"an elementwise {what} of {x.dtype} values is not supported (integers only)")
    pick = lw.emit(node, comparison, {"a": y.name, "b": x.name}, suffix="_pick")
    return Tensor(lw.emit(node, "where", {"condition": pick, "a": y.name, "b": x.name}), x.dtype)


def _reads_values_only(node: torch.fx.Node) -> bool:
    """Whether every reader of torch.max(x, dim)'s (values, indices) takes the values: [0] or .values (an indices
    item nothing reads, values, _ = ..., aside)."""
    return all((u.target is operator.getitem and (u.args[1] == 0 or not u.users))
               or (u.target is getattr and u.args[1] == "values") for u in node.users)


@lowers(functions=(torch.max,), methods=("max",))
def _max(lw: Lowerer, node: torch.fx.Node, input: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """torch.max(x): the maximum of all of x; torch.max(x, dim) (max pooling over time): (values, indices), of which
    qrt computes the values (amax)."""
    if not isinstance(dim, (int, type(None))) or isinstance(dim, bool):  # torch.max(a, b): elementwise
        return extremum(lw, node, input, dim, "gt")
    rank = len(lw.shape(input))
    if dim is None:
        return _float_op(lw, node, "amax", input, {"dims": list(range(rank)), "keepdim": False})
    if not _reads_values_only(node):
        raise LoweringError("the indices of torch.max(x, dim) are not supported: qrt computes its values (torch.amax)")
    return _float_op(lw, node, "amax", input, {"dims": [norm_dim(dim, rank)], "keepdim": bool(keepdim)}), None


# ------------------------------------------------------------ elementwise arithmetic

_PY_NUMBERS = (int, float, bool)


def _operand(lw: Lowerer, v: Any) -> str | np.ndarray:
    """A value name, or an array to store (a Python number as a [] float32, as torch computes with it)."""
    if isinstance(v, _PY_NUMBERS):
        return np.asarray(np.float32(v))
    if isinstance(v, Const):
        t = v.value
        if isinstance(t, torch.Tensor) and (t.dtype == torch.float32 or (t.dim() == 0 and t.is_floating_point())):
            return t.detach().to(torch.float32).numpy().copy()
        raise LoweringError(f"an operand {type(t).__name__} of dtype {getattr(t, 'dtype', '?')} (float32 only)")
    if isinstance(v, Tensor) and v.dtype != "float32":
        raise LoweringError(f"arithmetic on {v.dtype} tensors is not supported (qrt's arithmetic is float32)")
    return lw.float_of(v)


_IN_PLACE = (operator.iadd, operator.isub, operator.imul, operator.itruediv)  # y += b: the result in y's dtype


def _other_numbers(v: Any) -> bool:
    """Whether v is a run-time or constant tensor of integers or bool."""
    if isinstance(v, Tensor):
        return v.dtype != "float32"
    return isinstance(v, Const) and isinstance(v.value, torch.Tensor) and not v.value.is_floating_point()


_KINDS = ("bool", "integer", "float32")  # torch's promotion order among what qrt computes with


def value_kind(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return dtype_kind(dtype_name(v.dtype))
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "integer" if isinstance(v, int) else "float32"
    return dtype_kind(dtype_of(v))


def _as_kind(lw: Lowerer, node: torch.fx.Node, v: Any, kind: str, suffix: str) -> Tensor:
    """v (a run-time value, a constant or a Python number) as a run-time value of kind."""
    if isinstance(v, (bool, int, float)):  # a number takes the operation's kind, as in torch
        if kind == "integer":
            v = torch.tensor(int(v), dtype=torch.int32 if -(2**31) <= v < 2**31 else torch.int64)
        else:
            v = torch.tensor(v, dtype=TORCH_DTYPES[kind])
    if isinstance(v, torch.Tensor):
        v = stored(lw, node, v, suffix)
    elif not isinstance(v, Tensor):
        v = Tensor(lw.float_of(v))
    if kind == "integer":  # int32 and int64 mix; bool against an integer (mask == 0) counts as one, as in torch
        return cast(lw, node, v, "int32", suffix + "_cast") if v.dtype == "bool" else v
    return cast(lw, node, v, kind, suffix + "_cast")


def operands(lw: Lowerer, node: torch.fx.Node, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    """Two operands as run-time values of one kind, promoted as torch promotes them: the higher kind of the
    two (bool < integer < float32), so an int64 tensor against 0.5 compares in float32, against 0 in
    integers."""
    values = [v.value if isinstance(v, Const) else v for v in (a, b)]
    kind = max((value_kind(v) for v in values), key=_KINDS.index)
    return _as_kind(lw, node, values[0], kind, "_a"), _as_kind(lw, node, values[1], kind, "_b")


def _example(lw: Lowerer, v: Any) -> Any:
    """What torch.result_type needs of an operand: its dtype and whether it has dimensions."""
    if isinstance(v, (bool, int, float, torch.Tensor)):
        return v
    return torch.zeros((1,) if lw.shape(v) else (), dtype=TORCH_DTYPES[dtype_of(v)])


def promoted_arithmetic(lw: Lowerer, node: torch.fx.Node, op: str, a: Any, b: Any, in_place: bool = False
                        ) -> Tensor:
    """add, sub, mul or div where an operand holds integers or bool, in the dtype torch's promotion gives:
    float32 (the integers converted first, as torch converts them; always for div, torch's true division)
    or integers, both operands cast to it first, exact modulo 2**bits (add_int, sub_int, mul_int). In place
    (y += b), in y's dtype, as torch writes it."""
    values = [v.value if isinstance(v, Const) else v for v in (a, b)]
    result = torch.result_type(*(_example(lw, v) for v in values))
    if op == "div" and not result.is_floating_point:
        result = torch.float32
    name = dtype_name(result)
    if in_place and dtype_of(a) != name:
        if _KINDS.index(dtype_kind(name)) > _KINDS.index(dtype_kind(dtype_of(a))):
            raise LoweringError(f"{op} in place of a {dtype_of(a)} tensor with a {name} result (torch refuses it)")
        name = dtype_of(a)  # an int32 y += int64 b: the low 32 bits, as torch casts the sum back
    if name == "bool":
        raise LoweringError(f"{op} of bool tensors (torch's is logic there; qrt's arithmetic is on numbers)")
    x, y = (_as_kind(lw, node, v, dtype_kind(name), suffix) for v, suffix in zip(values, ("_a", "_b")))
    if name == "float32":
        return Tensor(lw.emit(node, op, {"a": x.name, "b": y.name}))
    # in torch's dtype from the start: an int32 against an int64 constant (stored as int32) sums in int64, and an
    # int64 scalar against an int32 tensor in int32 (the low 32 bits of the int64 sum). Against an int64 operand
    # add_int widens an int32 one itself.
    widens = name == "int64" and "int64" in (x.dtype, y.dtype)
    x, y = (v if widens and v.dtype != "bool" else cast(lw, node, v, name, suffix)
            for v, suffix in zip((x, y), ("_a", "_b")))
    return Tensor(lw.emit(node, f"{op}_int", {"a": x.name, "b": y.name}), name)


def _binary(op: str, fold: Callable[[Any, Any], Any]) -> Callable:
    def lower(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any, *, alpha: Any = 1,
              rounding_mode: Any = None) -> Any:
        if not is_tensor(input) and not is_tensor(other) and not isinstance(input, Const) \
                and not isinstance(other, Const):
            return fold(input, other)  # sizes and other Python numbers
        lw.require_static(node)
        if op in ("add", "sub") and isinstance(input, Tensor) and input.dtype in ("int32", "int64") \
                and type(other) is int and other == 0:
            return input  # integers + 0 (transformers' arange(n) + offset): the integers themselves (+ 0.0: floats)
        if alpha != 1:
            raise LoweringError(f"{op} with alpha={alpha} is not supported")
        if rounding_mode is not None:
            raise LoweringError(f"div with rounding_mode={rounding_mode!r} is not supported")
        if _other_numbers(input) or _other_numbers(other):
            return promoted_arithmetic(lw, node, op, input, other, in_place=node.target in _IN_PLACE)
        a, b = _operand(lw, input), _operand(lw, other)
        if not isinstance(a, str) and not isinstance(b, str):
            raise LoweringError(f"{op} of two constants")
        if op == "div" and node.target is operator.truediv and isinstance(input, _PY_NUMBERS):
            # c / x is torch's Tensor.__rtruediv__: reciprocal(x) * c, two roundings
            r = lw.emit(node, "div", {"a": np.asarray(np.float32(1)), "b": b})
            return Tensor(lw.emit(node, "mul", {"a": r, "b": a}))
        return Tensor(lw.emit(node, op, {"a": a, "b": b}))

    return lower


for _op, _fold, _functions, _methods in (
    ("add", operator.add, (operator.add, operator.iadd, torch.add), ("add",)),
    ("sub", operator.sub, (operator.sub, operator.isub, torch.sub, torch.subtract), ("sub", "subtract")),
    ("mul", operator.mul, (operator.mul, operator.imul, torch.mul, torch.multiply), ("mul", "multiply")),
    ("div", operator.truediv, (operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide),
     ("div", "divide", "true_divide")),
):
    lowers(functions=_functions, methods=_methods, sizes=True)(_binary(_op, _fold))


@lowers(functions=(operator.floordiv,), sizes=True)
def _floordiv(lw: Lowerer, node: torch.fx.Node, a: Any, b: Any) -> Any:
    if is_tensor(a) or is_tensor(b):
        raise LoweringError("floor division of tensors is not supported")
    return a // b


@lowers(functions=(operator.neg, torch.neg), methods=("neg",), sizes=True)
def _neg(lw: Lowerer, node: torch.fx.Node, input: Any) -> Any:
    if not is_tensor(input):
        return -input
    if _other_numbers(input):
        return _binary("mul", operator.mul)(lw, node, input, -1)
    return Tensor(lw.emit(node, "mul", {"a": _operand(lw, input), "b": np.asarray(np.float32(-1))}))


# ------------------------------------------------------------ matrix products and attention


def _matrix(lw: Lowerer, v: Any, what: str) -> str | np.ndarray:
    """A float32 operand of rank >= 2 (a value name, or a parameter to store)."""
    if isinstance(v, _PY_NUMBERS):
        raise LoweringError(f"{what} must be a tensor, got a {type(v).__name__}")
    operand = _operand(lw, v)
    rank = len(lw.shape(v))
    if rank < 2:
        raise LoweringError(f"{what} has rank {rank}: matrix products of vectors are not supported (rank >= 2)")
    return operand


@lowers(functions=(torch.matmul, operator.matmul, torch.bmm, torch.mm), methods=("matmul", "bmm", "mm"))
def _matmul(lw: Lowerer, node: torch.fx.Node, input: Any, other: Any, *, out: Any = None) -> Tensor:
    a, b = _matrix(lw, input, "matmul's first operand"), _matrix(lw, other, "matmul's second operand")
    if not isinstance(a, str) and not isinstance(b, str):
        raise LoweringError("matmul of two constants")
    return Tensor(lw.emit(node, "matmul", {"a": a, "b": b}))


def _attention_mask(lw: Lowerer, mask: Any) -> str | np.ndarray:
    """A bool or float32 mask: a run-time value as it is; a stored bool one as the float32 mask 0 / -inf, which
    gives the same scores (t + 0 = t, t + -inf = -inf) and can be stored."""
    if isinstance(mask, Const) and isinstance(mask.value, torch.Tensor) and mask.value.dtype == torch.bool:
        keep = mask.value.detach().numpy()
        return np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    if isinstance(mask, Tensor) and mask.dtype == "bool":
        return mask.name
    return _operand(lw, mask)


@lowers(functions=(F.scaled_dot_product_attention,))
def _attention(lw: Lowerer, node: torch.fx.Node, query: Any, key: Any, value: Any, attn_mask: Any = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Tensor:
    if dropout_p != 0.0:
        raise LoweringError(f"scaled_dot_product_attention with dropout_p={dropout_p} is not supported (0: inference)")
    if enable_gqa:
        raise LoweringError("scaled_dot_product_attention with enable_gqa=True is not supported")
    if scale is not None and not isinstance(scale, (int, float)):
        raise LoweringError(f"scaled_dot_product_attention's scale must be a number, got {type(scale).__name__}")
    ports = {"q": lw.float_of(query), "k": lw.float_of(key), "v": lw.float_of(value)}
    if attn_mask is not None:
        ports["mask"] = _attention_mask(lw, attn_mask)
    attrs = {"scale": None if scale is None else float(scale), "is_causal": bool(is_causal)}
    return Tensor(lw.emit(node, "attention", ports, attrs))


# ------------------------------------------------------------ embeddings


def emit_embedding(
    lw: Lowerer, node: torch.fx.Node, layer: EmbeddingLayer, indices: Any, offsets: Any = None
) -> Tensor:
    ports: dict[str, Any] = {"indices": lw.index_of(indices, "indices"), **layer.ports()}
    attrs: dict[str, Any] = {"bits": layer.bits}
    if layer.bits == 4:
        # torch's 4-bit bag returns the padded width (rows of an odd dim gain a column): as it ran
        attrs["dim"] = lw.node_shapes(node)[0][-1]
    if layer.pattern == "embedding_bag":
        if layer.include_last_offset:
            raise LoweringError("include_last_offset=True is not supported")
        attrs["mode"] = layer.mode
        if offsets is not None:
            ports["offsets"] = lw.index_of(offsets, "offsets")
    return Tensor(lw.emit(node, layer.pattern, ports, attrs))


def _float_table(weight: Any, what: str, pattern: str, **extra: Any) -> EmbeddingLayer:
    w = _array(weight, what)
    if w.ndim != 2:
        raise LoweringError(f"{what} must be 2-D [num_embeddings, embedding_dim], got shape {list(w.shape)}")
    return EmbeddingLayer(pattern, 32, w, int(w.shape[1]), **extra)


def _plain_lookup(max_norm: Any, padding_idx: Any = None, bag: bool = False) -> None:
    if max_norm is not None:
        raise LoweringError("max_norm is not supported (torch renormalises the table's rows on every lookup)")
    if bag and padding_idx is not None:
        raise LoweringError("an EmbeddingBag with padding_idx is not supported")


@lowers(modules=(nn.Embedding,), index_args=((0, "input"),))
def _embedding_module(lw: Lowerer, node: torch.fx.Node, m: nn.Embedding, input: Any) -> Tensor:
    _plain_lookup(m.max_norm)
    out = emit_embedding(lw, node, _float_table(m.weight, "the embedding's weight", "embedding"), input)
    lw.layers[str(node.target)] = out.name
    return out


@lowers(modules=(nn.EmbeddingBag,), index_args=((0, "input"), (1, "offsets")))
def _embedding_bag_module(lw: Lowerer, node: torch.fx.Node, m: nn.EmbeddingBag, input: Any, offsets: Any = None,
                          per_sample_weights: Any = None) -> Tensor:
    _plain_lookup(m.max_norm, m.padding_idx, bag=True)
    if per_sample_weights is not None:
        raise LoweringError("per_sample_weights is not supported")
    table = _float_table(m.weight, "the embedding bag's weight", "embedding_bag", mode=m.mode,
                         include_last_offset=m.include_last_offset)
    out = emit_embedding(lw, node, table, input, offsets)
    lw.layers[str(node.target)] = out.name
    return out


@lowers(functions=(F.embedding,), index_args=((0, "input"),))
def _embedding(lw: Lowerer, node: torch.fx.Node, input: Any, weight: Any, padding_idx: Any = None,
               max_norm: Any = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Tensor:
    _plain_lookup(max_norm)
    return emit_embedding(lw, node, _float_table(weight, "F.embedding's weight", "embedding"), input)


@lowers(functions=(F.embedding_bag,), index_args=((0, "input"), (2, "offsets")))
def _embedding_bag(lw: Lowerer, node: torch.fx.Node, input: Any, weight: Any, offsets: Any = None,
                   max_norm: Any = None, norm_type: float = 2, scale_grad_by_freq: bool = False, mode: str = "mean",
                   sparse: bool = False, per_sample_weights: Any = None, include_last_offset: bool = False,
                   padding_idx: Any = None) -> Tensor:
    _plain_lookup(max_norm, padding_idx, bag=True)
    if per_sample_weights is not None:
        raise LoweringError("per_sample_weights is not supported")
    table = _float_table(weight, "F.embedding_bag's weight", "embedding_bag", mode=mode,
                         include_last_offset=include_last_offset)
    return emit_embedding(lw, node, table, input, offsets)


@lowers(patterns=("embedding",), index_args=((0, "indices"),))
def _quantized_embedding(lw: Lowerer, node: torch.fx.Node, layer: EmbeddingLayer, indices: Any) -> Tensor:
    return emit_embedding(lw, node, layer, indices)


@lowers(patterns=("embedding_bag",), index_args=((0, "indices"), (1, "offsets")))
def _quantized_embedding_bag(lw: Lowerer, node: torch.fx.Node, layer: EmbeddingLayer, indices: Any,
                             offsets: Any = None, per_sample_weights: Any = None,
                             compressed_indices_mapping: Any = None) -> Tensor:
    if per_sample_weights is not None or compressed_indices_mapping is not None:
        raise LoweringError("per_sample_weights and compressed_indices_mapping are not supported")
    return emit_embedding(lw, node, layer, indices, offsets)


# ------------------------------------------------------------ linear layers


def _emit_linear_float(lw: Lowerer, node: torch.fx.Node, x: Any, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> str:
    ports = {
        "x": lw.float_of(x),
        "weight": weight.detach().float().numpy().copy(),
        "bias": None if bias is None else bias.detach().float().numpy().copy(),
    }
    return lw.emit(node, "linear_float", ports)


def _linear_float(lw: Lowerer, node: torch.fx.Node, module: nn.Module, x: Any) -> Tensor:
    """A Linear the rules keep in float (or a float Linear + ReLU fused by prepare_fx)."""
    linear = module if isinstance(module, nn.Linear) else module[0]
    y = _emit_linear_float(lw, node, x, linear.weight, linear.bias)
    if not isinstance(module, nn.Linear):
        y = lw.emit(node, "relu", {"x": y}, suffix="_relu")
    # Recorded so that `qrt compare` can match qrt values to PyTorch modules layer by layer.
    lw.layers[str(node.target)] = y
    return Tensor(y)


lowers(modules=(nn.Linear,))(_linear_float)
_FUSED_LINEAR_RELU = Lowering(_linear_float)


@lowers(functions=(F.linear,))
def _functional_linear(lw: Lowerer, node: torch.fx.Node, input: Any, weight: Any, bias: Any = None) -> Tensor:
    """F.linear on the model's own weight and bias: linear_float, as the export front end lowers it (the rules
    quantize Linear modules)."""
    if not isinstance(weight, Const) or not (bias is None or isinstance(bias, Const)):
        raise LoweringError("F.linear's weight and bias must be the model's own tensors, not computed at run time")
    return Tensor(_emit_linear_float(lw, node, input, weight.value, None if bias is None else bias.value))


@lowers(patterns=("linear", "linear_relu"))
def _linear(lw: Lowerer, node: torch.fx.Node, layer: LinearLayer, x: Any) -> Any:
    """Linear (+ReLU): dynamic -> linear_dynamic [+ relu]; static -> linear(relu)."""
    if layer.mode == "static" or (layer.mode is None and isinstance(x, Deq)):
        q = x.q if isinstance(x, Deq) else x
        if not isinstance(q, Quant):
            raise LoweringError("a static quantized Linear needs a quantized input")
        pending = PendingLinear(lw.unique(node.name), layer, q)
        if layer.mode == "static":
            scale, zp = layer.output_qparams
            return emit_static_linear(lw, pending, scale, zp)
        return pending
    if layer.mode == "dynamic" or isinstance(x, DynDeq):
        ports = {"x": lw.float_of(x), **layer.weight.ports(), "bias": layer.bias}
        # x86/fbgemm's dynamic Linear always reduces the activation range (NUMERICS.md); qnnpack ignores it;
        # pt2e's does not reduce it
        reduce_range = not isinstance(x, DynDeq) or x.reduce_range
        y = lw.emit(node, "linear_dynamic", ports, {"reduce_range": reduce_range, **lw.engine_attrs})
        if layer.relu:
            y = lw.emit(node, "relu", {"x": y}, suffix="_relu")
        return Tensor(y)
    raise LoweringError(
        "a quantized Linear whose input is neither statically nor dynamically quantized "
        "(weight-only quantization) is not supported"
    )


# ------------------------------------------------------------ recurrent layers


def _states(lw: Lowerer, hx: Any, names: tuple[str, ...]) -> dict[str, str]:
    """A recurrent module's state argument: one tensor, or a tuple (h, c) for an LSTM."""
    if len(names) == 1:
        return {names[0]: lw.float_of(hx)}
    if not isinstance(hx, (tuple, list)) or len(hx) != len(names):
        raise LoweringError(f"the state must be a tuple ({', '.join(names)})")
    return {n: lw.float_of(v) for n, v in zip(names, hx)}


def emit_cell(lw: Lowerer, node: torch.fx.Node, op: str, kind: str, input: Any, hx: Any, weights: dict[str, Any],
              attrs: dict[str, Any]) -> str | list[str]:
    """A recurrent cell's node (op, of kind rnn, lstm or gru): x, the state (h, or h and c), the weights; the
    dynamic and the float cells alike. Returns emit's output name(s)."""
    if hx is None:
        # qrt cells take the state as an input; a streaming model carries it from step to step.
        raise LoweringError(f"call the {kind.upper()} cell with an explicit state")
    states = ("h", "c") if kind == "lstm" else ("h",)
    return lw.emit(node, op, {"x": lw.float_of(input), **_states(lw, hx, states), **weights}, attrs)


def emit_sequence(lw: Lowerer, node: torch.fx.Node, op: str, kind: str, input: Any, hx: Any,
                  weights: dict[str, Any], attrs: dict[str, Any]) -> tuple[Tensor, Any]:
    """A recurrent sequence's node (op, of kind rnn, lstm or gru): x, the initial state where given, the weights
    of every layer and direction; the dynamic and the float sequences alike. Returns (y, h_n) or (y, (h_n, c_n))
    as torch does."""
    ports: dict[str, Any] = {"x": lw.float_of(input)}
    if hx is not None:
        ports.update(_states(lw, hx, ("h0", "c0") if kind == "lstm" else ("h0",)))
    y, *final = (Tensor(o) for o in lw.emit(node, op, {**ports, **weights}, attrs))
    return (y, tuple(final) if kind == "lstm" else final[0])


@lowers(patterns=("rnn_cell", "lstm_cell", "gru_cell"))
def _cell(lw: Lowerer, node: torch.fx.Node, layer: RNNCellLayer, input: Any, hx: Any = None) -> Any:
    """RNNCell / LSTMCell / GRUCell -> *_cell_dynamic: both linears quantize their own input per call."""
    kind = layer.pattern.removesuffix("_cell")
    attrs: dict[str, Any] = {"reduce_range": True, **lw.engine_attrs}
    if kind == "rnn":
        attrs["nonlinearity"] = layer.nonlinearity
    out = emit_cell(lw, node, f"{kind}_cell_dynamic", kind, input, hx, layer.ports(), attrs)
    if kind == "lstm":
        return tuple(Tensor(o) for o in out)
    return Tensor(out)


def check_layers(n: int) -> None:
    """Refuse a stack qrt's sequence ops cannot hold (its file would be refused, naming ports, as it is written)."""
    if n > MAX_LAYERS:
        raise LoweringError(f"a recurrent module of {n} layers: qrt's sequence ops run 1 to {MAX_LAYERS}")


@lowers(patterns=("rnn", "lstm", "gru"))
def _sequence(lw: Lowerer, node: torch.fx.Node, layer: SequenceLayer, input: Any, hx: Any = None) -> Any:
    """nn.RNN / LSTM / GRU -> rnn/lstm/gru_dynamic; returns (y, h_n) or (y, (h_n, c_n)) as torch does."""
    kind = layer.pattern
    check_layers(layer.num_layers)
    dirs = 2 if layer.bidirectional else 1
    weights: dict[str, Any] = {}
    for i, direction in enumerate(layer.directions):
        weights.update(direction.ports(layer_prefix(i // dirs, i % dirs == 1)))
    attrs: dict[str, Any] = {
        "num_layers": layer.num_layers,
        "bidirectional": layer.bidirectional,
        "batch_first": layer.batch_first,
        "reduce_range": True,
        **lw.engine_attrs,
    }
    if kind == "rnn":
        attrs["nonlinearity"] = layer.nonlinearity
    return emit_sequence(lw, node, f"{kind}_dynamic", kind, input, hx, weights, attrs)


# registering their lowerings: recurrent modules kept in float; comparisons, masks, casts, norms
