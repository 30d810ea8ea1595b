"""The CPU backend's tensor and embedding ops (in qrt.cpu.IMPLEMENTATIONS).

Tensor ops move values and compute none, so they are exact: numpy indexing, reshapes and copies.
Each step returns a C-contiguous array (a view of its input where numpy gives one), as the kernels
of the ops after it expect. Embedding lookups run in C (qrt/_embedding.pxi), which checks every
index before it reads a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import numpy as np

from .. import _kernels as K
from ..graph import Node
from ..ops import flattened, reshaped
from .types import Prepare, Step


def _contiguous(a: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray, which turns a 0-d array into a 1-d one
    return a if a.flags.c_contiguous else a.copy()


def _select(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dim, index = node.attrs["dim"], node.attrs["index"]

    def step(x):
        size = x.shape[dim]
        i = index + size if index < 0 else index
        if not 0 <= i < size:
            raise ValueError(f"index {index} is out of range for dimension {dim} of x, shape {list(x.shape)}")
        return (_contiguous(x[(slice(None),) * dim + (i, Ellipsis)]),)  # the Ellipsis keeps a 0-d result an array

    return step


def _slice(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dim, start, end, step_ = (node.attrs[a] for a in ("dim", "start", "end", "step"))

    def step(x):
        # clamped in Python integers first: an attribute beyond int64 never reaches numpy
        lo, hi, st = slice(start, end, step_).indices(x.shape[dim])
        return (_contiguous(x[(slice(None),) * dim + (slice(lo, hi, st),)]),)

    return step


def _stacked(dim: int, skip: int | None) -> Callable[[tuple], None]:
    """Run-time check of cat (skip = dim: sizes there may differ) and stack (skip None)."""

    def check(xs):
        ref = xs[0].shape
        for i, x in enumerate(xs[1:], 1):
            if any(a != b for k, (a, b) in enumerate(zip(x.shape, ref)) if k != skip):
                but = "" if skip is None else f" except at dimension {dim}"
                raise ValueError(f"x{i} has shape {list(x.shape)} and x0 {list(ref)}: they must agree{but}")

    return check


def _cat(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dim = node.attrs["dim"]
    check = _stacked(dim, dim)

    def step(*xs):
        check(xs)
        return (np.concatenate(xs, axis=dim),)

    return step


def _stack(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dim = node.attrs["dim"]
    check = _stacked(dim, None)

    def step(*xs):
        check(xs)
        return (np.stack(xs, axis=dim),)

    return step


def _reshape(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    shape = node.attrs["shape"]

    def step(x):
        out = reshaped(x.shape, shape)
        if out is None:
            raise ValueError(f"x has shape {list(x.shape)}, which cannot be reshaped to {shape}")
        return (_contiguous(x.reshape(out)),)

    return step


def _permute(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    perm = tuple(node.attrs["perm"])
    return lambda x: (_contiguous(x.transpose(perm)),)


def _squeeze(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dims = node.attrs["dims"]

    def step(x):
        for d in dims:
            if x.shape[d] != 1:  # a free dimension: checked now
                raise ValueError(f"x has shape {list(x.shape)}: dimension {d} must have size 1 to be squeezed")
        return (_contiguous(x.reshape([n for i, n in enumerate(x.shape) if i not in dims])),)

    return step


def _unsqueeze(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    dim = node.attrs["dim"]
    return lambda x: (_contiguous(x.reshape(x.shape[:dim] + (1,) + x.shape[dim:])),)


def _flatten(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    start, end = node.attrs["start_dim"], node.attrs["end_dim"]
    return lambda x: (_contiguous(x.reshape(flattened(x.shape, start, end))),)


def _table(node: Node, c: Mapping[str, np.ndarray]) -> K.EmbeddingTable:
    bits, weight = node.attrs["bits"], c["weight"]
    if bits == 32:
        return K.EmbeddingTable(weight, None, None, 32, weight.shape[1])
    # a float16 scale or bias (bits 4) widens to float32 exactly
    scale, bias = (np.ascontiguousarray(c[p], np.float32) for p in ("weight_scale", "weight_bias"))
    return K.EmbeddingTable(weight, scale, bias, bits, weight.shape[1] if bits == 8 else node.attrs["dim"])


def _indices(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64).reshape(-1)


def _embedding(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    table = _table(node, c)

    def step(indices):
        flat = _indices(indices)
        y = np.empty((flat.shape[0], table.dim), np.float32)
        table.rows(flat, y)
        return (y.reshape(indices.shape + (table.dim,)),)

    step.kernel = table  # for the execution plan
    return step


def _embedding_bag(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    table, mode = _table(node, c), node.attrs["mode"]

    def step(indices, offsets=None):
        flat = _indices(indices)
        if offsets is None:  # [bags, n]: bag g is row g
            ends = np.arange(indices.shape[0] + 1, dtype=np.int64) * indices.shape[1]
        else:  # the last bag runs to the end of indices (torch's include_last_offset=False)
            ends = np.append(np.asarray(offsets, np.int64), np.int64(flat.shape[0]))
        y = np.empty((ends.shape[0] - 1, table.dim), np.float32)
        table.bags(flat, ends, mode, y)
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    "select": _select,
    "slice": _slice,
    "cat": _cat,
    "stack": _stack,
    "reshape": _reshape,
    "permute": _permute,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "flatten": _flatten,
    "embedding": _embedding,
    "embedding_bag": _embedding_bag,
}
