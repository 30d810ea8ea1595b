"""matmul and attention on the CPU (qrt/_attention.pxi over qrt/kernels/attention_body.h).

The batch dimensions broadcast as numpy's: each operand's batches become element offsets into its own
contiguous data (a broadcast operand is read in place, never copied), and the kernels run one [m, k] @ [k, n]
product, or one attention head, per output batch. Each output is a fixed fma chain, so the same bits on every
CPU, build and thread count (docs/NUMERICS.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .. import _kernels as K
from ..graph import Node
from .types import Prepare, Step


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


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


def _matmul(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel = K.AttentionOps()

    def step(a, b):
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise ValueError(f"a {list(a.shape)} and b {list(b.shape)} do not multiply: a has {k} columns, b {k2} rows")
        batch = broadcast_batch({"a": a.shape[:-2], "b": b.shape[:-2]})
        y = np.empty(batch + (m, n), np.float32)
        kernel.matmul(_contiguous(a).reshape(-1), batch_offsets(a.shape[:-2], batch, m * k),
                      _contiguous(b).reshape(-1), batch_offsets(b.shape[:-2], batch, k * n),
                      y.reshape(-1, m, n), k)
        return (y,)

    return step


def default_scale(e: int) -> np.float32:
    """torch's default: 1 / sqrt(E) in double (sdp::calculate_scale), rounded to float32 as its CPU kernel takes it."""
    return np.float32(1.0 / math.sqrt(e)) if e > 0 else np.float32(math.inf)


def _attention(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    kernel, scale, causal = K.AttentionOps(), node.attrs["scale"], node.attrs["is_causal"]

    def step(q, k, v, mask=None):
        (lq, e), (s, e2), (s2, ev) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
        if e != e2:
            raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} must have the same last dimension (E)")
        if s != s2:
            raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} must have the same number of keys")
        batch = broadcast_batch({"q": q.shape[:-2], "k": k.shape[:-2], "v": v.shape[:-2]})
        y = np.empty(batch + (lq, ev), np.float32)
        m_off, stride = None, 0
        if mask is not None:
            mask = mask.reshape(mask.shape or (1,))
            scores = batch + (lq, s)
            if mask.ndim > len(scores) or any(d not in (1, w) for d, w in zip(mask.shape[::-1], scores[::-1])):
                raise ValueError(f"mask {list(mask.shape)} does not broadcast to the scores {list(scores)}")
            if mask.shape[-1] != s:  # one value for every key: repeated, the only copy made
                mask = np.broadcast_to(mask, mask.shape[:-1] + (s,))
            mask = _contiguous(mask)
            rows = mask.shape[-2] if mask.ndim >= 2 else 1
            stride = s if rows == lq and lq != 1 else 0
            m_off = batch_offsets(mask.shape[:-2], batch, rows * s)
        kernel.attention(
            _contiguous(q).reshape(-1), batch_offsets(q.shape[:-2], batch, lq * e),
            _contiguous(k).reshape(-1), batch_offsets(k.shape[:-2], batch, s * e),
            _contiguous(v).reshape(-1), batch_offsets(v.shape[:-2], batch, s * ev),
            mask, m_off, stride, default_scale(e) if scale is None else np.float32(scale), causal,
            y.reshape(-1, lq, ev), s, e,
        )
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {"matmul": _matmul, "attention": _attention}
