"""Weight matrices in the packed layout every CPU kernel variant reads (qrt/kernels/layout.h).

Format version 4 stores the weights of the linear and recurrent ops this way (docs/FORMAT.md,
"Packed matrices"), so the kernels read them where the file is mapped: loading copies nothing.

A matrix w[n, k] is cut into strips of 16 output columns, n padded with zero columns to a multiple of
64 (int8) or 32 (float16, float32):

- int8: k padded with zeros to a multiple of 4; stored shape [n64 / 16, k4 / 4, 16, 4], element
  [s, g, c, b] = w[16 s + c, 4 g + b]; the rows' sums (int32 [n]) are stored beside it.
- float16 and float32: stored shape [n32 / 16, k, 16], element [s, t, c] = w[16 s + c, t].
"""

from __future__ import annotations

import numpy as np

STRIP = 16
PACKED_DTYPES = (np.dtype("int8"), np.dtype("float16"), np.dtype("float32"))


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def packed_shape(dtype: np.dtype, n: int, k: int) -> tuple[int, ...]:
    """The stored shape of an [n, k] matrix of dtype in the packed layout."""
    if np.dtype(dtype) == np.int8:
        return (_round_up(n, 64) // STRIP, _round_up(k, 4) // 4, STRIP, 4)
    return (_round_up(n, 32) // STRIP, k, STRIP)


class PackedMatrix:
    """An [n, k] weight matrix held in the packed layout.

    ``data`` has ``packed_shape(dtype, n, k)``; ``row_sums`` (int8 only) holds each row's sum as
    int32, which the integer product needs. It stands in for the plain matrix wherever only its
    ``shape`` and ``dtype`` are read, and ``np.asarray`` gives the plain matrix (a copy).
    """

    __slots__ = ("data", "shape", "row_sums")
    ndim = 2

    def __init__(self, data: np.ndarray, shape: tuple[int, int], row_sums: np.ndarray | None = None) -> None:
        self.data = data
        self.shape = (int(shape[0]), int(shape[1]))
        self.row_sums = row_sums

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.row_sums is None else self.row_sums.nbytes)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        w = unpack(self)
        return w if dtype is None else w.astype(dtype)

    def __repr__(self) -> str:
        return f"PackedMatrix({self.dtype}, shape={list(self.shape)})"


def pack(w: np.ndarray) -> PackedMatrix:
    """The packed form of a plain [n, k] int8, float16 or float32 matrix."""
    w = np.ascontiguousarray(w)
    if w.ndim != 2 or w.dtype not in PACKED_DTYPES:
        raise ValueError(f"only 2-D int8, float16 or float32 matrices are packed, got {w.dtype} {list(w.shape)}")
    from . import _kernels  # the C packer of layout.h: the layout's one implementation

    n, k = w.shape
    data = _kernels.pack_matrix(w, packed_shape(w.dtype, n, k))  # 64-byte aligned, as a file's
    row_sums = w.sum(axis=1, dtype=np.int32) if w.dtype == np.int8 else None
    return PackedMatrix(data, (n, k), row_sums)


def unpack(p: PackedMatrix) -> np.ndarray:
    """The plain [n, k] matrix a PackedMatrix holds (a new array)."""
    n, k = p.shape
    d = p.data
    if d.dtype == np.int8:  # [s, g, c, b] -> [s, c, g, b] -> rows 16 s + c, columns 4 g + b
        w = d.transpose(0, 2, 1, 3).reshape(d.shape[0] * STRIP, d.shape[1] * 4)
    else:  # [s, t, c] -> [s, c, t]
        w = d.transpose(0, 2, 1).reshape(d.shape[0] * STRIP, d.shape[1])
    return np.ascontiguousarray(w[:n, :k])
