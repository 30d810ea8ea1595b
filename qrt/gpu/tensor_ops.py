"""The tensor and embedding ops on the device (in qrt.gpu.IMPLEMENTATIONS).

Tensor ops move values and compute none: CuPy indexing, reshapes and copies, exact, written once for
both backends (qrt/tensor_moves.py). Embedding lookups run qrt/cuda/embedding.cu, the CPU's loops
value by value; the indices and offsets are checked there, on the device, and a bad one raises the
CPU's ValueError once the run is done (qrt.gpu.runtime.add_check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import mask_ops, tensor_moves
from ..cpu.types import Prepare, Step
from ..graph import Node
from .runtime import add_check, blocks, check_size, cupy, kernel


def contiguous(a: Any, dtype: Any = None) -> Any:
    """``a`` on the device, C-contiguous (a view where it is already); unlike cupy.ascontiguousarray,
    a 0-d array stays 0-d."""
    a = cupy().asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous else a.copy()


# ---------------------------------------------------------------- embedding

FLAG_NONE = np.iinfo(np.int64).max
F_POS, F_INDEX, F_OFFSET0, F_BAG, F_START, F_END, F_WORDS = range(7)  # embedding.cu's flag words


class _Table:
    """A table uploaded once: float32 rows (bits 32), or uint8 / packed 4-bit rows with a float32
    scale and bias per row (a float16 one widens exactly), as the CPU's EmbeddingTable."""

    def __init__(self, node: Node, c: Mapping[str, np.ndarray]) -> None:
        bits, weight = node.attrs["bits"], c["weight"]
        self.node, self.bits, self.num = node, bits, weight.shape[0]
        self.dim = weight.shape[1] if bits != 4 else node.attrs["dim"]
        null = np.uintp(0)  # bits 32: no scale or bias (never read)
        self.scale, self.bias = (
            (null, null) if bits == 32
            else (contiguous(np.asarray(c[p], np.float32).reshape(-1)) for p in ("weight_scale", "weight_bias"))
        )
        self.data = contiguous(weight)
        check_size("the embedding table", weight.size)
        self.row_bytes = weight.shape[1] * weight.dtype.itemsize

    def params(self) -> tuple:
        return (self.data, self.scale, self.bias, np.int64(self.num), np.uint32(self.row_bytes), np.uint32(self.dim))

    def check(self, idx: Any, offsets: Any, per: int, bags: int) -> None:
        """Launch the checks of idx (and of the bags' bounds) and register their message."""
        cp, n, num = cupy(), idx.shape[0], self.num
        flag = cp.full(F_WORDS, FLAG_NONE, np.int64)
        bounds = (np.uintp(0) if offsets is None else offsets, np.uint32(per), np.uint32(bags))
        if max(n, bags):
            kernel("embedding.cu", "embedding_check")(
                (blocks(max(n, bags)),), (256,), (idx, np.uint32(n), np.int64(num), *bounds, flag)
            )
            kernel("embedding.cu", "embedding_check_values")((1,), (1,), (idx, np.uint32(n), *bounds, flag))
        where = f"node {self.node.name!r} ({self.node.op}): "

        def describe(f: np.ndarray) -> str | None:
            # the CPU's messages, in the CPU's order (qrt/_embedding.pxi)
            if f[F_POS] != FLAG_NONE:
                return (f"{where}indices: {f[F_INDEX]} (at flat position {f[F_POS]}) is out of range for a table "
                        f"of {num} rows: indices must lie in [0, {num})")
            if bags and f[F_OFFSET0] != 0:
                return f"{where}offsets[0] is {f[F_OFFSET0]}, expected 0: the first bag starts at the first index"
            if f[F_BAG] != FLAG_NONE:
                g = int(f[F_BAG])
                if g == bags - 1:
                    return f"{where}offsets[{g}] is {f[F_START]}, beyond the {n} indices"
                return (f"{where}offsets must not decrease, got offsets[{g}] = {f[F_START]} and "
                        f"offsets[{g + 1}] = {f[F_END]}")
            return None

        add_check(flag, describe)


def _check_indices(index: Any, size: int, what: str) -> None:
    """mask_ops' index check on the device: the extremes are found by kernels (no wait for the GPU, so the
    step can be captured into the plan's CUDA graph) and read once the run is done; CuPy's take wraps an
    index out of range, so nothing is read out of bounds before the ValueError."""
    if index.size:
        extremes = cupy().stack([index.min(), index.max()]).astype(np.int64)
        add_check(extremes, lambda f: mask_ops.out_of_range(what, size, int(f[0]), int(f[1])))


def _indices(a: Any) -> Any:
    flat = contiguous(a, np.int64).reshape(-1)
    check_size("indices", flat.shape[0])
    return flat


def _launch(name: str, n: int, *args: Any) -> None:
    if n:
        kernel("embedding.cu", name)((blocks(n),), (256,), args)


def _embedding(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    table = _Table(node, c)
    name = f"embedding_rows_{table.bits}"

    def step(indices):
        flat = _indices(indices)
        n = flat.shape[0]
        table.check(flat, None, 0, 0)
        check_size("the output", n * table.dim)
        y = cupy().empty((n, table.dim), np.float32)
        _launch(name, n * table.dim, *table.params(), flat, np.uint32(n), y)
        return (y.reshape(indices.shape + (table.dim,)),)

    return step


def _embedding_bag(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    table, mode = _Table(node, c), {"sum": 0, "mean": 1, "max": 2}[node.attrs["mode"]]
    name = f"embedding_bags_{table.bits}"

    def step(indices, offsets=None):
        flat = _indices(indices)
        if offsets is None:  # [bags, n]: bag g is row g
            bags, per, offs = indices.shape[0], indices.shape[1], None
        else:  # the last bag runs to the end of indices (torch's include_last_offset=False)
            offs = contiguous(offsets, np.int64).reshape(-1)
            bags, per = offs.shape[0], 0
        table.check(flat, offs, per, bags)
        check_size("the output", bags * table.dim)
        y = cupy().empty((bags, table.dim), np.float32)
        bounds = (np.uintp(0) if offs is None else offs, np.uint32(per), np.uint32(bags))
        _launch(name, bags * table.dim, *table.params(), flat, np.uint32(flat.shape[0]), *bounds, np.int32(mode), y)
        return (y,)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    **tensor_moves.implementations(cupy),
    **mask_ops.implementations(cupy, _check_indices),
    "embedding": _embedding,
    "embedding_bag": _embedding_bag,
}
