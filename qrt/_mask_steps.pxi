# ------------------------------------------------------------ the mask ops' native plan steps (included by _kernels.pyx)
#
# cast, logical_and / logical_or, expand, permute, where and clamp as an execution plan runs them (qrt/plan.py):
# one loop over the output in C order, each operand read through its own strides (0 along a broadcast dimension,
# permuted for a permute), so no operand is copied first. What they compute is qrt/mask_ops.py's and
# qrt/tensor_moves.py's: exact (C's conversions, as numpy's astype; a logical op on bools; a copy; a choice
# between two elements; numpy's maximum and minimum against bounds other than 0, where the two can only differ in
# the sign of a zero).

cdef enum:
    MASK_COPY = 0  # expand, permute: the operand's elements, itemsize bytes each
    MASK_AND
    MASK_OR
    MASK_CAST
    MASK_CLAMP  # float32, between lo and hi (where given), NaN kept
    MASK_WHERE  # a bool condition, then the element of the second or third operand, itemsize bytes each

cdef enum:  # the element types a cast reads or writes
    EL_BOOL = 0
    EL_INT32
    EL_INT64
    EL_FLOAT32

cdef int MASK_MAX_RANK = 8
_MASK_CODES = {"expand": MASK_COPY, "permute": MASK_COPY, "logical_and": MASK_AND, "logical_or": MASK_OR,
               "cast": MASK_CAST, "clamp": MASK_CLAMP, "where": MASK_WHERE}
_ELEMENTS = {"bool": EL_BOOL, "int32": EL_INT32, "int64": EL_INT64, "float32": EL_FLOAT32}


cdef inline double element_at(const char* p, int kind) noexcept nogil:
    """An int32, bool or float32 element as a double: exact. (int64 is read on its own path.)"""
    if kind == EL_BOOL:
        return (<const uint8_t*>p)[0] != 0
    if kind == EL_INT32:
        return (<const int32_t*>p)[0]
    return (<const float*>p)[0]


cdef inline void cast_one(const char* p, int src, char* q, int dst) noexcept nogil:
    """One element converted as numpy's astype (C's conversion): to bool, x != 0 (NaN: True); an integer to
    float32 rounded to nearest; to int64 from bool or int32, exact."""
    cdef int64_t i
    if src == EL_INT64:
        i = (<const int64_t*>p)[0]
        if dst == EL_BOOL:
            (<uint8_t*>q)[0] = i != 0
        elif dst == EL_FLOAT32:
            (<float*>q)[0] = <float>i
        else:
            (<int64_t*>q)[0] = i
        return
    if dst == EL_BOOL:
        (<uint8_t*>q)[0] = element_at(p, src) != 0
    elif dst == EL_FLOAT32:
        if src == EL_INT32:
            (<float*>q)[0] = <float>(<const int32_t*>p)[0]
        elif src == EL_BOOL:
            (<float*>q)[0] = <float>((<const uint8_t*>p)[0] != 0)
        else:
            (<float*>q)[0] = (<const float*>p)[0]
    else:
        (<int64_t*>q)[0] = <int64_t>element_at(p, src)


cdef inline void copy_element(char* q, const char* p, Py_ssize_t itemsize) noexcept nogil:
    """One element's bytes: the common sizes as one load and store (memcpy of a size known only at run time is
    a call)."""
    if itemsize == 4:
        (<uint32_t*>q)[0] = (<const uint32_t*>p)[0]
    elif itemsize == 8:
        (<uint64_t*>q)[0] = (<const uint64_t*>p)[0]
    elif itemsize == 1:
        q[0] = p[0]
    else:
        memcpy(q, p, itemsize)


cdef inline float clamp_one(float x, MaskStep c) noexcept nogil:
    """numpy's maximum(x, lo), then minimum(., hi): x where it is NaN or within the bounds."""
    if c.has_lo and not (x >= c.lo or x != x):
        x = c.lo
    if c.has_hi and not (x <= c.hi or x != x):
        x = c.hi
    return x


