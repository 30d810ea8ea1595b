# ------------------------------------------------------------ float32 math ops (included by _kernels.pyx)
#
# The kernels are in qrt/kernels/float_ops_body.h; these wrappers check the sizes they are handed, split
# large calls across threads by whole rows (elements for unary ops, the first output dimension that is not 1 for
# binary ones), and run without the GIL. Callers (qrt/cpu/float_ops.py)
# pass contiguous float32 arrays and outputs of the right shape.

cdef extern from "float_ops.h" nogil:
    ctypedef struct qrt_float_ops:
        const char* name
        void (*unary)(int op, const float* x, float* y, ptrdiff_t n) noexcept nogil
        void (*binary)(int op, const float* a, const ptrdiff_t* a_shape, const float* b, const ptrdiff_t* b_shape,
                       float* y, int rank) noexcept nogil
        void (*softmax)(int log, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n,
                        ptrdiff_t inner) noexcept nogil
        void (*sum)(int mean, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n, ptrdiff_t inner) noexcept nogil
        void (*layer_norm)(const float* x, const float* x2, const float* w, const float* b, float eps, float* y,
                           ptrdiff_t rows, ptrdiff_t n) noexcept nogil
        void (*batch_norm)(const float* x, const float* alpha, const float* beta, float* y, ptrdiff_t outer,
                           ptrdiff_t channels, ptrdiff_t inner) noexcept nogil
    const qrt_float_ops* qrt_float_ops_for(const char* kernel_variant)
    float qrt_batch_norm_alpha(float var, float w, float eps)
    float qrt_batch_norm_beta(float mean, float alpha, float b)
    enum:
        QRT_SIGMOID, QRT_TANH, QRT_SILU, QRT_GELU, QRT_GELU_TANH, QRT_SQRT, QRT_RSQRT, QRT_LOG, QRT_SIN, QRT_COS, QRT_CEIL, QRT_FLOOR
        QRT_ADD, QRT_SUB, QRT_MUL, QRT_DIV
        QRT_BINARY_MAX_RANK

cdef extern from "float_math.h" nogil:
    float qrt_silu(float x)
    float qrt_gelu_tanh(float x)
    float qrt_logf(float x)
    float qrt_sinf(float x)
    float qrt_cosf(float x)

cdef extern from "torch_gelu.h" nogil:
    float qrt_gelu_onednn(float x)

UNARY_OPS = {"sigmoid": QRT_SIGMOID, "tanh": QRT_TANH, "silu": QRT_SILU, "gelu": QRT_GELU,
             "gelu_tanh": QRT_GELU_TANH, "sqrt": QRT_SQRT, "rsqrt": QRT_RSQRT, "log": QRT_LOG,
             "sin": QRT_SIN, "cos": QRT_COS, "ceil": QRT_CEIL, "floor": QRT_FLOOR}
BINARY_OPS = {"add": QRT_ADD, "sub": QRT_SUB, "mul": QRT_MUL, "div": QRT_DIV}

# Work per task, in an add's elements (one is about 0.14 ns at 128 x 384 on any build: the add waits on memory),
# below which a float op stays on one thread: a task of about 2 us. bench/float_split.py at 2 threads (workers
# spinning, as between a model's steps; fastest samples of two runs, the machine loaded by other jobs), avx512:
# split, layer_norm 32 x 384 (3.1-3.3 us) gained 1.06-1.19x, 64 x 384 1.13-1.48x, 128 x 384 1.60-1.66x; the
# add 64 x 384 (4 us) nothing, 128 x 384 1.08-1.25x.
cdef Py_ssize_t MIN_FLOAT_WORK = 1 << 14

