# ------------------------------------------------------------ matmul and attention (included by _kernels.pyx)
#
# The kernels are in qrt/kernels/attention_body.h; these wrappers check the sizes and offsets they are handed,
# split the work across threads by whole output rows (each output its own chain: no result depends on the
# split), and run without the GIL. The callers (qrt/cpu/attention.py) broadcast the batch dimensions into
# per-batch element offsets.

cdef extern from "attention.h" nogil:
    ctypedef struct qrt_attention_ops:
        const char* name
        void (*matmul)(const float* a, const float* b, float* y, ptrdiff_t m, ptrdiff_t k,
                       ptrdiff_t n, float* scratch) noexcept nogil
        void (*attention)(const float* q, ptrdiff_t ldq, const float* k, ptrdiff_t ldk, const float* v,
                          ptrdiff_t ldv, const void* mask, int mask_kind, ptrdiff_t mask_stride, float scale,
                          int causal, ptrdiff_t row0, ptrdiff_t l, ptrdiff_t s, ptrdiff_t e, ptrdiff_t ev, float* y,
                          ptrdiff_t ldy, float* scratch) noexcept nogil
    const qrt_attention_ops* qrt_attention_ops_for(const char* kernel_variant)
    ptrdiff_t qrt_attention_scratch(ptrdiff_t s, ptrdiff_t e, ptrdiff_t ev)
    ptrdiff_t qrt_matmul_scratch(ptrdiff_t k)
    enum:
        QRT_MASK_NONE, QRT_MASK_BOOL, QRT_MASK_FLOAT, QRT_MM_TAIL


cdef struct attention_job:  # `units` output rows (batches of l rows each), task t the t-th chunk of them
    const qrt_attention_ops* ops
    const float* q
    const float* k
    const float* v
    const char* mask
    const int64_t* q_off  # per batch: where its q, k, v, mask and y start (elements)
    const int64_t* k_off
    const int64_t* v_off
    const int64_t* m_off
    const int64_t* y_off  # NULL: y is [batches, l, ev], contiguous
    int mask_kind, causal
    Py_ssize_t mask_size, mask_stride
    float scale
    Py_ssize_t l, s, e, ev, units, parts
    Py_ssize_t ldq, ldk, ldv, ldy  # the rows of each matrix lie this many floats apart
    float* y
    # qrt_attention_scratch(s, e, ev) floats per task, from a 64-byte boundary (16 floats more allocated): then
    # each task's scratch and score row start on a cache line too (attention.h pads both to whole lines). Left where
    # the allocator put it, the same code ran 12 heads at L=S=112 in 176 us in one checkout and 187-196 us in
    # another (pinned, one thread); on a line, 176-181 us in both.
    float* scratch


cdef void attention_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef attention_job* j = <attention_job*>ctx
    cdef Py_ssize_t u = chunk(j.units, j.parts, t), end = chunk(j.units, j.parts, t + 1), b, r0, r1, y0
    cdef float* scratch = j.scratch + t * qrt_attention_scratch(j.s, j.e, j.ev)
    cdef const char* mask
    while u < end:
        b, r0 = u // j.l, u % j.l
        r1 = min(j.l, r0 + end - u)
        mask = NULL
        if j.mask_kind != QRT_MASK_NONE:
            mask = j.mask + (j.m_off[b] + r0 * j.mask_stride) * j.mask_size
        y0 = j.y_off[b] if j.y_off != NULL else b * j.l * j.ev
        j.ops.attention(j.q + j.q_off[b] + r0 * j.ldq, j.ldq, j.k + j.k_off[b], j.ldk, j.v + j.v_off[b], j.ldv, mask,
                        j.mask_kind, j.mask_stride, j.scale, j.causal, r0, r1 - r0, j.s, j.e, j.ev,
                        j.y + y0 + r0 * j.ldy, j.ldy, scratch)
        u += r1 - r0


cdef struct matmul_job:  # `units` output rows (batches of m rows each), task t the t-th chunk of them
    const qrt_attention_ops* ops
    const float* a
    const float* b
    const int64_t* a_off
    const int64_t* b_off
    Py_ssize_t m, k, n, units, parts
    float* y
    float* scratch  # qrt_matmul_scratch(k) floats per task where n is off QRT_MM_TAIL, else NULL


