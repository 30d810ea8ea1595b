"""matmul and attention on the CPU (qrt/_attention.pxi over qrt/kernels/attention_body.h).

The batch dimensions broadcast as numpy's: each operand's batches become element offsets into its own
contiguous data (a broadcast operand is read in place, never copied), and the kernels run one [m, k] @ [k, n]
product, or one attention head, per output batch. Each output is a fixed fma chain, so the same bits on every
CPU, build and thread count (docs/NUMERICS.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import numpy as np

from .. import _kernels as K
from .. import tensor_moves
from ..graph import Node
from .types import Prepare, Step


def _flat(a: np.ndarray) -> np.ndarray:
    """a's elements in C order as one dimension, copied only where a is not contiguous."""
    return tensor_moves.contiguous_of(np, a).reshape(-1)


def broadcast_batch(named: Mapping[str, tuple]) -> tuple:
    """numpy's broadcast of the named batch shapes, or ValueError naming them."""
    try:
        return np.broadcast_shapes(*named.values())
    except ValueError:
        described = ", ".join(f"{n} {list(b)}" for n, b in named.items())
        raise ValueError(f"batch dimensions {described} do not broadcast") from None


def batch_offsets(batch: tuple, out: tuple, block: int) -> np.ndarray:
    """Element offset of each of the `out` batches' `block`-element matrix in an operand of batch shape `batch`
    (broadcast to `out`), in row-major order of `out`."""
    index = np.arange(math.prod(batch), dtype=np.int64).reshape(batch)
    return np.ascontiguousarray(np.broadcast_to(index, out).reshape(-1)) * block


class Product(NamedTuple):
    """A matmul's sizes: y [*batch, m, n], and where each output batch's a and b start."""

    batch: tuple
    m: int
    k: int
    n: int
    a_off: np.ndarray
    b_off: np.ndarray


def product(a: tuple, b: tuple) -> Product:
    """The run-time checks of a matmul of shapes a and b (ValueError naming them), and its sizes."""
    (m, k), (k2, n) = a[-2:], b[-2:]
    if k != k2:
        raise ValueError(f"a {list(a)} and b {list(b)} do not multiply: a has {k} columns, b {k2} rows")
    batch = broadcast_batch({"a": a[:-2], "b": b[:-2]})
    return Product(batch, m, k, n, batch_offsets(a[:-2], batch, m * k), batch_offsets(b[:-2], batch, k * n))


class Heads(NamedTuple):
    """An attention's sizes: y [*batch, lq, ev]; where each output batch's q, k, v (and mask) start; the mask's
    rows `stride` apart (0: one row for all), after `repeat` (its one value per row repeated for all s keys)."""

    batch: tuple
    lq: int
    s: int
    e: int
    ev: int
    q_off: np.ndarray
    k_off: np.ndarray
    v_off: np.ndarray
    m_off: np.ndarray | None
    stride: int
    repeat: tuple | None


def heads(q: tuple, k: tuple, v: tuple, mask: tuple | None) -> Heads:
    """The run-time checks of an attention of these shapes (ValueError naming them), and its sizes; a mask of
    rank 0 is read as [1]."""
    (lq, e), (s, e2), (s2, ev) = q[-2:], k[-2:], v[-2:]
    if e != e2:
        raise ValueError(f"q {list(q)} and k {list(k)} must have the same last dimension (E)")
    if s != s2:
        raise ValueError(f"k {list(k)} and v {list(v)} must have the same number of keys")
    batch = broadcast_batch({"q": q[:-2], "k": k[:-2], "v": v[:-2]})
    m_off, stride, repeat = None, 0, None
    if mask is not None:
        mask = mask or (1,)
        scores = batch + (lq, s)
        if len(mask) > len(scores) or any(d not in (1, w) for d, w in zip(mask[::-1], scores[::-1])):
            raise ValueError(f"mask {list(mask)} does not broadcast to the scores {list(scores)}")
        if mask[-1] != s:
            repeat = mask = mask[:-1] + (s,)
        rows = mask[-2] if len(mask) >= 2 else 1
        stride = s if rows == lq and lq != 1 else 0
        m_off = batch_offsets(mask[:-2], batch, rows * s)
    return Heads(batch, lq, s, e, ev, batch_offsets(q[:-2], batch, lq * e), batch_offsets(k[:-2], batch, s * e),
                 batch_offsets(v[:-2], batch, s * ev), m_off, stride, repeat)


def default_scale(e: int) -> np.float32:
    """torch's default: 1 / sqrt(E) in double (sdp::calculate_scale), rounded to float32 as its CPU kernel takes it."""
    return np.float32(1.0 / math.sqrt(e)) if e > 0 else np.float32(math.inf)


