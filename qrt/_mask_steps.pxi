# ------------------------------------------------------------ the mask ops' native plan steps (included by _kernels.pyx)
#
# cast, comparisons, logic, integer arithmetic, expand, permute, where and clamp as an execution plan runs them
# (qrt/plan.py): one loop over the output in C order, each operand read through its own strides (0 along a
# broadcast dimension, permuted for a permute), so no operand is copied first; gather and cumsum, one pass each.
# What they compute is qrt/mask_ops.py's and qrt/tensor_moves.py's: exact (C's conversions, as numpy's astype;
# comparisons of two floats or of two integers; a logical op on bools; integer arithmetic and running sums modulo
# 2**bits; a copy; a choice between two elements; numpy's maximum and minimum against bounds other than 0, where
# the two can only differ in the sign of a zero).

cdef enum:
    MASK_COPY = 0  # expand, permute: the operand's elements, itemsize bytes each
    MASK_AND
    MASK_OR
    MASK_NOT
    MASK_CAST
    MASK_CLAMP  # float32, between lo and hi (where given), NaN kept
    MASK_WHERE  # a bool condition, then the element of the second or third operand, itemsize bytes each
    MASK_COMPARE  # two float32 or two integer (or bool) operands compared; bool out
    MASK_INT_ARITH  # two integer operands, their sum, difference or product modulo 2**bits of dst

cdef enum:  # the element types a cast, a comparison or integer arithmetic reads or writes
    EL_BOOL = 0
    EL_INT32
    EL_INT64
    EL_FLOAT32

cdef int MASK_MAX_RANK = 8
_MASK_CODES = {"expand": MASK_COPY, "permute": MASK_COPY, "logical_and": MASK_AND, "logical_or": MASK_OR,
               "logical_not": MASK_NOT, "cast": MASK_CAST, "clamp": MASK_CLAMP, "where": MASK_WHERE,
               **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge"), MASK_COMPARE),
               **dict.fromkeys(("add_int", "sub_int", "mul_int"), MASK_INT_ARITH)}