cdef class MaskStep:
    """One mask op at one set of shapes: y (C-contiguous, `shape`) from one to three operands read through
    their byte strides per output dimension (0: broadcast). op: "expand", "permute" (y's dimension d is the
    operand's perm[d]), "logical_and", "logical_or" (bool operands and output), "where" (a bool condition,
    then two operands of y's type), "cast" (src and dst element types in _ELEMENTS) or "clamp" (float32, bounds
    lo and hi, None for none, neither 0)."""
    cdef int op, rank, n_in, src, dst
    cdef bint has_lo, has_hi
    cdef float lo, hi
    cdef Py_ssize_t itemsize, out_item
    cdef Py_ssize_t shape[8]
    cdef Py_ssize_t strides[3][8]

    def __init__(self, str op, tuple shape, list operand_shapes, Py_ssize_t itemsize, str src="bool",
                 str dst="bool", lo=None, hi=None, tuple perm=None):
        """operand_shapes: each operand's shape, broadcast to `shape` as numpy does (a permute's: permuted by
        perm to `shape`); itemsize: a value operand's element bytes (expand, permute, where: any; the logical
        ops: 1)."""
        cdef int d, k
        cdef Py_ssize_t step
        if len(shape) > MASK_MAX_RANK or op not in _MASK_CODES or \
                len(operand_shapes) != (3 if op == "where" else 2 if op.startswith("logical") else 1):
            raise ValueError("MaskStep: unsupported op, rank or operand count")
        self.op, self.rank, self.n_in = _MASK_CODES[op], len(shape), len(operand_shapes)
        self.src, self.dst, self.itemsize = _ELEMENTS[src], _ELEMENTS[dst], itemsize
        self.out_item = (1 if self.dst == EL_BOOL else 8 if self.dst == EL_INT64 else 4) if op == "cast" else \
            (itemsize if op in ("expand", "permute", "where", "clamp") else 1)
        if op == "cast" and (self.src == EL_FLOAT32 and self.dst != EL_BOOL or self.dst == EL_INT32):
            raise ValueError("MaskStep: a cast it does not run")
        if op == "clamp":
            if lo == 0 or hi == 0 or itemsize != 4:  # a zero bound: numpy's result may be either zero
                raise ValueError("MaskStep: a clamp it does not run")
            self.has_lo, self.has_hi = lo is not None, hi is not None
            self.lo, self.hi = (lo if self.has_lo else 0), (hi if self.has_hi else 0)
        for d in range(self.rank):
            self.shape[d] = shape[d]
        if op == "permute":
            self.permuted(operand_shapes[0], perm)
            return
        for k, s in enumerate(operand_shapes):
            if len(s) > self.rank:
                raise ValueError("MaskStep: an operand of higher rank than the output")
            step = 1 if op == "where" and k == 0 else itemsize  # where's condition: bools
            for d in reversed(range(self.rank)):
                i = d - self.rank + len(s)
                size = s[i] if i >= 0 else 1
                if size != shape[d] and size != 1:
                    raise ValueError("MaskStep: an operand that does not broadcast to the output")
                self.strides[k][d] = 0 if size == 1 else step
                step *= size

    cdef permuted(self, tuple s, tuple perm):
        """The operand's strides for a permute: y's dimension d walks the operand's perm[d]."""
        cdef Py_ssize_t own[8]
        cdef Py_ssize_t step = self.itemsize
        cdef int d
        if perm is None or len(s) != self.rank or sorted(perm) != list(range(self.rank)) \
                or any(self.shape[d] != s[perm[d]] for d in range(self.rank)):
            raise ValueError("MaskStep: a permute whose shapes do not agree")
        for d in reversed(range(self.rank)):
            own[d] = step
            step *= s[d]
        for d in range(self.rank):
            self.strides[0][d] = own[perm[d]]

    cdef void run(self, const char* a, const char* b, const char* c, char* y) noexcept nogil:
        """y from a (and b, c), as made; an output of at least one element."""
        cdef Py_ssize_t idx[8]
        cdef Py_ssize_t d, j, inner = self.shape[self.rank - 1] if self.rank else 1
        cdef Py_ssize_t sa = self.strides[0][self.rank - 1] if self.rank else 0
        cdef Py_ssize_t sb = self.strides[1][self.rank - 1] if self.rank and self.n_in >= 2 else 0
        cdef Py_ssize_t sc = self.strides[2][self.rank - 1] if self.rank and self.n_in == 3 else 0
        cdef const char* pa = a
        cdef const char* pb = b
        cdef const char* pc = c
        for d in range(self.rank):
            idx[d] = 0
        while True:
            if self.op == MASK_COPY:
                if sa == self.itemsize:
                    memcpy(y, pa, inner * self.itemsize)
                else:
                    for j in range(inner):
                        copy_element(y + j * self.itemsize, pa + j * sa, self.itemsize)
            elif self.op == MASK_AND:
                for j in range(inner):
                    (<uint8_t*>y)[j] = (<const uint8_t*>pa)[j * sa] != 0 and (<const uint8_t*>pb)[j * sb] != 0
            elif self.op == MASK_OR:
                for j in range(inner):
                    (<uint8_t*>y)[j] = (<const uint8_t*>pa)[j * sa] != 0 or (<const uint8_t*>pb)[j * sb] != 0
            elif self.op == MASK_WHERE:
                for j in range(inner):
                    copy_element(y + j * self.itemsize,
                                 (pb + j * sb) if (<const uint8_t*>pa)[j * sa] else (pc + j * sc), self.itemsize)
            elif self.op == MASK_CAST:
                for j in range(inner):
                    cast_one(pa + j * sa, self.src, y + j * self.out_item, self.dst)
            else:
                for j in range(inner):
                    (<float*>y)[j] = clamp_one((<const float*>(pa + j * sa))[0], self)
            y += inner * self.out_item
            # the next row: the odometer over the dimensions before the last
            d = self.rank - 2
            while d >= 0:
                idx[d] += 1
                pa += self.strides[0][d]
                if self.n_in >= 2:
                    pb += self.strides[1][d]
                if self.n_in == 3:
                    pc += self.strides[2][d]
                if idx[d] < self.shape[d]:
                    break
                pa -= idx[d] * self.strides[0][d]
                if self.n_in >= 2:
                    pb -= idx[d] * self.strides[1][d]
                if self.n_in == 3:
                    pc -= idx[d] * self.strides[2][d]
                idx[d] = 0
                d -= 1
            if d < 0:
                return