def last_shapes(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn of shapes, remembering its last answer: a model runs at one set of shapes call after call, and the
    offsets cost more than a small call's kernel (30 us for one attention's)."""
    last: list = [(None, None)]

    def cached(*shapes: Any) -> Any:
        key, value = last[0]  # the pair as one object: another thread may replace it, never half of it
        if key != shapes:
            value = fn(*shapes)
            last[0] = (shapes, value)
        return value

    return cached


def _matmul(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel, sizes = K.AttentionOps(), last_shapes(product)

    def step(a, b):
        p = sizes(a.shape, b.shape)
        y = np.empty(p.batch + (p.m, p.n), np.float32)
        kernel.matmul(_flat(a), p.a_off, _flat(b), p.b_off,
                      y.reshape(math.prod(p.batch), p.m, p.n), p.k)  # -1 is no size where m or n is 0
        return (y,)

    step.native = lambda a, b: native_matmul(kernel, a, b)  # the execution plan's step at given shapes (qrt/plan.py)
    return step


def native_matmul(kernel: Any, a: tuple, b: tuple) -> Any:
    """The execution plan's step of a matmul of contiguous operands of shapes a and b, a K.MatmulStep; None where
    the per-node step must run (shapes it rejects, an empty output)."""
    try:
        p = product(a, b)
    except ValueError:
        return None
    if math.prod(p.batch) * p.m * p.n == 0:
        return None
    return K.MatmulStep(kernel, p.m, p.k, p.n, p.a_off, math.prod(a), p.b_off, math.prod(b))


def _attention(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel, scale, causal, sizes = K.AttentionOps(), node.attrs["scale"], node.attrs["is_causal"], last_shapes(heads)

    def step(q, k, v, mask=None):
        h = sizes(q.shape, k.shape, v.shape, None if mask is None else mask.shape)
        if mask is not None:
            mask = tensor_moves.contiguous_of(np, np.broadcast_to(mask, h.repeat) if h.repeat else mask)
        y = np.empty(h.batch + (h.lq, h.ev), np.float32)
        kernel.attention(
            _flat(q), h.q_off, _flat(k), h.k_off,
            _flat(v), h.v_off, mask, h.m_off, h.stride, default_scale(h.e) if scale is None else np.float32(scale),
            causal, y.reshape(math.prod(h.batch), h.lq, h.ev), h.s, h.e,
        )
        return (y,)

    # the execution plan's step at given shapes (qrt/plan.py)
    step.native = lambda q, k, v, mask, between, columns=(None,) * 3: native_attention(node, kernel, q, k, v, mask,
                                                                                       between, columns)
    return step


def _operand(shape: tuple, heads_between: bool, batch: tuple, columns: tuple[int, ...] | None = None
             ) -> tuple[np.ndarray, int, int]:
    """(element offset of each output batch's matrix, row stride, elements) of an operand the op sees as
    [*b, rows, width]: a contiguous array, or (heads_between) the [B, H, rows, width] permute (0, 2, 1, 3) of a
    contiguous [B, rows, H, width] array, read in place. columns (offset, row width[, head stride]): that array is
    the columns from offset on of a wider one whose rows lie `row width` apart (a plan's linears run as one
    product), each head's `width` columns `head stride` apart (width: side by side)."""
    *b, rows, width = shape
    offset, ld, *head_stride = columns or (0, b[1] * width if heads_between else width)
    if not heads_between:
        return batch_offsets(tuple(b), batch, rows * ld) + offset, ld, math.prod(b) * rows * ld
    n, h = b
    step = head_stride[0] if head_stride else width
    index = np.arange(n, dtype=np.int64)[:, None] * (rows * ld) + np.arange(h, dtype=np.int64) * step + offset
    return np.ascontiguousarray(np.broadcast_to(index, batch).reshape(-1)), ld, n * rows * ld


def native_attention(node: Node, kernel: Any, q: tuple, k: tuple, v: tuple, mask: np.ndarray | None,
                     heads_between: tuple[bool, bool, bool, bool],
                     columns: tuple[tuple[int, ...] | None, ...] = (None,) * 3) -> Any:
    """The execution plan's step of an attention node at these shapes (q, k, v as the op sees them), a
    K.AttentionStep; heads_between says which of q, k, v and y are the permute (0, 2, 1, 3) of a contiguous
    [B, L, H, E] array (read, or for y written, in place: no copy between the linears' layout and the
    heads'); columns: for each of q, k, v, None or where that array lies in a wider one (_operand). None where
    the per-node step must run: shapes it rejects, a mask it would broadcast over the keys or of another dtype
    than bool or float32."""
    try:
        h = heads(q, k, v, None if mask is None else mask.shape)
    except ValueError:
        return None
    if h.repeat or (mask is not None and mask.dtype not in (np.bool_, np.float32)):
        return None
    scale = node.attrs["scale"]
    scale = default_scale(h.e) if scale is None else np.float32(scale)
    operands = tuple(_operand(s, p, h.batch, c) for s, p, c in zip((q, k, v), heads_between, columns))
    y = _operand(h.batch + (h.lq, h.ev), heads_between[3], h.batch)
    masked = None if mask is None else (h.m_off, h.stride, max(mask.size, 1), mask.itemsize)
    return K.AttentionStep(kernel, (math.prod(h.batch), h.lq, h.s, h.e, h.ev), operands, masked, y, float(scale),
                           node.attrs["is_causal"])


IMPLEMENTATIONS: dict[str, Prepare] = {"matmul": _matmul, "attention": _attention}
