# Embedding lookups (included by _kernels.pyx): the ops embedding and embedding_bag of qrt/cpu/tensor_ops.py.
# Every index and offset is checked here, before the kernels (qrt/kernels/embedding.h) run without the GIL.

cdef extern from "embedding.h" nogil:
    ctypedef struct qrt_table:
        const uint8_t* data
        ptrdiff_t row_bytes
        ptrdiff_t dim
        int bits
        const float* scale
        const float* bias
        int fma
    void qrt_embedding_rows(const qrt_table* t, const int64_t* idx, ptrdiff_t n, float* out)
    void qrt_embedding_bags(const qrt_table* t, const int64_t* idx, const int64_t* ends, ptrdiff_t bags, int mode,
                            float* out)

EMBEDDING_MODES = {"sum": 0, "mean": 1, "max": 2}


cdef class EmbeddingTable:
    """A table of num rows of dim values: float32 (bits 32), or uint8 (bits 8) or packed 4-bit values
    (bits 4, ceil(dim / 2) bytes per row, low nibble first) with a float32 scale and bias per row."""

    cdef const float[:, ::1] rows_f32
    cdef const uint8_t[:, ::1] rows_q
    cdef const float[::1] scale, bias
    cdef qrt_table t
    cdef readonly Py_ssize_t num, dim

    def __init__(self, weight, scale, bias, int bits, Py_ssize_t dim):
        if bits == 32:
            self.rows_f32 = weight
            self.num = self.rows_f32.shape[0]
            if self.rows_f32.shape[1] != dim or scale is not None or bias is not None:
                raise ValueError("EmbeddingTable: a float32 table has dim columns and no scale or bias")
            self.t.data = <const uint8_t*>&self.rows_f32[0, 0] if self.num and dim else NULL
            self.t.row_bytes = dim * sizeof(float)
        elif bits == 8 or bits == 4:
            self.rows_q = weight
            self.scale, self.bias = scale, bias
            self.num = self.rows_q.shape[0]
            if self.rows_q.shape[1] != (dim if bits == 8 else (dim + 1) // 2):
                raise ValueError(f"EmbeddingTable: {self.rows_q.shape[1]} bytes per row do not hold {dim} values")
            if self.scale.shape[0] != self.num or self.bias.shape[0] != self.num:
                raise ValueError("EmbeddingTable: scale and bias need one value per row")
            self.t.data = &self.rows_q[0, 0] if self.num and self.rows_q.shape[1] else NULL
            self.t.row_bytes = self.rows_q.shape[1]
            self.t.scale = &self.scale[0] if self.num else NULL
            self.t.bias = &self.bias[0] if self.num else NULL
        else:
            raise ValueError(f"EmbeddingTable: bits must be 32, 8 or 4, got {bits}")
        self.t.bits = bits
        self.t.dim = self.dim = dim
        # the loops compiled for AVX2 and FMA where the kernels run such code (FloatOps chooses the same way)
        self.t.fma = active.name.decode() != "portable"

    cdef check_indices(self, const int64_t[::1] indices):
        cdef Py_ssize_t i, bad = -1
        cdef int64_t num = self.num
        with nogil:
            for i in range(indices.shape[0]):
                if indices[i] < 0 or indices[i] >= num:
                    bad = i
                    break
        if bad >= 0:
            raise ValueError(f"indices: {indices[bad]} (at flat position {bad}) is out of range for a table of "
                             f"{num} rows: indices must lie in [0, {num})")

    def rows(self, const int64_t[::1] indices, float[:, ::1] out):
        """out[i] = row indices[i]."""
        cdef Py_ssize_t n = indices.shape[0]
        if out.shape[0] != n or out.shape[1] != self.dim:
            raise ValueError("EmbeddingTable.rows: out must be [len(indices), dim]")
        self.check_indices(indices)
        if n == 0 or self.dim == 0:
            return
        with nogil:
            self.gather(&indices[0], n, &out[0, 0])

    cdef int gather(self, const int64_t* indices, Py_ssize_t n, float* out) noexcept nogil:
        """rows() on raw pointers (the execution plan's step): 1, and nothing written, if an index is out
        of range (the caller's slow path then says which, through rows())."""
        cdef Py_ssize_t i
        for i in range(n):
            if indices[i] < 0 or indices[i] >= self.num:
                return 1
        if n and self.dim:
            qrt_embedding_rows(&self.t, indices, n, out)
        return 0

    cdef int gather_int32(self, const int32_t* indices, Py_ssize_t n, float* out) noexcept nogil:
        """gather() of int32 indices (positions a model computed in int32): widened a block at a time."""
        cdef int64_t wide[256]
        cdef Py_ssize_t i, k, m
        for i in range(n):
            if indices[i] < 0 or indices[i] >= self.num:
                return 1
        if not self.dim:
            return 0
        for i in range(0, n, 256):
            m = min(256, n - i)
            for k in range(m):
                wide[k] = indices[i + k]
            qrt_embedding_rows(&self.t, wide, m, out + i * self.dim)
        return 0

    def bags(self, const int64_t[::1] indices, const int64_t[::1] ends, str mode, float[:, ::1] out):
        """out[g] = the sum, mean or max of rows indices[ends[g]:ends[g + 1]] (ends: the offsets, then len(indices)).

        An empty bag gives zeros."""
        cdef Py_ssize_t g, bags = ends.shape[0] - 1, n = indices.shape[0], bad = -1
        if bags < 0 or out.shape[0] != bags or out.shape[1] != self.dim or mode not in EMBEDDING_MODES:
            raise ValueError("EmbeddingTable.bags: out must be [len(ends) - 1, dim], mode sum, mean or max")
        self.check_indices(indices)
        if bags == 0:
            return
        if ends[0] != 0:
            raise ValueError(f"offsets[0] is {ends[0]}, expected 0: the first bag starts at the first index")
        if ends[bags] > n:  # the caller's own last entry
            raise ValueError(f"EmbeddingTable.bags: ends[-1] = {ends[bags]} exceeds the {n} indices")
        with nogil:
            for g in range(bags):
                if ends[g + 1] < ends[g]:
                    bad = g
                    break
        if bad >= 0:
            if bad == bags - 1:
                raise ValueError(f"offsets[{bad}] is {ends[bad]}, beyond the {n} indices")
            raise ValueError(f"offsets must not decrease, got offsets[{bad}] = {ends[bad]} and "
                             f"offsets[{bad + 1}] = {ends[bad + 1]}")
        if self.dim == 0:
            return
        cdef int m = EMBEDDING_MODES[mode]
        with nogil:
            qrt_embedding_bags(&self.t, &indices[0] if n else NULL, &ends[0], bags, m, &out[0, 0])