_ELEMENTS = {"bool": EL_BOOL, "int32": EL_INT32, "int64": EL_INT64, "float32": EL_FLOAT32}
# the comparison or arithmetic of MASK_COMPARE / MASK_INT_ARITH, in the step's `fn`
_FUNCTIONS = {"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5, "add_int": 0, "sub_int": 1, "mul_int": 2}


cdef inline Py_ssize_t element_bytes(int kind) noexcept nogil:
    return 1 if kind == EL_BOOL else 8 if kind == EL_INT64 else 4


cdef inline int64_t integer_at(const char* p, int kind) noexcept nogil:
    """A bool, int32 or int64 element as an int64: exact."""
    if kind == EL_INT64:
        return (<const int64_t*>p)[0]
    if kind == EL_INT32:
        return (<const int32_t*>p)[0]
    return (<const uint8_t*>p)[0] != 0


ctypedef fused comparable:  # compare_one's two kinds of operand: float32, or an integer widened to int64
    float
    int64_t


cdef inline bint compare_values(comparable x, comparable y, int fn) noexcept nogil:
    """numpy's comparison fn (_FUNCTIONS) of x and y (NaN: only ne holds)."""
    return x == y if fn == 0 else x != y if fn == 1 else x < y if fn == 2 else x <= y if fn == 3 else \
        x > y if fn == 4 else x >= y


cdef inline bint compare_one(const char* p, int ka, const char* q, int kb, int fn) noexcept nogil:
    """compare_values of two elements, both float32 or both integers or bools (the loader allows no other pair),
    these exactly as int64."""
    if ka == EL_FLOAT32:
        return compare_values((<const float*>p)[0], (<const float*>q)[0], fn)
    return compare_values(integer_at(p, ka), integer_at(q, kb), fn)


cdef inline void store_integer(char* q, int kind, uint64_t v) noexcept nogil:
    """v modulo 2**bits of an int32 or int64 output, two's complement."""
    if kind == EL_INT64:
        (<int64_t*>q)[0] = <int64_t>v
    else:
        (<int32_t*>q)[0] = <int32_t><uint32_t>v


cdef inline void cast_one(const char* p, int src, char* q, int dst) noexcept nogil:
    """One element converted as numpy's astype (C's conversion): to bool, x != 0 (NaN: True); an integer to
    float32 rounded to nearest; an integer or bool to int32 or int64 modulo 2**bits."""
    if src == EL_FLOAT32:
        if dst == EL_BOOL:
            (<uint8_t*>q)[0] = (<const float*>p)[0] != 0
        else:
            (<float*>q)[0] = (<const float*>p)[0]
    elif dst == EL_BOOL:
        (<uint8_t*>q)[0] = integer_at(p, src) != 0
    elif dst == EL_FLOAT32:
        (<float*>q)[0] = <float>integer_at(p, src)
    else:
        store_integer(q, dst, <uint64_t>integer_at(p, src))


cdef inline uint64_t arithmetic_one(const char* p, int ka, const char* q, int kb, int fn) noexcept nogil:
    """a + b, a - b or a * b (_FUNCTIONS) modulo 2**64: its low 32 bits are the int32 result's."""
    cdef uint64_t a = <uint64_t>integer_at(p, ka), b = <uint64_t>integer_at(q, kb)
    return a + b if fn == 0 else a - b if fn == 1 else a * b


cdef inline float clamp_one(float x, MaskStep c) noexcept nogil:
    """numpy's maximum(x, lo), then minimum(., hi): x where it is NaN or within the bounds."""
    if c.has_lo and not (x >= c.lo or x != x):
        x = c.lo
    if c.has_hi and not (x <= c.hi or x != x):
        x = c.hi
    return x


ctypedef fused element_bits:  # the moves (copies, choices, gathers) take elements as their bits: 1, 4 or 8 bytes,
    uint8_t  # every dtype the ops that move them take
    uint32_t
    uint64_t

cdef enum:  # what move_elements does
    MOVE_ROW  # y[j] = a[j sa], j < cols
    MOVE_WHERE  # y[j] = b[j sb] if c[j sc] else a[j sa] (c: bools), j < cols
    MOVE_PLANE  # transpose_plane


cdef void transpose_plane(const element_bits* a, Py_ssize_t step, element_bits* y, Py_ssize_t rows,
                          Py_ssize_t cols) noexcept nogil:
    """y[r, c] = a[r + c * step] over a C-contiguous [rows, cols] plane of y, a contiguous along y's rows: by
    blocks of 16 rows of y, each of its columns read as one run of a, so that both sides' lines stay in cache
    (walking y's rows element by element reads a new line of a for each element: a transpose of [12, 128, 128]
    float32 whose x was out of L2, 367 -> 157 us)."""
    cdef Py_ssize_t r0, r, c, n
    for r0 in range(0, rows, 16):
        n = rows - r0 if rows - r0 < 16 else 16
        for c in range(cols):
            for r in range(n):
                y[(r0 + r) * cols + c] = a[r0 + r + c * step]


cdef void move_row(int kind, const element_bits* a, Py_ssize_t sa, element_bits* y, Py_ssize_t rows,
                   Py_ssize_t cols, const uint8_t* c, Py_ssize_t sc, const element_bits* b,
                   Py_ssize_t sb) noexcept nogil:
    """move_elements' loops, strides in elements (a loop of one known element type: the element-by-element
    dispatch on a run-time size it replaced ran DeBERTa's masked_fill over [12, 128, 128] at 2.4 ns an element)."""
    cdef Py_ssize_t j
    cdef element_bits keep
    if kind == MOVE_PLANE:
        transpose_plane(a, sa, y, rows, cols)
    elif kind == MOVE_WHERE:
        # both read, one kept by a mask: no branch on the condition (GCC branched on a ternary of the two, and a
        # random condition ran 3.4x slower)
        for j in range(cols):
            keep = <element_bits>0 - <element_bits>(c[j * sc] != 0)
            y[j] = (b[j * sb] & keep) | (a[j * sa] & ~keep)
    else:
        for j in range(cols):
            y[j] = a[j * sa]


cdef void move_elements(int kind, const char* a, Py_ssize_t sa, char* y, Py_ssize_t rows, Py_ssize_t cols,
                        Py_ssize_t item, const char* c=NULL, Py_ssize_t sc=0, const char* b=NULL,
                        Py_ssize_t sb=0) noexcept nogil:
    """move_row of elements of `item` bytes (1, 4 or 8), the strides of a and b in bytes (c's: bools)."""
    cdef const uint8_t* cond = <const uint8_t*>c
    if item == 8:
        move_row(kind, <const uint64_t*>a, sa // 8, <uint64_t*>y, rows, cols, cond, sc, <const uint64_t*>b, sb // 8)
    elif item == 4:
        move_row(kind, <const uint32_t*>a, sa // 4, <uint32_t*>y, rows, cols, cond, sc, <const uint32_t*>b, sb // 4)
    else:
        move_row(kind, <const uint8_t*>a, sa, <uint8_t*>y, rows, cols, cond, sc, <const uint8_t*>b, sb)


cdef class MaskStep:
    """One mask op at one set of shapes: y (C-contiguous, `shape`) from one to three operands read through
    their byte strides per output dimension (0: broadcast). op: "expand", "permute" (y's dimension d is the
    operand's perm[d]), "logical_and", "logical_or", "logical_not" (bool operands and output), "where" (a bool
    condition, then two operands of y's type), "cast" (element types src to dst, in _ELEMENTS), a comparison
    ("eq" ... "ge": a of type src, b of src2; bool out), integer arithmetic ("add_int", "sub_int", "mul_int": a
    of src, b of src2, y of dst) or "clamp" (float32, bounds lo and hi, None for none, neither 0)."""
    cdef int op, fn, rank, n_in, src, src2, dst
    cdef bint has_lo, has_hi, planes
    cdef float lo, hi
    cdef Py_ssize_t itemsize, out_item
    cdef Py_ssize_t shape[8]
    cdef Py_ssize_t strides[3][8]

    def __init__(self, str op, tuple shape, list operand_shapes, Py_ssize_t itemsize, str src="bool",
                 str dst="bool", lo=None, hi=None, tuple perm=None, str src2="bool"):
        """operand_shapes: each operand's shape, broadcast to `shape` as numpy does (a permute's: permuted by
        perm to `shape`); itemsize: a value operand's element bytes (expand, permute, where, clamp; the other
        ops' operands are of their element types)."""
        cdef int d
        code = _MASK_CODES.get(op)
        operands = 3 if code == MASK_WHERE else 2 if code in (MASK_AND, MASK_OR, MASK_COMPARE, MASK_INT_ARITH) else 1
        if len(shape) > MASK_MAX_RANK or code is None or len(operand_shapes) != operands:
            raise ValueError("MaskStep: unsupported op, rank or operand count")
        self.op, self.fn, self.rank, self.n_in = code, _FUNCTIONS.get(op, 0), len(shape), operands
        self.src, self.src2, self.dst, self.itemsize = _ELEMENTS[src], _ELEMENTS[src2], _ELEMENTS[dst], itemsize
        if code == MASK_CAST and self.src == EL_FLOAT32 and self.dst not in (EL_BOOL, EL_FLOAT32):
            raise ValueError("MaskStep: a cast it does not run")  # float to integer: undefined out of range
        if code == MASK_INT_ARITH and (EL_FLOAT32 in (self.src, self.src2) or self.dst not in (EL_INT32, EL_INT64)):
            raise ValueError("MaskStep: integer arithmetic of other types")
        if code in (MASK_COPY, MASK_WHERE) and itemsize not in (1, 4, 8):
            raise ValueError("MaskStep: elements of a size no op it runs takes")
        if code in (MASK_COPY, MASK_WHERE, MASK_CLAMP):
            self.out_item = itemsize
        elif code in (MASK_CAST, MASK_INT_ARITH):
            self.out_item = element_bytes(self.dst)
        else:
            self.out_item = 1
        if code == MASK_CLAMP:
            if lo == 0 or hi == 0 or itemsize != 4:  # a zero bound: numpy's result may be either zero
                raise ValueError("MaskStep: a clamp it does not run")
            self.has_lo, self.has_hi = lo is not None, hi is not None
            self.lo, self.hi = (lo if self.has_lo else 0), (hi if self.has_hi else 0)
        for d in range(self.rank):
            self.shape[d] = shape[d]
        if op == "permute":
            self.permuted(operand_shapes[0], perm)
        else:
            self.broadcast(code, operand_shapes, itemsize)
        # a copy whose operand runs along y's next-to-last dimension, not its last: a transpose, plane by plane
        self.planes = code == MASK_COPY and self.rank >= 2 and \
            self.strides[0][self.rank - 2] == itemsize and self.strides[0][self.rank - 1] != itemsize

    cdef broadcast(self, int code, list operand_shapes, Py_ssize_t itemsize):
        """The operands' strides, broadcast to the output's shape as numpy does."""
        cdef int d, k
        cdef Py_ssize_t step
        if code in (MASK_CAST, MASK_COMPARE, MASK_INT_ARITH):
            items = [element_bytes(self.src), element_bytes(self.src2)]
        elif code == MASK_WHERE:
            items = [1, itemsize, itemsize]
        elif code in (MASK_AND, MASK_OR, MASK_NOT):
            items = [1, 1]
        else:
            items = [itemsize]
        for k, s in enumerate(operand_shapes):
            if len(s) > self.rank:
                raise ValueError("MaskStep: an operand of higher rank than the output")
            step = items[k]
            for d in reversed(range(self.rank)):
                i = d - self.rank + len(s)
                size = s[i] if i >= 0 else 1
                if size != self.shape[d] and size != 1:
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
        cdef int body = 2 if self.planes else 1  # y's dimensions one pass of the loop writes, and their bytes:
        cdef Py_ssize_t written = (self.shape[self.rank - 2] if self.planes else 1) * inner * self.out_item
        for d in range(self.rank):
            idx[d] = 0
        while True:
            if self.planes:
                move_elements(MOVE_PLANE, pa, sa, y, self.shape[self.rank - 2], inner, self.itemsize)
            elif self.op == MASK_COPY:
                if sa == self.itemsize:
                    memcpy(y, pa, inner * self.itemsize)
                else:
                    move_elements(MOVE_ROW, pa, sa, y, 1, inner, self.itemsize)
            elif self.op == MASK_AND:
                for j in range(inner):
                    (<uint8_t*>y)[j] = (<const uint8_t*>pa)[j * sa] != 0 and (<const uint8_t*>pb)[j * sb] != 0
            elif self.op == MASK_OR:
                for j in range(inner):
                    (<uint8_t*>y)[j] = (<const uint8_t*>pa)[j * sa] != 0 or (<const uint8_t*>pb)[j * sb] != 0
            elif self.op == MASK_NOT:
                for j in range(inner):
                    (<uint8_t*>y)[j] = (<const uint8_t*>pa)[j * sa] == 0
            elif self.op == MASK_WHERE:  # a: the condition; b where it holds, else c
                move_elements(MOVE_WHERE, pc, sc, y, 1, inner, self.itemsize, pa, sa, pb, sb)
            elif self.op == MASK_CAST:
                for j in range(inner):
                    cast_one(pa + j * sa, self.src, y + j * self.out_item, self.dst)
            elif self.op == MASK_COMPARE:
                for j in range(inner):
                    (<uint8_t*>y)[j] = compare_one(pa + j * sa, self.src, pb + j * sb, self.src2, self.fn)
            elif self.op == MASK_INT_ARITH:
                for j in range(inner):
                    store_integer(y + j * self.out_item, self.dst,
                                  arithmetic_one(pa + j * sa, self.src, pb + j * sb, self.src2, self.fn))
            else:
                for j in range(inner):
                    (<float*>y)[j] = clamp_one((<const float*>(pa + j * sa))[0], self)
            y += written
            # the next row (plane): the odometer over the dimensions before the last (two)
            d = self.rank - 1 - body
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


cdef void gather_blocks(const element_bits* x, const int64_t* index, element_bits* y, Py_ssize_t outer,
                        Py_ssize_t n_x, Py_ssize_t n_index, Py_ssize_t inner, Py_ssize_t period) noexcept nogil:
    """y[o, j, i] = x[o, index[o % period, j, i], i]: each index already checked."""
    cdef Py_ssize_t o, j, i, k, block = n_index * inner
    cdef const element_bits* row
    cdef const int64_t* part
    for o in range(outer):
        row = x + o * n_x * inner
        part = index + o % period * block
        for j in range(n_index):
            for i in range(inner):
                k = j * inner + i
                y[k] = row[part[k] * inner + i]
        y += block


cdef Py_ssize_t gather_checked(const char* x, const int64_t* index, char* y, Py_ssize_t outer, Py_ssize_t n_x,
                               Py_ssize_t n_index, Py_ssize_t inner, Py_ssize_t item,
                               Py_ssize_t period) noexcept nogil:
    """gather_blocks of elements of `item` bytes (1, 4 or 8) after every index is checked, the index's period
    outer blocks of n_index * inner read again and again (period divides outer): -1, or the flat position in the
    index of the first outside [0, n_x) (then y is not written)."""
    cdef Py_ssize_t k, total = period * n_index * inner
    for k in range(total):
        if index[k] < 0 or index[k] >= n_x:
            return k
    if item == 4:
        gather_blocks(<const uint32_t*>x, index, <uint32_t*>y, outer, n_x, n_index, inner, period)
    elif item == 8:
        gather_blocks(<const uint64_t*>x, index, <uint64_t*>y, outer, n_x, n_index, inner, period)
    else:
        gather_blocks(<const uint8_t*>x, index, <uint8_t*>y, outer, n_x, n_index, inner, period)
    return -1


def gather_rows(x, const int64_t[::1] index, Py_ssize_t outer, Py_ssize_t n_x, Py_ssize_t n_index,
                Py_ssize_t inner, y) -> int:
    """gather as [outer, n, inner] blocks: y[o, j, i] = x[o, index[o, j, i], i], x and y C-contiguous arrays of one
    dtype (1, 4 or 8 bytes an element) holding outer * n_x * inner and outer * n_index * inner elements, index the
    latter's count. Every index is checked before any is read: returns -1, or the flat position of the first
    outside [0, n_x) (then y is not written)."""
    cdef Py_ssize_t item = x.itemsize, bad = -1, total = outer * n_index * inner
    if index.shape[0] != total or x.size != outer * n_x * inner or y.size != total or y.dtype != x.dtype \
            or item not in (1, 4, 8):
        raise ValueError("gather_rows: sizes or dtypes do not agree")
    if total == 0:
        return -1
    cdef const char* xs = <const char*><size_t>x.ctypes.data
    cdef char* ys = <char*><size_t>y.ctypes.data
    with nogil:
        bad = gather_checked(xs, &index[0], ys, outer, n_x, n_index, inner, item, outer)
    return bad


cdef class GatherStep:
    """gather at one pair of shapes whose index spans x outside dim, as an execution plan runs it: gather_checked
    over [outer, n, inner] blocks, the index given whole, or as its first `period` outer blocks where it repeats
    them (a fixed index expanded over leading dimensions: DeBERTa's relative positions, one [L, L] block for every
    head). run() returns 1, writing nothing, if an index lies outside x (the per-node step then names it)."""
    cdef Py_ssize_t outer, n_x, n_index, inner, item, period

    def __init__(self, tuple x, tuple index, int dim, Py_ssize_t itemsize, period=None):
        if len(x) != len(index) or not 0 <= dim < len(x) or itemsize not in (1, 4, 8) or \
                any(i != n for d, (i, n) in enumerate(zip(index, x)) if d != dim) or math.prod(index) == 0:
            raise ValueError("GatherStep: shapes it does not run")
        self.outer, self.inner = math.prod(x[:dim]), math.prod(x[dim + 1:])
        self.n_x, self.n_index, self.item = x[dim], index[dim], itemsize
        self.period = self.outer if period is None else period
        if not 0 < self.period <= self.outer or self.outer % self.period:
            raise ValueError("GatherStep: a period that does not divide the outer blocks")

    cdef int run(self, const char* x, const int64_t* index, char* y) noexcept nogil:
        return gather_checked(x, index, y, self.outer, self.n_x, self.n_index, self.inner, self.item,
                              self.period) >= 0


cdef class CumsumStep:
    """cumsum at one shape, as an execution plan runs it: x (bool, int32 or int64) as [outer, n, inner] blocks,
    y[o, t, i] = the int64 sum of x[o, 0..t, i], modulo 2**64 (qrt/mask_ops.py's; the order is immaterial)."""
    cdef Py_ssize_t outer, n, inner
    cdef int src

    def __init__(self, tuple view, str src):
        self.outer, self.n, self.inner = view
        self.src = _ELEMENTS[src]
        if self.src == EL_FLOAT32:
            raise ValueError("CumsumStep: integer or bool x only")

    cdef void run(self, const char* x, int64_t* y) noexcept nogil:
        cdef Py_ssize_t o, t, i, k = 0, item = element_bytes(self.src)
        for o in range(self.outer):
            for t in range(self.n):
                for i in range(self.inner):
                    y[k] = <int64_t>((<uint64_t>y[k - self.inner] if t else 0) + <uint64_t>integer_at(x + k * item,
                                                                                                       self.src))
                    k += 1


cdef void interleave(const element_bits** x, Py_ssize_t n_in, Py_ssize_t outer, element_bits* y) noexcept nogil:
    """y[o, k] = x[k][o]: a stack of operands along a new last dimension."""
    cdef Py_ssize_t o, k
    for o in range(outer):
        for k in range(n_in):
            y[o * n_in + k] = x[k][o]


cdef class CatStep:
    """cat or stack of up to four arrays of one dtype at one set of shapes, as an execution plan runs it: in each
    of `outer` blocks of y, each operand's own block of bytes in turn (numpy's concatenate and stack); blocks of
    one element of 4 or 8 bytes (a stack along a new last dimension: RoFormer's rotary pairs) as one loop of
    elements."""
    cdef Py_ssize_t outer, n_in, item
    cdef Py_ssize_t block[4]

    def __init__(self, Py_ssize_t outer, tuple blocks, Py_ssize_t itemsize):
        if not 1 <= len(blocks) <= 4 or outer < 0 or min(blocks) < 0:
            raise ValueError("CatStep: one to four operands")
        self.outer, self.n_in = outer, len(blocks)
        self.item = itemsize if itemsize in (4, 8) and set(blocks) == {itemsize} else 0
        for k, b in enumerate(blocks):
            self.block[k] = b

    cdef void run(self, const char** x, char* y) noexcept nogil:
        cdef Py_ssize_t o, k
        if self.item == 4:
            interleave(<const uint32_t**>x, self.n_in, self.outer, <uint32_t*>y)
            return
        if self.item == 8:
            interleave(<const uint64_t**>x, self.n_in, self.outer, <uint64_t*>y)
            return
        for o in range(self.outer):
            for k in range(self.n_in):
                copy_block(y, x[k] + o * self.block[k], self.block[k])
                y += self.block[k]