cdef void matmul_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef matmul_job* j = <matmul_job*>ctx
    cdef Py_ssize_t u = chunk(j.units, j.parts, t), end = chunk(j.units, j.parts, t + 1), b, r0, r1
    cdef float* scratch = j.scratch + t * qrt_matmul_scratch(j.k) if j.scratch != NULL else NULL
    while u < end:
        b, r0 = u // j.m, u % j.m
        r1 = min(j.m, r0 + end - u)
        j.ops.matmul(j.a + j.a_off[b] + r0 * j.k, j.b + j.b_off[b], j.y + (b * j.m + r0) * j.n, r1 - r0, j.k, j.n,
                     scratch)
        u += r1 - r0


cdef Py_ssize_t row_parts(Py_ssize_t rows, int64_t work) noexcept nogil:
    """Tasks for `rows` output rows costing `work` multiply-adds in all."""
    return max(1, min(<Py_ssize_t>num_threads, rows, <Py_ssize_t>(work // MIN_WORK_F16)))


cdef void check_offsets(str what, const int64_t[::1] off, Py_ssize_t batches, Py_ssize_t size, Py_ssize_t each):
    """Every batch's block of `each` elements lies inside the operand's `size`."""
    cdef Py_ssize_t i
    if off.shape[0] != batches:
        raise ValueError(f"AttentionOps: {what} has {off.shape[0]} offsets for {batches} batches")
    for i in range(batches):
        if off[i] < 0 or off[i] + each > size:
            raise ValueError(f"AttentionOps: {what}'s batch {i} lies outside it")


cdef inline const float* first(const float[::1] a) noexcept:
    """The array's data, NULL when empty (then the kernels read none of it)."""
    if a.shape[0] == 0:
        return NULL
    return &a[0]


cdef class AttentionOps:
    """The float32 matrix product and attention kernels of the build the active kernel variant calls for when
    created (the float ops' choice: plain C, AVX2 + FMA, AVX-512): the same bits every way."""

    cdef const qrt_attention_ops* ops

    def __cinit__(self):
        self.ops = qrt_attention_ops_for(active.name)

    @property
    def name(self) -> str:
        return self.ops.name.decode()

    def matmul(self, const float[::1] a, const int64_t[::1] a_off, const float[::1] b, const int64_t[::1] b_off,
               float[:, :, ::1] y, Py_ssize_t k) -> None:
        """y[i] = a[i] @ b[i], a[i] the [m, k] matrix at a[a_off[i]:], b[i] the [k, n] one at b[b_off[i]:]."""
        cdef Py_ssize_t batches = y.shape[0], m = y.shape[1], n = y.shape[2]
        if k < 0:
            raise ValueError("AttentionOps.matmul: k < 0")
        check_offsets("a", a_off, batches, a.shape[0], m * k)
        check_offsets("b", b_off, batches, b.shape[0], k * n)
        if batches * m * n == 0:
            return
        cdef matmul_job j = matmul_job(self.ops, first(a), first(b),
                                       &a_off[0], &b_off[0], m, k, n, batches * m, 1, &y[0, 0, 0], NULL)
        cdef int err
        with nogil:
            err = run_matmul(&j)
        if err:
            raise MemoryError()

    def attention(self, const float[::1] q, const int64_t[::1] q_off, const float[::1] k, const int64_t[::1] k_off,
                  const float[::1] v, const int64_t[::1] v_off, mask, const int64_t[::1] m_off,
                  Py_ssize_t mask_stride, float scale, bint causal, float[:, :, ::1] y, Py_ssize_t s,
                  Py_ssize_t e) -> None:
        """y[i] = softmax(scale q[i] k[i]^T + mask[i]) v[i] (attention.h): q[i] [l, e] at q[q_off[i]:], k[i] [s, e],
        v[i] [s, ev]; mask None, or a flat bool or float32 array whose batch i has l rows of s values, mask_stride
        (0 or s) apart, from m_off[i] on."""
        cdef Py_ssize_t batches = y.shape[0], l = y.shape[1], ev = y.shape[2]
        cdef const uint8_t[::1] mask_bytes = None
        cdef int kind = QRT_MASK_NONE
        if s < 0 or e < 0 or mask_stride not in (0, s):
            raise ValueError("AttentionOps.attention: bad sizes")
        check_offsets("q", q_off, batches, q.shape[0], l * e)
        check_offsets("k", k_off, batches, k.shape[0], s * e)
        check_offsets("v", v_off, batches, v.shape[0], s * ev)
        if mask is not None:
            if mask.dtype == np.bool_:
                kind = QRT_MASK_BOOL
            elif mask.dtype == np.float32:
                kind = QRT_MASK_FLOAT
            else:
                raise ValueError(f"AttentionOps.attention: a mask must be bool or float32, got {mask.dtype}")
            mask_bytes = np.ascontiguousarray(mask).reshape(-1).view(np.uint8)
            check_offsets("mask", m_off, batches, mask.size, (l - 1) * mask_stride + s if l else 0)
            if s == 0:  # no key, no mask value read
                kind = QRT_MASK_NONE
        if batches * l * ev == 0:
            return
        cdef Py_ssize_t parts = row_parts(batches * l, <int64_t>batches * l * s * (e + ev))
        scratch = np.empty(parts * qrt_attention_scratch(s, e, ev) + 17, np.float32)
        cdef float[::1] sv = scratch
        cdef attention_job j = attention_job(
            self.ops, first(q), first(k), first(v), NULL, &q_off[0], &k_off[0], &v_off[0], NULL, NULL, kind, causal,
            4 if kind == QRT_MASK_FLOAT else 1, mask_stride, scale, l, s, e, ev, batches * l, parts, e, e, ev, ev,
            &y[0, 0, 0], <float*>next_line(<size_t>&sv[0]))
        if kind != QRT_MASK_NONE:
            j.mask, j.m_off = <const char*>&mask_bytes[0], &m_off[0]
        with nogil:
            if parts == 1:
                attention_task(&j, 0)
            else:
                qrt_parallel_for(parts, <int>parts - 1, attention_task, &j)


cdef int run_matmul(matmul_job* j) noexcept nogil:
    """j's product (every field set but parts and scratch) split by output rows; -1 when out of memory for the
    tasks' scratch."""
    j.parts = row_parts(j.units, <int64_t>j.units * j.n * j.k)
    j.scratch = NULL
    if j.n % QRT_MM_TAIL:
        j.scratch = <float*>malloc((j.parts * qrt_matmul_scratch(j.k) + 1) * sizeof(float))  # + 1: never malloc(0)
        if j.scratch == NULL:
            return -1
    if j.parts == 1:
        matmul_task(j, 0)
    else:
        qrt_parallel_for(j.parts, <int>j.parts - 1, matmul_task, j)
    free(j.scratch)
    return 0


cdef class MatmulStep:
    """A matmul node at one pair of shapes, as an execution plan runs it (qrt/plan.py): AttentionOps.matmul over
    raw pointers, with each output batch's offsets into a and b (qrt/cpu/attention.py's product), checked here
    against the operands' sizes; run() trusts them."""
    cdef object keep  # the offset arrays
    cdef matmul_job job  # every field but the pointers, the split and the scratch

    def __init__(self, AttentionOps kernel, Py_ssize_t m, Py_ssize_t k, Py_ssize_t n, a_off, Py_ssize_t a_size,
                 b_off, Py_ssize_t b_size):
        """a_off, b_off: per output batch, where its [m, k] and [k, n] matrices start in a (a_size elements)
        and b (b_size)."""
        cdef const int64_t[::1] ao = np.ascontiguousarray(a_off, np.int64)
        cdef const int64_t[::1] bo = np.ascontiguousarray(b_off, np.int64)
        cdef Py_ssize_t batches = ao.shape[0]
        if min(m, k, n) < 0 or batches * m * n == 0:
            raise ValueError("MatmulStep: bad sizes")
        check_offsets("a", ao, batches, a_size, m * k)
        check_offsets("b", bo, batches, b_size, k * n)
        self.keep = (ao, bo)
        self.job = matmul_job(kernel.ops, NULL, NULL, &ao[0], &bo[0], m, k, n, batches * m, 1, NULL, NULL)

    cdef int run(self, const float* a, const float* b, float* y) noexcept nogil:
        """0, or -1 when out of memory for the tasks' scratch."""
        cdef matmul_job j = self.job  # a copy: calls on several threads at once
        j.a, j.b, j.y = a, b, y
        return run_matmul(&j)


cdef class AttentionStep:
    """An attention node at one set of shapes, as an execution plan runs it (qrt/plan.py): AttentionOps.attention
    over raw pointers, its operands read and its output written in place with row strides, so the heads of a
    [B, L, heads * E] linear output are read without a copy and the context is written as [B, L, heads * Ev]
    (qrt/cpu/attention.py's native_attention works out the offsets). The offsets were checked against the
    operands' sizes here; run() trusts them."""
    cdef const qrt_attention_ops* ops
    cdef object keep  # the offset arrays
    cdef attention_job job  # every field but the pointers and the split

    def __init__(self, AttentionOps kernel, tuple sizes, tuple operands, mask, object y, float scale,
                 bint causal):
        """sizes: (batches, l, s, e, ev); operands: (offsets, row stride, elements) of q, k, v; mask: None or
        (offsets, row stride 0 or s, elements, itemsize 1 (bool) or 4 (float32)); y: (offsets, row stride,
        elements)."""
        cdef Py_ssize_t batches, l, s, e, ev
        batches, l, s, e, ev = sizes
        if min(sizes) < 0 or batches * l * ev == 0 or mask is not None and mask[1] not in (0, s):
            raise ValueError("AttentionStep: bad sizes")
        offsets = []
        for name, (off, ld, size), rows, width in zip(("q", "k", "v", "y"), operands + (y,), (l, s, s, l),
                                                     (e, e, ev, ev)):
            off = np.ascontiguousarray(off, np.int64)
            if ld < width:
                raise ValueError(f"AttentionStep: {name}'s rows overlap")
            check_offsets(name, off, batches, size, (rows - 1) * ld + width if rows else 0)
            offsets.append(off)
        self.ops = kernel.ops
        self.job = attention_job(self.ops, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, QRT_MASK_NONE,
                                 causal, 1, 0, scale, l, s, e, ev, batches * l, 1, operands[0][1], operands[1][1],
                                 operands[2][1], y[1], NULL, NULL)
        if mask is not None and s > 0:  # no key, no mask value read
            m_off = np.ascontiguousarray(mask[0], np.int64)
            check_offsets("mask", m_off, batches, mask[2], (l - 1) * mask[1] + s if l else 0)
            offsets.append(m_off)
            self.job.mask_kind = QRT_MASK_BOOL if mask[3] == 1 else QRT_MASK_FLOAT
            self.job.mask_size, self.job.mask_stride = mask[3], mask[1]
        self.keep = offsets
        cdef const int64_t[::1] o
        for k, off in enumerate(offsets):
            o = off
            if k == 0:
                self.job.q_off = &o[0]
            elif k == 1:
                self.job.k_off = &o[0]
            elif k == 2:
                self.job.v_off = &o[0]
            elif k == 3:
                self.job.y_off = &o[0]
            else:
                self.job.m_off = &o[0]

    cdef int run(self, const float* q, const float* k, const float* v, const void* mask, float* y) noexcept nogil:
        """0, or -1 when out of memory for the tasks' scratch."""
        cdef attention_job j = self.job
        j.q, j.k, j.v, j.mask, j.y = q, k, v, <const char*>mask, y
        j.parts = row_parts(j.units, <int64_t>j.units * j.s * (j.e + j.ev))
        cdef float* mem = <float*>malloc((j.parts * qrt_attention_scratch(j.s, j.e, j.ev) + 17) * sizeof(float))
        if mem == NULL:
            return -1
        j.scratch = <float*>next_line(<size_t>mem)
        if j.parts == 1:
            attention_task(&j, 0)
        else:
            qrt_parallel_for(j.parts, <int>j.parts - 1, attention_task, &j)
        free(mem)
        return 0
