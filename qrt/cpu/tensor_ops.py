"""The CPU backend's tensor and embedding ops (in qrt.cpu.IMPLEMENTATIONS).

Tensor ops move values and compute none, so they are exact: numpy indexing, reshapes and copies,
written once for both backends (qrt/tensor_moves.py). Embedding lookups run in C (qrt/_embedding.pxi),
which checks every index before it reads a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .. import _kernels as K
from .. import mask_ops, tensor_moves
from ..graph import Node
from .types import Prepare, Step


def _table(node: Node, c: Mapping[str, np.ndarray]) -> K.EmbeddingTable:
    bits, weight = node.attrs["bits"], c["weight"]
    if bits == 32:
        return K.EmbeddingTable(weight, None, None, 32, weight.shape[1])
    # a float16 scale or bias (bits 4) widens to float32 exactly
    scale, bias = (np.ascontiguousarray(c[p], np.float32) for p in ("weight_scale", "weight_bias"))
    return K.EmbeddingTable(weight, scale, bias, bits, weight.shape[1] if bits == 8 else node.attrs["dim"])


def _gather_along(part: np.ndarray, index: np.ndarray, dim: int) -> np.ndarray:
    """take_along_axis in C (qrt/_mask_steps.pxi, gather_rows): every index checked before any is read. numpy's
    own took twice as long on DeBERTa's position gathers ([12, 128, 128] of [12, 128, 512]: 1.0 against 0.5 ms)."""
    part, flat = np.ascontiguousarray(part), _indices(index)
    y = np.empty(index.shape, part.dtype)
    outer, inner = math.prod(index.shape[:dim]), math.prod(index.shape[dim + 1 :])
    if K.gather_rows(part, flat, outer, part.shape[dim], index.shape[dim], inner, y) >= 0:
        mask_ops.host_check(flat, part.shape[dim], "index")  # raises the op's message
    return y


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
    **tensor_moves.implementations(lambda: np),
    **mask_ops.implementations(lambda: np, gather_along=_gather_along),
    "embedding": _embedding,
    "embedding_bag": _embedding_bag,
}