# An element's time over an add's (128 x 384, 1 thread, bench/float_split.py), rounded down to a power of 2, per
# float build: a costlier step spreads across threads sooner. Measured (sigmoid, tanh, silu, gelu, gelu_tanh, sqrt,
# rsqrt, layer_norm): avx512 2.8, 3.0, 3.3, 1.7, 7.1, 7.0, 13.9, 1.6; fma 4.7, 4.9, 6.2, 5.6-8.3, 9.2-14, 7.4, 14.7,
# 2.1; portable 99, 105, 115, 35-64, 122, 6.6, 13.1, 16-33 (gelu and layer_norm over 32 to 128 x 384 and
# 128 x 1536: the lowest; sqrt of x >= 0: GCC keeps it scalar for errno, and a negative x calls libm, 45x); log (msun's
# logf, scalar on every build: 32 to 128 x 384 and 128 x 1536) avx512 16.9-49.5, fma 17.2-43.1, portable 17.5-40.3;
# sin and cos (float_math.h, scalar; rotary angles and values of |x| up to 10) 14 to 180 on every build, measured while
# another job ran, so 16; ceil and floor (one vector rounding an element, as the add's one operation) 1.
# The layer_norm that forms a residual add costs one more (measured 0.6-1.5 more).
FLOAT_COSTS = {  # UNARY_OPS' codes in order (sigmoid, ..., rsqrt, log, sin, cos, ceil, floor), then layer_norm
    "avx512": (2, 2, 2, 1, 4, 4, 8, 16, 16, 16, 1, 1, 1),
    "fma": (4, 4, 4, 4, 8, 4, 8, 16, 16, 16, 1, 1, 2),
    "portable": (64, 64, 64, 32, 64, 4, 8, 16, 16, 16, 1, 1, 16),
}
cdef enum:
    COST_LAYER_NORM = QRT_FLOOR + 1


def _set_min_float_work(Py_ssize_t n) -> int:
    """Set the float ops' work per task (an add's elements); returns the old one (tests and bench A/Bs: 1 splits
    all work)."""
    global MIN_FLOAT_WORK
    old, MIN_FLOAT_WORK = MIN_FLOAT_WORK, max(n, 1)
    return old