ctypedef fused element_bits:  # gather moves elements as their bits: 1, 4 or 8 bytes
    uint8_t
    uint32_t
    uint64_t


cdef void gather_blocks(const element_bits* x, const int64_t* index, element_bits* y, Py_ssize_t outer,
                        Py_ssize_t n_x, Py_ssize_t n_index, Py_ssize_t inner) noexcept nogil:
    """y[o, j, i] = x[o, index[o, j, i], i]: each index already checked."""
    cdef Py_ssize_t o, j, i, k = 0
    cdef const element_bits* block
    for o in range(outer):
        block = x + o * n_x * inner
        for j in range(n_index):
            for i in range(inner):
                y[k] = block[index[k] * inner + i]
                k += 1


def gather_rows(x, const int64_t[::1] index, Py_ssize_t outer, Py_ssize_t n_x, Py_ssize_t n_index,
                Py_ssize_t inner, y) -> int:
    """gather as [outer, n, inner] blocks: y[o, j, i] = x[o, index[o, j, i], i], x and y C-contiguous arrays of one
    dtype (1, 4 or 8 bytes an element) holding outer * n_x * inner and outer * n_index * inner elements, index the
    latter's count. Every index is checked before any is read: returns -1, or the flat position of the first
    outside [0, n_x) (then y is not written)."""
    cdef Py_ssize_t item = x.itemsize, k, bad = -1, total = outer * n_index * inner
    if index.shape[0] != total or x.size != outer * n_x * inner or y.size != total or y.dtype != x.dtype \
            or item not in (1, 4, 8):
        raise ValueError("gather_rows: sizes or dtypes do not agree")
    if total == 0:
        return -1
    cdef const void* xs = <const void*><size_t>x.ctypes.data
    cdef void* ys = <void*><size_t>y.ctypes.data
    with nogil:
        for k in range(total):
            if index[k] < 0 or index[k] >= n_x:
                bad = k
                break
        if bad < 0 and item == 4:
            gather_blocks(<const uint32_t*>xs, &index[0], <uint32_t*>ys, outer, n_x, n_index, inner)
        elif bad < 0 and item == 8:
            gather_blocks(<const uint64_t*>xs, &index[0], <uint64_t*>ys, outer, n_x, n_index, inner)
        elif bad < 0:
            gather_blocks(<const uint8_t*>xs, &index[0], <uint8_t*>ys, outer, n_x, n_index, inner)
    return bad