cdef inline Py_ssize_t float_parts(Py_ssize_t units, Py_ssize_t work) noexcept nogil:
    """Tasks for `units` independent rows holding `work` in all (elements times the step's cost, FLOAT_COSTS)."""
    return max(1, min(<Py_ssize_t>num_threads, units, work // MIN_FLOAT_WORK))


cdef enum:
    FLOAT_UNARY, FLOAT_SOFTMAX, FLOAT_SUM, FLOAT_LAYER_NORM, FLOAT_BATCH_NORM


cdef struct float_job:  # one op over `units` rows (elements for unary), task t the t-th chunk of them
    const qrt_float_ops* ops
    int what, code
    const float* x
    const float* x2  # FLOAT_LAYER_NORM: added to x first (NULL for none)
    float* y
    const float* w  # FLOAT_BATCH_NORM: alpha
    const float* b  # FLOAT_BATCH_NORM: beta
    float eps
    Py_ssize_t units, n, inner, parts


cdef void float_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef float_job* j = <float_job*>ctx
    cdef Py_ssize_t a = chunk(j.units, j.parts, t), count = chunk(j.units, j.parts, t + 1) - a
    if j.what == FLOAT_UNARY:
        j.ops.unary(j.code, j.x + a, j.y + a, count)
    elif j.what == FLOAT_SOFTMAX:
        j.ops.softmax(j.code, j.x + a * j.n * j.inner, j.y + a * j.n * j.inner, count, j.n, j.inner)
    elif j.what == FLOAT_SUM:
        j.ops.sum(j.code, j.x + a * j.n * j.inner if j.x != NULL else NULL, j.y + a * j.inner, count, j.n, j.inner)
    elif j.what == FLOAT_LAYER_NORM:
        j.ops.layer_norm(j.x + a * j.n, j.x2 + a * j.n if j.x2 != NULL else NULL, j.w, j.b, j.eps, j.y + a * j.n,
                         count, j.n)
    else:
        j.ops.batch_norm(j.x + a * j.n * j.inner, j.w, j.b, j.y + a * j.n * j.inner, count, j.n, j.inner)


cdef void run_float(const qrt_float_ops* ops, int what, int code, const float* x, const float* x2, float* y,
                    const float* w, const float* b, float eps, Py_ssize_t units, Py_ssize_t n, Py_ssize_t inner,
                    Py_ssize_t parts) noexcept nogil:
    cdef float_job j = float_job(ops, what, code, x, x2, y, w, b, eps, units, n, inner, parts)
    if parts == 1:
        float_task(&j, 0)
    else:
        qrt_parallel_for(parts, <int>parts - 1, float_task, &j)


cdef struct binary_job:  # a binary op split along dimension k, the first of the output's that is not 1
    const qrt_float_ops* ops
    int code, rank, k
    const float* a
    const float* b
    float* y
    ptrdiff_t a_shape[QRT_BINARY_MAX_RANK]
    ptrdiff_t b_shape[QRT_BINARY_MAX_RANK]
    Py_ssize_t a_step, b_step, y_step, units, parts  # floats per index of dimension k (0: broadcast)


cdef void binary_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef binary_job* j = <binary_job*>ctx
    cdef Py_ssize_t r = chunk(j.units, j.parts, t), count = chunk(j.units, j.parts, t + 1) - r
    cdef ptrdiff_t a_shape[QRT_BINARY_MAX_RANK]
    cdef ptrdiff_t b_shape[QRT_BINARY_MAX_RANK]
    cdef int d
    for d in range(j.rank):
        a_shape[d] = j.a_shape[d]
        b_shape[d] = j.b_shape[d]
    if a_shape[j.k] != 1:
        a_shape[j.k] = count
    if b_shape[j.k] != 1:
        b_shape[j.k] = count
    j.ops.binary(j.code, j.a + r * j.a_step, a_shape, j.b + r * j.b_step, b_shape, j.y + r * j.y_step, j.rank)


cdef int set_binary(binary_job* j, const qrt_float_ops* ops, int code, tuple a, tuple b, tuple y) except -1:
    """j: y = a op b for operands and output of these shapes (numpy broadcasting; ValueError if they do not
    match), split along the first output dimension that is not 1; its pointers are run_binary's."""
    cdef int rank = len(y), k
    if rank > QRT_BINARY_MAX_RANK or len(a) > rank or len(b) > rank:
        raise ValueError("FloatOps.binary: rank mismatch")
    j.ops, j.code, j.rank, j.k = ops, code, rank, 0
    for k in range(rank):
        j.a_shape[k] = a[k - rank + len(a)] if k >= rank - len(a) else 1
        j.b_shape[k] = b[k - rank + len(b)] if k >= rank - len(b) else 1
        if y[k] != (j.b_shape[k] if j.a_shape[k] == 1 else j.a_shape[k]) or (
            j.a_shape[k] != j.b_shape[k] and j.a_shape[k] != 1 and j.b_shape[k] != 1
        ):
            raise ValueError("FloatOps.binary: shape mismatch")
    cdef Py_ssize_t size = math.prod(y), a_size = math.prod(a), b_size = math.prod(b)
    while j.k < rank - 1 and y[j.k] == 1:  # the dimensions before k are 1 in a, b and y
        j.k += 1
    j.units = y[j.k] if rank else 1
    j.y_step = j.a_step = j.b_step = 0
    if size == 0:  # nothing to run (units may be 0)
        return 0
    j.y_step = size // j.units
    j.a_step = 0 if rank == 0 or j.a_shape[j.k] == 1 else a_size // j.units
    j.b_step = 0 if rank == 0 or j.b_shape[j.k] == 1 else b_size // j.units
    j.parts = float_parts(j.units, size)
    return 0


cdef void run_binary(binary_job* j, const float* a, const float* b, float* y) noexcept nogil:
    """The op set_binary made j for, on these operands (an output of at least one element)."""
    j.a, j.b, j.y = a, b, y
    j.parts = float_parts(j.units, j.y_step * j.units)  # the thread count of this call
    if j.parts == 1:
        binary_task(j, 0)
    else:
        qrt_parallel_for(j.parts, <int>j.parts - 1, binary_task, j)


cdef class BinaryStep:
    """add, sub, mul or div at one pair of shapes (numpy broadcasting), as an execution plan runs it."""
    cdef binary_job job

    def __init__(self, FloatOps kernel, str op, tuple a, tuple b, tuple y):
        set_binary(&self.job, kernel.ops, BINARY_OPS[op], a, b, y)
        if math.prod(y) == 0:
            raise ValueError("BinaryStep: an empty output")

    cdef void run(self, const float* a, const float* b, float* y) noexcept nogil:
        cdef binary_job j = self.job  # a copy: calls on several threads at once
        run_binary(&j, a, b, y)


def batch_norm_terms(const float[::1] mean, const float[::1] var, const float[::1] weight, const float[::1] bias,
                     float eps, float[::1] alpha, float[::1] beta) -> None:
    """batch_norm's per-channel terms (float_ops.h): alpha = fl(1 / sqrt(var + eps)) * weight, beta =
    fma(-mean, alpha, bias), as torch's CPU kernel collects them; all of one length."""
    cdef Py_ssize_t c, n = mean.shape[0]
    if not var.shape[0] == weight.shape[0] == bias.shape[0] == alpha.shape[0] == beta.shape[0] == n:
        raise ValueError("batch_norm_terms: shape mismatch")
    with nogil:
        for c in range(n):
            alpha[c] = qrt_batch_norm_alpha(var[c], weight[c], eps)
            beta[c] = qrt_batch_norm_beta(mean[c], alpha[c], bias[c])


def float_unary_oracle(str op, const float[::1] x, float[::1] y) -> None:
    """y = op(x) for op in sigmoid, tanh, silu, gelu, gelu_tanh, log, sin, cos by the scalar functions (float_math.h,
    torch_gelu.h), one element at a time (the GPU's code, and the oracle that FloatOps.unary's vector loops must
    equal bit for bit), for tests."""
    cdef int code = UNARY_OPS[op]
    cdef Py_ssize_t i, n = x.shape[0]
    if y.shape[0] != n or code in (QRT_SQRT, QRT_RSQRT, QRT_CEIL, QRT_FLOOR):
        raise ValueError("float_unary_oracle: shape mismatch or no scalar function")
    with nogil:
        for i in range(n):
            if code == QRT_SIGMOID:
                y[i] = qrt_sigmoid(x[i])
            elif code == QRT_TANH:
                y[i] = qrt_tanh(x[i])
            elif code == QRT_SILU:
                y[i] = qrt_silu(x[i])
            elif code == QRT_GELU:
                y[i] = qrt_gelu_onednn(x[i])
            elif code == QRT_LOG:
                y[i] = qrt_logf(x[i])
            elif code == QRT_SIN:
                y[i] = qrt_sinf(x[i])
            elif code == QRT_COS:
                y[i] = qrt_cosf(x[i])
            else:
                y[i] = qrt_gelu_tanh(x[i])


cdef class FloatOps:
    """The float32 math kernels, of the build the active kernel variant calls for when created (plain C
    under "portable", AVX-512 code under "avx512-vnni", AVX2 + FMA code under the other x86-64 SIMD
    variants): the same bits every way."""

    cdef const qrt_float_ops* ops
    cdef Py_ssize_t cost[COST_LAYER_NORM + 1]  # this build's FLOAT_COSTS

    def __cinit__(self):
        self.ops = qrt_float_ops_for(active.name)
        for k, c in enumerate(FLOAT_COSTS[self.ops.name.decode()]):
            self.cost[k] = c

    @property
    def name(self) -> str:
        return self.ops.name.decode()

    def unary(self, str op, const float[::1] x, float[::1] y) -> None:
        """y = op(x) elementwise, op one of UNARY_OPS."""
        cdef int code = UNARY_OPS[op]
        cdef Py_ssize_t n = x.shape[0]
        if y.shape[0] != n:
            raise ValueError("FloatOps.unary: shape mismatch")
        if n == 0:
            return
        with nogil:
            self.unary_into(code, &x[0], &y[0], n)

    cdef void unary_into(self, int code, const float* x, float* y, Py_ssize_t n) noexcept nogil:
        """unary() on raw pointers (also the execution plan's step), code a value of UNARY_OPS, n > 0."""
        run_float(self.ops, FLOAT_UNARY, code, x, NULL, y, NULL, NULL, 0, n, 1, 1,
                  float_parts(n, n * self.cost[code]))

    def binary(self, str op, a, b, y) -> None:
        """y = a op b, numpy broadcasting; a, b, y contiguous float32 arrays, y of the broadcast shape."""
        cdef binary_job j
        set_binary(&j, self.ops, BINARY_OPS[op], a.shape, b.shape, y.shape)
        if y.size == 0:
            return
        cdef const float[::1] av = a.reshape(-1)
        cdef const float[::1] bv = b.reshape(-1)
        cdef float[::1] yv = y.reshape(-1)
        with nogil:
            run_binary(&j, &av[0], &bv[0], &yv[0])

    cdef void sum_into(self, bint mean, const float* x, float* y, Py_ssize_t outer, Py_ssize_t n,
                       Py_ssize_t inner) noexcept nogil:
        """sum() on raw pointers (also the execution plan's step; x NULL when n == 0), outer * inner > 0."""
        run_float(self.ops, FLOAT_SUM, mean, x, NULL, y, NULL, NULL, 0, outer, n, inner,
                  float_parts(outer, outer * n * inner))

    def softmax(self, bint log, const float[:, :, ::1] x, float[:, :, ::1] y) -> None:
        """softmax (log_softmax when log) of x viewed as [outer, n, inner], along n."""
        cdef Py_ssize_t outer = x.shape[0], n = x.shape[1], inner = x.shape[2]
        if y.shape[0] != outer or y.shape[1] != n or y.shape[2] != inner:
            raise ValueError("FloatOps.softmax: shape mismatch")
        if outer * n * inner == 0:
            return
        with nogil:
            self.softmax_into(log, &x[0, 0, 0], &y[0, 0, 0], outer, n, inner)

    cdef void softmax_into(self, bint log, const float* x, float* y, Py_ssize_t outer, Py_ssize_t n,
                           Py_ssize_t inner) noexcept nogil:
        """softmax() on raw pointers (also the execution plan's step), outer * n * inner > 0."""
        run_float(self.ops, FLOAT_SOFTMAX, log, x, NULL, y, NULL, NULL, 0, outer, n, inner,
                  float_parts(outer, outer * n * inner * 4))  # 5 adds' time an element (exp)

    def sum(self, bint mean, const float[:, :, ::1] x, float[:, ::1] y) -> None:
        """y[o, c] = sum (mean when mean) over j of x[o, j, c]; an empty sum is 0, an empty mean NaN."""
        cdef Py_ssize_t outer = x.shape[0], n = x.shape[1], inner = x.shape[2]
        cdef const float* xp = &x[0, 0, 0] if n else NULL  # never read when n == 0
        if y.shape[0] != outer or y.shape[1] != inner:
            raise ValueError("FloatOps.sum: shape mismatch")
        if outer * inner == 0:
            return
        with nogil:
            self.sum_into(mean, xp, &y[0, 0], outer, n, inner)

    def layer_norm(self, const float[:, ::1] x, const float[::1] weight, const float[::1] bias, float eps,
                   float[:, ::1] y, const float[:, ::1] add=None) -> None:
        """Each row of x (of x + add, as the add op gives it, where add is given) normalised, times weight, plus
        bias (each None or float32 [n]). y must not overlap x or add."""
        cdef Py_ssize_t rows = x.shape[0], n = x.shape[1]
        cdef const float* w = NULL
        cdef const float* b = NULL
        cdef const float* x2 = NULL
        if y.shape[0] != rows or y.shape[1] != n or (weight is not None and weight.shape[0] != n) or (
            bias is not None and bias.shape[0] != n
        ) or (add is not None and (add.shape[0] != rows or add.shape[1] != n)):
            raise ValueError("FloatOps.layer_norm: shape mismatch")
        if rows * n == 0:
            return
        if weight is not None:
            w = &weight[0]
        if bias is not None:
            b = &bias[0]
        if add is not None:
            x2 = &add[0, 0]
        with nogil:
            self.layer_norm_into(&x[0, 0], x2, w, b, eps, &y[0, 0], rows, n)

    def batch_norm(self, const float[:, :, ::1] x, const float[::1] alpha, const float[::1] beta,
                   float[:, :, ::1] y) -> None:
        """y = fma(x, alpha[c], beta[c]) of x viewed as [outer, channels, inner] (batch_norm_terms' alpha and
        beta). y must not overlap x."""
        cdef Py_ssize_t outer = x.shape[0], n = x.shape[1], inner = x.shape[2]
        if y.shape[0] != outer or y.shape[1] != n or y.shape[2] != inner or alpha.shape[0] != n or beta.shape[0] != n:
            raise ValueError("FloatOps.batch_norm: shape mismatch")
        if outer * n * inner == 0:
            return
        with nogil:
            self.batch_norm_into(&x[0, 0, 0], &alpha[0], &beta[0], &y[0, 0, 0], outer, n, inner)

    cdef void batch_norm_into(self, const float* x, const float* alpha, const float* beta, float* y, Py_ssize_t outer,
                              Py_ssize_t n, Py_ssize_t inner) noexcept nogil:
        """batch_norm() on raw pointers (also the execution plan's step), outer * n * inner > 0."""
        run_float(self.ops, FLOAT_BATCH_NORM, 0, x, NULL, y, alpha, beta, 0, outer, n, inner,
                  float_parts(outer, outer * n * inner))

    cdef void layer_norm_into(self, const float* x, const float* x2, const float* w, const float* b, float eps,
                              float* y, Py_ssize_t rows, Py_ssize_t n) noexcept nogil:
        """layer_norm() on raw pointers (also the execution plan's step; x2, w, b NULL for none), rows * n > 0."""
        run_float(self.ops, FLOAT_LAYER_NORM, 0, x, x2, y, w, b, eps, rows, n, 1,
                  float_parts(rows, rows * n * (self.cost[COST_LAYER_NORM] + (x2 != NULL))))
