# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Integer kernels of qrt's CPU backend.

Each float step is written as PyTorch's x86/fbgemm engine performs it
(docs/NUMERICS.md): fmaf exactly where that engine fuses, plain float
operations elsewhere. The extension is built with -ffp-contract=off and
without fast-math, so the compiler adds no fusion of its own and results do
not depend on the machine. Integer accumulation wraps modulo 2**32 as int32
does in the reference (-fwrapv makes that defined behaviour in C).

Callers validate shapes; the kernels trust them and run without the GIL.
"""

cimport cython
from libc.math cimport fmaf, nearbyintf, nearbyint, fabs, isinf
from libc.stdint cimport int8_t, uint8_t, int32_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

import math
import operator
import os

import numpy as np

cimport numpy as cnp

from .layout import PackedMatrix, pack

cnp.import_array()

cdef extern from "qrt_kernels.h" nogil:
    ctypedef struct qrt_epilogue:
        int32_t* acc
        float* y
        float x_scale
        const float* w_scale
        const float* bias
        int relu
        uint8_t* q
        const float* bias_q
        const float* bias_t
        float bias_inv
        const float* mult
        int32_t zp, lo
        int qnnpack
        const int32_t* bias_i
        const float* x_scales
    ctypedef struct qrt_kernels:
        const char* name
        const char* i8_isa
        const char* fp_isa
        int i8_nr, i8_mr, i8_task_rows, i8_small_x, fp_nr, fp_mr, fp_row_nr
        ptrdiff_t (*i8_packed_x_size)(ptrdiff_t m, ptrdiff_t k) noexcept nogil
        int (*i8_pack_x)(const uint8_t* x, ptrdiff_t m, ptrdiff_t k, uint8_t* out) noexcept nogil
        void (*i8_quantize_pack_x)(const float* x, ptrdiff_t m, ptrdiff_t k, float inv, float zp, int round_first,
                                   uint8_t* out) noexcept nogil
        void (*gemm_u8s8)(const uint8_t* xpacked, int32_t x_zp, const int32_t* w_rowsum, const int8_t* packed,
                          const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0,
                          ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, int small_x, int x_plain,
                          const qrt_epilogue* e) noexcept nogil
        ptrdiff_t (*fp_packed_x_size)(ptrdiff_t m, ptrdiff_t k) noexcept nogil
        void (*fp_pack_x)(const float* x, ptrdiff_t m, ptrdiff_t k, float* out) noexcept nogil
        void (*gemm_fp)(const float* xpacked, const void* packed, int half, const float* bias, ptrdiff_t n,
                        ptrdiff_t k, ptrdiff_t m, ptrdiff_t t0, ptrdiff_t t1, ptrdiff_t p0, ptrdiff_t p1,
                        float* y, ptrdiff_t ldy, ptrdiff_t widen) noexcept nogil
        int (*min_max)(const float* x, ptrdiff_t n, float* lo, float* hi) noexcept nogil
        void (*quantize_u8)(const float* x, ptrdiff_t n, float inv, float zp, int round_first,
                            uint8_t* q) noexcept nogil
        int (*u8_max)(const uint8_t* x, ptrdiff_t n) noexcept nogil
        int (*quantize_dynamic)(const float* x, ptrdiff_t n, int reduce_range, int round_first, uint8_t* q,
                                float* scale, int32_t* zero_point) noexcept nogil
        int (*quantize_rows_s8)(const float* x, ptrdiff_t m, ptrdiff_t k, uint8_t* q, float* scales) noexcept nogil
        void (*gate_update)(int kind, const float* gi, float* gh, const float* h, const float* c, float* h_out,
                            float* c_out, ptrdiff_t batch, ptrdiff_t hidden, ptrdiff_t j0,
                            ptrdiff_t j1) noexcept nogil
    const qrt_kernels* const* qrt_kernels_compiled(int* count)
    int qrt_kernels_runnable(const qrt_kernels* k)
    const qrt_kernels* qrt_kernels_best()
    ptrdiff_t qrt_fp_widen_default(const qrt_kernels* k)
    enum: QRT_F16_WIDEN_MAX

cdef extern from "threadpool.h" nogil:
    ctypedef void (*qrt_task_fn)(void* ctx, ptrdiff_t task) noexcept nogil
    void qrt_pool_configure(int threads, int cpus)
    void qrt_parallel_for(ptrdiff_t tasks, int helpers, qrt_task_fn fn, void* ctx)
    int qrt_pool_workers()

ctypedef fused qint_t:
    uint8_t
    int8_t
    int32_t


cdef inline int64_t round_clamp(float v, int64_t qmin, int64_t qmax, int* nan) noexcept nogil:
    """rne(v) clamped to [qmin, qmax]; NaN is counted and mapped to qmin."""
    cdef float r = nearbyintf(v)
    if r != r:
        nan[0] += 1
        return qmin
    if <double>r < <double>qmin:
        return qmin
    if <double>r > <double>qmax:
        return qmax
    return <int64_t>r


cdef inline void qrange(qint_t* dummy, int64_t* qmin, int64_t* qmax) noexcept nogil:
    if qint_t is uint8_t:
        qmin[0], qmax[0] = 0, 255
    elif qint_t is int8_t:
        qmin[0], qmax[0] = -128, 127
    else:
        qmin[0], qmax[0] = -2147483648, 2147483647


# ------------------------------------------------------------ quantize / dequantize

cdef inline int64_t round_first_clamp(float v, int32_t zero_point, int64_t qmin, int64_t qmax,
                                     int* nan) noexcept nogil:
    """rne(v) + zero_point clamped to [qmin, qmax], the sum exact: torch's quantization on aarch64, which adds
    the zero point after rounding (docs/NUMERICS.md section 9). NaN is counted and mapped to qmin."""
    cdef double r = nearbyintf(v)
    if r != r:
        nan[0] += 1
        return qmin
    r += zero_point  # exact: |r| < 2^53 or far past the clamp either way
    if r < <double>qmin:
        return qmin
    if r > <double>qmax:
        return qmax
    return <int64_t>r


cdef int quantize_tensor_raw(const float* x, Py_ssize_t n, float scale, int32_t zero_point, bint round_first,
                             qint_t* out) noexcept nogil:
    """quantize_per_tensor on raw pointers (the execution plans call it too)."""
    cdef Py_ssize_t i
    cdef float inv = <float>1.0 / scale
    cdef float zp = <float>zero_point
    cdef int64_t qmin, qmax
    cdef int nan = 0
    qrange(<qint_t*>NULL, &qmin, &qmax)
    for i in range(n):
        if round_first:
            out[i] = <qint_t>round_first_clamp(x[i] * inv, zero_point, qmin, qmax, &nan)
        elif qint_t is int32_t:
            out[i] = <qint_t>round_clamp(x[i] * inv + zp, qmin, qmax, &nan)
        else:
            out[i] = <qint_t>round_clamp(fmaf(x[i], inv, zp), qmin, qmax, &nan)
    return nan


def quantize_per_tensor(const float[::1] x, float scale, int32_t zero_point, qint_t[::1] out,
                        bint round_first=False) -> int:
    """out = clamp(rne(x / scale + zp)); returns the number of NaNs met.

    8-bit targets use fma(x, 1/scale, zp) (one rounding); qint32 rounds the
    product and the sum separately, as torch does on x86. round_first: rne(fl(x * (1/scale))) + zp, as torch
    does on aarch64.
    """
    cdef int nan = 0
    if x.shape[0]:
        with nogil:
            nan = quantize_tensor_raw(&x[0], x.shape[0], scale, zero_point, round_first, &out[0])
    return nan


cdef int quantize_channel_raw(const float* x, Py_ssize_t outer, Py_ssize_t channels, Py_ssize_t inner,
                              const float* scale, const int32_t* zero_point, bint round_first,
                              qint_t* out) noexcept nogil:
    """quantize_per_channel on raw pointers, x [outer, channels, inner]."""
    cdef Py_ssize_t a, c, i, base
    cdef float inv, zp
    cdef int64_t qmin, qmax
    cdef int nan = 0
    qrange(<qint_t*>NULL, &qmin, &qmax)
    for a in range(outer):
        for c in range(channels):
            inv = <float>1.0 / scale[c]
            zp = <float>zero_point[c]
            base = (a * channels + c) * inner
            for i in range(inner):
                if round_first:
                    out[base + i] = <qint_t>round_first_clamp(x[base + i] * inv, zero_point[c], qmin, qmax, &nan)
                else:
                    out[base + i] = <qint_t>round_clamp(x[base + i] * inv + zp, qmin, qmax, &nan)
    return nan


cdef void _check_channels(Py_ssize_t* shape, Py_ssize_t scales, Py_ssize_t zero_points,
                          Py_ssize_t* out_shape) except *:
    """The per-channel loops read one scale and zero point per channel and write out like x: check before nogil."""
    if scales != shape[1] or zero_points != shape[1]:
        raise ValueError(f"{shape[1]} channels, but {scales} scales and {zero_points} zero points")
    if out_shape[0] != shape[0] or out_shape[1] != shape[1] or out_shape[2] != shape[2]:
        raise ValueError("the output's shape differs from the input's")


def quantize_per_channel(const float[:, :, ::1] x, const float[::1] scale,
                         const int32_t[::1] zero_point, qint_t[:, :, ::1] out, bint round_first=False) -> int:
    """x viewed as [outer, channels, inner]; rne(fl(x * (1/scale_c)) + zp_c), no fma (torch on x86);
    round_first: rne(fl(x * (1/scale_c))) + zp_c (torch on aarch64).

    scale is float32 even when the file holds float64: torch computes 1.0f / (float)scale.
    """
    cdef int nan = 0
    _check_channels(x.shape, scale.shape[0], zero_point.shape[0], out.shape)
    if x.shape[0] and x.shape[1] and x.shape[2]:
        with nogil:
            nan = quantize_channel_raw(&x[0, 0, 0], x.shape[0], x.shape[1], x.shape[2], &scale[0],
                                       &zero_point[0], round_first, &out[0, 0, 0])
    return nan


cdef void dequantize_tensor_raw(const qint_t* q, Py_ssize_t n, float scale, int32_t zero_point,
                                float* out) noexcept nogil:
    """dequantize_per_tensor on raw pointers."""
    cdef Py_ssize_t i
    for i in range(n):
        out[i] = <float>(<int32_t>(q[i] - zero_point)) * scale


def dequantize_per_tensor(const qint_t[::1] q, float scale, int32_t zero_point, float[::1] out) -> None:
    """out = fl(q - zp) * scale in float32; q - zp wraps in int32 as torch's does."""
    if q.shape[0]:
        with nogil:
            dequantize_tensor_raw(&q[0], q.shape[0], scale, zero_point, &out[0])


cdef void dequantize_channel_raw(const qint_t* q, Py_ssize_t outer, Py_ssize_t channels, Py_ssize_t inner,
                                 const double* scale, const int32_t* zero_point, float* out) noexcept nogil:
    """dequantize_per_channel on raw pointers, q [outer, channels, inner]."""
    cdef Py_ssize_t a, c, i, base
    cdef float zp
    for a in range(outer):
        for c in range(channels):
            zp = <float>zero_point[c]
            base = (a * channels + c) * inner
            for i in range(inner):
                out[base + i] = <float>(<double>(<float>q[base + i] - zp) * scale[c])


def dequantize_per_channel(const qint_t[:, :, ::1] q, const double[::1] scale,
                           const int32_t[::1] zero_point, float[:, :, ::1] out) -> None:
    """out = fl(double(fl(fl(q) - fl(zp_c))) * scale_c), as torch computes it.

    torch subtracts in float32 (float(q) - zp), then multiplies by its
    float64 scale in double and rounds once. The subtraction is exact for
    8-bit q; for qint32 it may round once |q|, |zp| or |q - zp| exceeds 2**24.
    """
    _check_channels(q.shape, scale.shape[0], zero_point.shape[0], out.shape)
    if q.shape[0] and q.shape[1] and q.shape[2]:
        with nogil:
            dequantize_channel_raw(&q[0, 0, 0], q.shape[0], q.shape[1], q.shape[2], &scale[0], &zero_point[0],
                                   &out[0, 0, 0])


# ------------------------------------------------------------ dynamic quantization of activations

cdef extern from "quantize_params.h" nogil:
    void qrt_choose_qparams(float lo, float hi, int reduce_range, float* scale, int32_t* zero_point)


# ------------------------------------------------------------ GEMM kernels

# The kernel variant (qrt_kernels.h) of the layers prepared from now on. Each layer keeps the variant
# it was prepared with (every variant reads the same packed weights), so switching affects only layers
# prepared afterwards.
cdef const qrt_kernels* active


def kernel_variants() -> dict:
    """Every kernel variant this build holds, best first: name -> whether this CPU can run it."""
    cdef int n, i
    cdef const qrt_kernels* const* compiled = qrt_kernels_compiled(&n)
    return {compiled[i].name.decode(): bool(qrt_kernels_runnable(compiled[i])) for i in range(n)}


cdef const qrt_kernels* find_variant(str name) except NULL:
    cdef int n, i
    cdef const qrt_kernels* const* compiled = qrt_kernels_compiled(&n)
    runnable = [v for v, ok in kernel_variants().items() if ok]
    for i in range(n):
        if compiled[i].name.decode() == name:
            if not qrt_kernels_runnable(compiled[i]):
                raise ValueError(f"kernel variant {name!r} cannot run on this CPU; it runs {runnable}")
            return compiled[i]
    raise ValueError(f"no kernel variant {name!r} in this build; this CPU runs {runnable}")


def kernel_variant() -> str:
    """The kernel variant layers are prepared with: the best this CPU runs, or $QRT_KERNELS."""
    return active.name.decode()


def kernel_variant_info() -> dict:
    """The active variant's name, the instruction sets of its two products and their tiles (rows, columns)."""
    return {"variant": active.name.decode(), "int8": active.i8_isa.decode(), "float": active.fp_isa.decode(),
            "int8_tile": (active.i8_mr, active.i8_nr), "float_tile": (active.fp_mr, active.fp_nr)}


def _use_variant(str name) -> str:
    """Prepare layers from now on with variant `name` (tests, benchmarks); returns the previous one."""
    global active
    old = active.name.decode()
    active = find_variant(name)
    return old


cdef const qrt_kernels* initial_variant() except NULL:
    """$QRT_KERNELS, else the best variant this CPU runs."""
    forced = os.environ.get("QRT_KERNELS", "")
    if not forced:
        return qrt_kernels_best()
    try:
        return find_variant(forced)
    except ValueError as e:
        raise ImportError(f"QRT_KERNELS={forced}: {e}") from None


active = initial_variant()

# Threads: every parallel loop runs on one persistent pool (qrt/kernels/threadpool.c), split into tasks
# that each write their own outputs, so no result depends on the split. The cost model of a product
# (split_work): tasks of at least MIN_WORK_* multiply-adds, up to TASKS_PER_THREAD a thread, so that a
# thread the OS runs late holds up little; and one sleeping worker woken per MIN_WORK_* << WAKE_SHIFT of
# work, the work that outlasts its wake-up (tens of microseconds on a VM; docs/PERFORMANCE.md, "Threads").
cdef int num_threads = 1
cdef int available_cpus = 1
cdef int64_t MIN_WORK_I8 = 1 << 19  # multiply-adds per task, about 2 us on AVX-512 VNNI
cdef int64_t MIN_WORK_F16 = 1 << 18
cdef int WAKE_SHIFT = 3
cdef int TASKS_PER_THREAD = 4
# int8 products split rows first (i8_rows_first) where their weights take at most I8_ROWS_FIRST_BYTES, half a
# core's L2 (qrt.threads sets it from sysfs; by default half of Zen 4 and 5's 1 MiB), or where each row chunk has
# I8_ROWS_FIRST_ROWS rows or more
cdef int64_t I8_ROWS_FIRST_BYTES = 1 << 19
cdef Py_ssize_t I8_ROWS_FIRST_ROWS = 32
cdef int64_t MIN_GATE_UNITS = 8192  # batch rows times hidden units per task
# Bytes of input projections computed ahead of the recurrent steps that read them: a block this size
# stays in L2 (beside the hidden-to-hidden weights) until it is read.
cdef Py_ssize_t PROJECTION_BYTES = 256 * 1024


# more than any machine's CPUs; the splits stay far from int's range
MAX_THREADS = 1 << 16


@cython.annotation_typing(False)  # the hint says what to pass; Cython would cut a float to an int for it
def set_num_threads(n: int) -> None:
    """Threads the kernels may use per call (1 to MAX_THREADS); no more run than the CPUs the process may use.
    Results do not depend on it."""
    global num_threads
    n = operator.index(n)  # an integer (numpy's too), never a float cut short
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"number of threads must be between 1 and {MAX_THREADS}, got {n}")
    num_threads = n
    qrt_pool_configure(num_threads, available_cpus)


def get_num_threads() -> int:
    return num_threads


def _set_available_cpus(int n) -> None:
    """The CPUs the process may use (qrt.threads finds them): the pool's team is never larger."""
    global available_cpus
    available_cpus = max(n, 1)
    qrt_pool_configure(num_threads, available_cpus)


def _pool_workers() -> int:
    """Worker threads the pool runs now (for tests)."""
    return qrt_pool_workers()


def _set_min_work(int64_t i8, int64_t f16, int64_t gate_units) -> tuple:
    """Set the per-task work floors; returns the old ones (tests use 1 to split all work)."""
    global MIN_WORK_I8, MIN_WORK_F16, MIN_GATE_UNITS
    old = (MIN_WORK_I8, MIN_WORK_F16, MIN_GATE_UNITS)
    MIN_WORK_I8, MIN_WORK_F16, MIN_GATE_UNITS = max(i8, 1), max(f16, 1), max(gate_units, 1)
    return old


def _set_rows_first_bytes(int64_t n) -> int:
    """Set the int8 weights' size up to which products split rows first whatever their rows (i8_rows_first);
    returns the old one (qrt.threads: half the L2; tests: 0, every product of few rows split panels first)."""
    global I8_ROWS_FIRST_BYTES
    old, I8_ROWS_FIRST_BYTES = I8_ROWS_FIRST_BYTES, max(n, 0)
    return old


# k of float16 weights the float product widens at once for the row tiles sharing them (gemm_f16.h); -1: what
# qrt_fp_widen_default says for the variant and CPU. Layers keep what held when they were prepared.
cdef Py_ssize_t FP_WIDEN = -1
F16_WIDEN_MAX = QRT_F16_WIDEN_MAX


def _set_fp_widen(Py_ssize_t n) -> int:
    """Set the float16 widening slice of layers prepared from now on (0: never, -1: the CPU's default); returns
    the old one (tests run every path; the bits are the same)."""
    global FP_WIDEN
    if not -1 <= n <= QRT_F16_WIDEN_MAX:
        raise ValueError(f"widening slice must be between -1 and {QRT_F16_WIDEN_MAX}, got {n}")
    old, FP_WIDEN = FP_WIDEN, n
    return old


def _set_projection_bytes(Py_ssize_t n) -> int:
    """Set the recurrent layers' input projection block (bytes); returns the old one (for tests)."""
    global PROJECTION_BYTES
    old, PROJECTION_BYTES = PROJECTION_BYTES, max(n, 1)
    return old


cdef inline int split_work(Py_ssize_t m, Py_ssize_t panels, Py_ssize_t mr, int64_t work, int64_t min_work,
                           bint rows_first, Py_ssize_t* cn, Py_ssize_t* cm) noexcept nogil:
    """Tile grid: cm chunks of rows times cn chunks of panels, none with less than min_work; returns the
    sleeping workers worth waking for it. A product that pays for no wake-up is one tile: the caller's,
    whatever the pool's workers are doing. The int8 product splits rows first (panels for the tasks rows
    cannot give) where i8_rows_first says so. On the 2-vCPU Sapphire Rapids VM every shape measured (weights of
    at most 1 MiB) ran faster so at 2 threads than split by panels first (amx-int8 M=128 K=384 N=1536 90 -> 50
    us, 73 on 1 thread; M=512 K=N=1024 415 -> 270, 495 on 1; avx512-vnni 150 -> 127 and 937 -> 803 us; avx2
    equal or better; docs/PERFORMANCE.md, "Threads"). The float product splits panels first (a row chunk
    rereads the weights; rows first measured equal or up to 8% slower there)."""
    cdef int64_t helpers = min(<int64_t>num_threads - 1, work // (min_work << WAKE_SHIFT) - 1)
    cdef int64_t nt = task_count(work, min_work)
    cdef Py_ssize_t row_tiles = (m + mr - 1) // mr
    if helpers <= 0:
        cn[0] = cm[0] = 1
        return 0
    if rows_first:
        cm[0] = min(row_tiles, <Py_ssize_t>nt)
        cn[0] = min(panels, (nt + cm[0] - 1) // cm[0])
    else:
        cn[0] = min(panels, <Py_ssize_t>nt)
        cm[0] = min(row_tiles, (nt + cn[0] - 1) // cn[0])
    return <int>helpers


cdef inline int64_t task_count(int64_t work, int64_t min_work) noexcept nogil:
    """The tasks split_work cuts a product of `work` multiply-adds into: none under min_work, at most
    TASKS_PER_THREAD a thread."""
    return min(<int64_t>num_threads * TASKS_PER_THREAD, max(work // min_work, 1))


cdef inline bint i8_rows_first(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, Py_ssize_t mr, int64_t work) noexcept nogil:
    """Whether an int8 product splits rows first (split_work). Each row chunk reads all the weights: where they
    take at most half a core's L2 (I8_ROWS_FIRST_BYTES), from there after the first; larger, from L3 or memory
    again, which a chunk's products hide only from I8_ROWS_FIRST_ROWS rows up. Else panels first: each thread
    reads its own part of the weights, once. 2-CPU Zen 5 (1 MiB L2), avx512-vnni, dynamic linears at 2 threads,
    rows first / panels first, us: M=16 K=N=1024 28.6 / 21.1, M=16 K=384 N=1536 15.1 / 12.0, M=16 K=N=4096 440
    / 291, M=64 K=N=4096 1349 / 1137, M=128 K=N=1024 160 / 161 (16 rows a chunk); M=512 K=N=1024 595 / 703, M=512
    K=384 N=1536 354 / 441 (64 rows a chunk)."""
    cdef Py_ssize_t chunks = min((m + mr - 1) // mr, <Py_ssize_t>task_count(work, MIN_WORK_I8))
    return <int64_t>n * k <= I8_ROWS_FIRST_BYTES or m >= I8_ROWS_FIRST_ROWS * chunks


cdef inline int64_t product_work(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """A product's cost in multiply-adds' worth: the weights' stream counts as 8 more rows (a few rows
    wait on memory: avx512-vnni, K=N=4096, M=1 ran 30 multiply-adds a ns where M=64 at K=N=1024 ran 345)."""
    return (<int64_t>m + 8) * n * k


cdef inline Py_ssize_t chunk(Py_ssize_t total, Py_ssize_t parts, Py_ssize_t i) noexcept nogil:
    """Start of the i-th of `parts` near-equal chunks of range(total)."""
    return total * i // parts


cdef inline Py_ssize_t chunk_whole(Py_ssize_t total, Py_ssize_t unit, Py_ssize_t parts, Py_ssize_t i) noexcept nogil:
    """Start of the i-th of `parts` near-equal chunks of range(total) made of whole units (row tiles, panels,
    vectors), the last unit cut short at total (i = parts: total)."""
    return min(chunk((total + unit - 1) // unit, parts, i) * unit, total)


# Values of x per task of quantizing it, bytes per task of packing it: a 16th and an 8th of an int8
# product task, about as long (both follow MIN_WORK_I8, so _set_min_work(1, ...) splits them too).
cdef inline int64_t min_quantize() noexcept nogil:
    return max(MIN_WORK_I8 >> 4, 1)


cdef inline int64_t min_pack() noexcept nogil:
    return max(MIN_WORK_I8 >> 3, 1)


cdef inline int64_t min_range() noexcept nogil:
    """Values of x per task of its range alone (x_range): a read, half a quantization's work, so that a BERT
    linear's 128 x 384 input splits on 2 threads (its range took 3 us of a 22 us call)."""
    return max(MIN_WORK_I8 >> 5, 1)


cdef struct quantize_job:
    const qrt_kernels* kern
    const float* x
    Py_ssize_t n, parts
    float lo[64]
    float hi[64]
    int bad[64]
    float inv, zp
    int round_first
    uint8_t* q


cdef void min_max_task(void* ctx, ptrdiff_t c) noexcept nogil:
    cdef quantize_job* j = <quantize_job*>ctx
    cdef Py_ssize_t a = chunk(j.n, j.parts, c), b = chunk(j.n, j.parts, c + 1)
    j.bad[c] = j.kern.min_max(j.x + a, b - a, &j.lo[c], &j.hi[c])


cdef void quantize_task(void* ctx, ptrdiff_t c) noexcept nogil:
    cdef quantize_job* j = <quantize_job*>ctx
    cdef Py_ssize_t a = chunk(j.n, j.parts, c), b = chunk(j.n, j.parts, c + 1)
    # clamp to 255 even under reduce_range: PyTorch does the same
    j.kern.quantize_u8(j.x + a, b - a, j.inv, j.zp, j.round_first, j.q + a)


cdef int x_range(const qrt_kernels* kern, const float* x, Py_ssize_t n, float* lo, float* hi) noexcept nogil:
    """kern.min_max(x, n, lo, hi), large x split across the threads: partial min/max combine exactly.
    Returns 1 on NaN or infinity."""
    cdef quantize_job j
    cdef Py_ssize_t c
    j.parts = max(1, min(<Py_ssize_t>num_threads, n // min_range(), 64))
    if j.parts == 1:
        return kern.min_max(x, n, lo, hi)
    j.kern, j.x, j.n = kern, x, n
    qrt_parallel_for(j.parts, <int>j.parts - 1, min_max_task, &j)
    for c in range(1, j.parts):
        j.bad[0] |= j.bad[c]
        j.lo[0] = j.lo[c] if j.lo[c] < j.lo[0] else j.lo[0]
        j.hi[0] = j.hi[c] if j.hi[c] > j.hi[0] else j.hi[0]
    lo[0], hi[0] = j.lo[0], j.hi[0]
    return j.bad[0]


cdef int quantize_activations(const qrt_kernels* kern, const float* x, Py_ssize_t n, bint reduce_range,
                              bint round_first, uint8_t* q, float* scale, int32_t* zero_point) noexcept nogil:
    """Choose (scale, zp) from x's range and quantize x to quint8; returns 1 on NaN or infinity.
    round_first: the zero point added after rounding, as torch on aarch64 (qrt_quantize_u8).

    Large inputs are split across the threads (x_range); each value quantizes on its own, so the result
    does not depend on the split.
    """
    cdef quantize_job j
    j.parts = max(1, min(<Py_ssize_t>num_threads, n // min_quantize(), 64))
    if j.parts == 1:  # the common small case: one call of the variant
        return kern.quantize_dynamic(x, n, reduce_range, round_first, q, scale, zero_point)
    cdef float lo, hi
    if x_range(kern, x, n, &lo, &hi):
        return 1
    j.kern, j.x, j.n, j.q, j.round_first = kern, x, n, q, round_first
    qrt_choose_qparams(lo, hi, reduce_range, scale, zero_point)
    j.inv, j.zp = <float>1.0 / scale[0], <float>zero_point[0]
    qrt_parallel_for(j.parts, <int>j.parts - 1, quantize_task, &j)
    return 0


cdef struct rows_job:
    const qrt_kernels* kern
    const float* x
    Py_ssize_t m, k, parts
    uint8_t* q
    float* scales
    int bad[64]


cdef void rows_task(void* ctx, ptrdiff_t c) noexcept nogil:
    cdef rows_job* j = <rows_job*>ctx
    cdef Py_ssize_t a = chunk(j.m, j.parts, c), b = chunk(j.m, j.parts, c + 1)
    j.bad[c] = j.kern.quantize_rows_s8(j.x + a * j.k, b - a, j.k, j.q + a * j.k, j.scales + a)


cdef int quantize_rows(const qrt_kernels* kern, const float* x, Py_ssize_t m, Py_ssize_t k, uint8_t* q,
                       float* scales) noexcept nogil:
    """torchao's per-row symmetric quantization of x[m, k] (the variant's quantize_rows_s8), rows split across
    the threads: each row quantizes on its own, so the split changes nothing. Returns 1 on NaN or infinity."""
    cdef rows_job j
    cdef Py_ssize_t c
    j.parts = max(1, min(<Py_ssize_t>num_threads, m, m * k // min_quantize(), 64))
    if j.parts == 1:
        return kern.quantize_rows_s8(x, m, k, q, scales)
    j.kern, j.x, j.m, j.k, j.q, j.scales = kern, x, m, k, q, scales
    qrt_parallel_for(j.parts, <int>j.parts - 1, rows_task, &j)
    for c in range(j.parts):
        if j.bad[c]:
            return 1
    return 0


cdef void gemm_u8s8(const uint8_t* x, int32_t x_zp, const int8_t* w, const int32_t* w_rowsum,
                    const int32_t* w_zp, Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                    int32_t* acc) noexcept nogil:
    """The oracle: acc[i, j] = sum_k (x[i, k] - x_zp) * (w[j, k] - w_zp[j]), exactly, in int32.

    Expanded as sum(x*w) - x_zp*rowsum(w) - w_zp*rowsum(x) + k*x_zp*w_zp.
    Plain loops over unpacked weights: the fast kernels are tested against it.
    """
    cdef Py_ssize_t i, j, t
    cdef int32_t dot, x_sum
    cdef const uint8_t* xr
    cdef const int8_t* wr
    for i in range(m):
        xr = x + i * k
        x_sum = 0
        for t in range(k):
            x_sum += xr[t]
        for j in range(n):
            wr = w + j * k
            dot = 0
            for t in range(k):
                dot += <int32_t>xr[t] * <int32_t>wr[t]
            acc[i * n + j] = dot - x_zp * w_rowsum[j] - w_zp[j] * x_sum + <int32_t>k * x_zp * w_zp[j]


cdef void gemm_f32_chain(const float* x, const float* w, const float* bias,
                         Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, float* y) noexcept nogil:
    """The oracle: y = x @ w.T (+ bias) as fbgemm's fp16 kernel rounds it.

    Each output is one fma chain over k in order. In the last partial block
    of 32 output columns, when k > 512, the chain restarts every 512 values
    and the block sums are added with plain float adds.
    """
    cdef Py_ssize_t i, j, t, kb, kend
    cdef Py_ssize_t tail_start = n - n % 32
    cdef float total, part
    cdef const float* xr
    cdef const float* wr
    for i in range(m):
        xr = x + i * k
        for j in range(n):
            wr = w + j * k
            if j >= tail_start and k > 512:
                total = 0
                for kb in range(0, k, 512):
                    kend = kb + 512 if kb + 512 < k else k
                    part = 0
                    for t in range(kb, kend):
                        part = fmaf(xr[t], wr[t], part)
                    total = total + part
            else:
                total = 0
                for t in range(k):
                    total = fmaf(xr[t], wr[t], total)
            y[i * n + j] = total + bias[j] if bias != NULL else total


def gemm_u8s8_reference(const uint8_t[:, ::1] x, int32_t x_zp, const int8_t[:, ::1] w,
                        const int32_t[::1] w_zp, int32_t[:, ::1] acc) -> None:
    """The oracle on arrays (for tests): acc = (x - x_zp) @ (w - w_zp[:, None]).T in int32."""
    cdef Py_ssize_t m = x.shape[0], n = w.shape[0], k = x.shape[1]
    if w.shape[1] != k or w_zp.shape[0] != n or acc.shape[0] != m or acc.shape[1] != n:
        raise ValueError("gemm_u8s8_reference: shape mismatch")
    cdef int32_t[::1] rowsum = np.asarray(w).sum(axis=1, dtype=np.int32)
    if m and n:
        gemm_u8s8(&x[0, 0] if k else NULL, x_zp, &w[0, 0] if k else NULL, &rowsum[0], &w_zp[0], m, n, k,
                  &acc[0, 0])


def gemm_f32_chain_reference(const float[:, ::1] x, const float[:, ::1] w, bias, float[:, ::1] y) -> None:
    """The oracle on arrays (for tests): fbgemm's float16 linear with w widened to float32."""
    cdef Py_ssize_t m = x.shape[0], n = w.shape[0], k = x.shape[1]
    if w.shape[1] != k or y.shape[0] != m or y.shape[1] != n:
        raise ValueError("gemm_f32_chain_reference: shape mismatch")
    cdef const float[::1] b
    cdef const float* bp = NULL
    if bias is not None:
        b = np.ascontiguousarray(bias, np.float32)
        bp = &b[0] if n else NULL
    if m and n:
        gemm_f32_chain(&x[0, 0] if k else NULL, &w[0, 0] if k else NULL, bp, m, n, k, &y[0, 0])


cdef enum:
    SCRATCH_BYTES = 8192  # a call's buffers up to this size are on its stack: batch 1 allocates nothing
    SCRATCH_ROWS = 64


cdef inline size_t next_line(size_t address) noexcept nogil:
    """address rounded up to a 64-byte boundary (a cache line)."""
    return (address + 63) & ~(<size_t>63)


cdef object empty_on_a_line(int nd, cnp.npy_intp* dims, int typenum):
    """An uninitialised C-contiguous array starting on a 64-byte boundary: a view of a byte buffer 63 bytes
    longer (numpy's own allocations are aligned to 16 bytes)."""
    cdef object descr = cnp.PyArray_DescrFromType(typenum)  # untyped: the typed .itemsize needs numpy 2's C API
    cdef cnp.npy_intp size = cnp.PyArray_MultiplyList(dims, nd) * descr.itemsize + 63
    buf = cnp.PyArray_EMPTY(1, &size, cnp.NPY_UINT8, 0)
    a = cnp.PyArray_SimpleNewFromData(nd, dims, typenum, <void*>next_line(<size_t>cnp.PyArray_DATA(buf)))
    cnp.set_array_base(a, buf)
    return a


cdef object aligned_empty(Py_ssize_t nbytes):
    """A uint8 array of nbytes starting on a 64-byte boundary (one cache line)."""
    cdef cnp.npy_intp n = nbytes
    return empty_on_a_line(1, &n, cnp.NPY_UINT8)


cdef extern from "layout.h" nogil:
    enum: QRT_I8_NPAD
    ptrdiff_t qrt_i8_packed_size(ptrdiff_t n, ptrdiff_t k)
    void qrt_i8_pack(const int8_t* w, ptrdiff_t n, ptrdiff_t k, int8_t* out)
    ptrdiff_t qrt_fp_packed_size(ptrdiff_t n, ptrdiff_t k)
    void qrt_fp_pack(const void* w, ptrdiff_t n, ptrdiff_t k, size_t size, void* out)


def pack_matrix(w, tuple shape):
    """w [n, k] (int8, float16 or float32, C-contiguous) packed into a new 64-byte aligned array of
    qrt.layout.packed_shape `shape` (qrt/kernels/layout.h)."""
    if w.ndim != 2 or not w.flags.c_contiguous or w.dtype.itemsize not in (1, 2, 4):
        raise ValueError("pack_matrix: w must be a C-contiguous matrix of 1-, 2- or 4-byte elements")
    cdef Py_ssize_t n = w.shape[0], k = w.shape[1], size = w.dtype.itemsize
    cdef Py_ssize_t nbytes = qrt_i8_packed_size(n, k) if size == 1 else qrt_fp_packed_size(n, k) * size
    if math.prod(shape) * size != nbytes:
        raise ValueError(f"pack_matrix: shape {list(shape)} is not the packed size of [{n}, {k}]")
    out = aligned_empty(nbytes).view(w.dtype).reshape(shape)
    cdef const uint8_t[::1] wv = w.reshape(-1).view(np.uint8)
    cdef uint8_t[::1] ov = out.reshape(-1).view(np.uint8)
    if nbytes:
        with nogil:
            if size == 1:
                qrt_i8_pack(<const int8_t*>&wv[0] if n * k else NULL, n, k, <int8_t*>&ov[0])
            else:
                qrt_fp_pack(&wv[0] if n * k else NULL, n, k, size, &ov[0])
    return out


cdef object packed_data(weight, dtype, Py_ssize_t nbytes):
    """weight's packed bytes as a 1-D array of dtype: a PackedMatrix's own (read where it lies, a view of
    the mapped file), or a plain matrix packed now."""
    p = weight if isinstance(weight, PackedMatrix) else pack(np.asarray(weight, dtype))
    data = p.data.reshape(-1).view(dtype)
    if p.data.dtype != dtype or not p.data.flags.c_contiguous or data.nbytes != nbytes:
        raise ValueError(f"packed weights of {p.data.dtype} and {p.data.nbytes} bytes, expected {np.dtype(dtype)} and "
                         f"{nbytes} bytes for shape {list(p.shape)}")
    return p, data


cdef struct pack_job:  # x's row tiles packed in chunks, task t the t-th chunk
    const qrt_kernels* kern
    const uint8_t* x
    uint8_t* out
    Py_ssize_t m, k, parts
    int largest[64]


cdef inline Py_ssize_t packed_offset(const qrt_kernels* kern, Py_ssize_t r0, Py_ssize_t k) noexcept nogil:
    """Where row r0, a row tile's first, is packed: a chunk of whole row tiles packs on its own into its place,
    tile i at row i's packed offset (the size of r0 rows less that of none: a variant's room to align its
    start, amx-int8's, counts once)."""
    return kern.i8_packed_x_size(r0, k) - kern.i8_packed_x_size(0, k)


cdef void pack_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef pack_job* j = <pack_job*>ctx
    cdef Py_ssize_t r0 = chunk_whole(j.m, j.kern.i8_mr, j.parts, t), r1 = chunk_whole(j.m, j.kern.i8_mr, j.parts, t + 1)
    j.largest[t] = j.kern.i8_pack_x(j.x + r0 * j.k, r1 - r0, j.k, j.out + packed_offset(j.kern, r0, j.k))


cdef int pack_x(const qrt_kernels* kern, const uint8_t* x, Py_ssize_t m, Py_ssize_t k, uint8_t* out) noexcept nogil:
    """kern.i8_pack_x(x, m, k, out), large x packed in parallel by chunks of row tiles: the largest value."""
    cdef pack_job j
    cdef int largest = 0, c
    j.parts = max(1, min(<Py_ssize_t>num_threads, m * k // min_pack(), (m + kern.i8_mr - 1) // kern.i8_mr, 64))
    if j.parts == 1:
        return kern.i8_pack_x(x, m, k, out)
    j.kern, j.x, j.out, j.m, j.k = kern, x, out, m, k
    qrt_parallel_for(j.parts, <int>j.parts - 1, pack_task, &j)
    for c in range(j.parts):
        largest = max(largest, j.largest[c])
    return largest


cdef struct i8_job:  # a product's tiles, task t the (t // cn)-th row chunk's (t % cn)-th panel chunk (see i8_task)
    const qrt_kernels* kern
    const uint8_t* xp
    int32_t x_zp
    const int32_t* rowsum
    const int8_t* packed
    const int32_t* w_zp
    const int32_t* xsum
    Py_ssize_t n, k, m, mr, panels, cn, cm
    int small_x, plain
    const qrt_epilogue* e
    const float* xf  # float x, quantized into xp by row chunks (i8_quantize_task), when not NULL
    float inv
    int round_first


cdef inline Py_ssize_t chunk_rows(const i8_job* j, Py_ssize_t r) noexcept nogil:
    """The first row of the r-th of the cm row chunks (r = cm: m): whole row tiles but the last."""
    return chunk_whole(j.m, j.mr, j.cm, r)


cdef void i8_task(void* ctx, ptrdiff_t t) noexcept nogil:
    """Tile t, consecutive tiles along a row chunk: the pool's shares of consecutive tasks (threadpool.h) give a
    thread whole row chunks, the rows the row-split step before it wrote on that thread."""
    cdef i8_job* j = <i8_job*>ctx
    cdef Py_ssize_t r = t // j.cn, c = t % j.cn
    j.kern.gemm_u8s8(j.xp, j.x_zp, j.rowsum, j.packed, j.w_zp, j.xsum, j.n, j.k, chunk_rows(j, r), chunk_rows(j, r + 1),
                     chunk(j.panels, j.cn, c), chunk(j.panels, j.cn, c + 1), j.small_x, j.plain, j.e)


cdef void i8_quantize_task(void* ctx, ptrdiff_t r) noexcept nogil:
    """Row chunk r of xf quantized into its place in xp (packed_offset)."""
    cdef i8_job* j = <i8_job*>ctx
    cdef Py_ssize_t r0 = chunk_rows(j, r), r1 = chunk_rows(j, r + 1)
    j.kern.i8_quantize_pack_x(j.xf + r0 * j.k, r1 - r0, j.k, j.inv, <float>j.x_zp, j.round_first,
                              <uint8_t*>j.xp + packed_offset(j.kern, r0, j.k))


cdef void i8_quantize_product_task(void* ctx, ptrdiff_t r) noexcept nogil:
    """Row chunk r quantized, then its product (a grid of row chunks alone, cn 1): each task reads only the
    rows it packed, so the two need no parallel loop, and no wait, between them."""
    i8_quantize_task(ctx, r)
    i8_task(ctx, r)


cdef void run_product(i8_job* j, int helpers) noexcept nogil:
    """The product of j's cm x cn grid: on the caller alone when it is one tile."""
    if j.cn * j.cm == 1:
        i8_task(j, 0)
    else:
        qrt_parallel_for(j.cn * j.cm, helpers, i8_task, j)


cdef class PackedS8:
    """qint8 weights [n, k] in the packed layout every variant reads (qrt.layout: a PackedMatrix is used
    where it lies, a plain matrix packed once), with their row sums and zero points."""
    cdef readonly Py_ssize_t n, k
    cdef const qrt_kernels* kern
    cdef bint any_zp
    cdef object arrays
    cdef const int8_t* packed
    cdef const int32_t* rowsum
    cdef const int32_t* zp

    def __init__(self, weight, zero_point):
        self.n, self.k = weight.shape
        self.kern = active
        p, packed = packed_data(weight, np.int8, qrt_i8_packed_size(self.n, self.k))
        if np.shape(p.row_sums) != (self.n,):
            raise ValueError(f"row sums of shape {list(np.shape(p.row_sums))}, expected [{self.n}]")
        # zero-padded to whole panels: the tiles start every column's sum from it, padding columns too
        rs = np.zeros((self.n + QRT_I8_NPAD - 1) // QRT_I8_NPAD * QRT_I8_NPAD, np.int32)
        rs[:self.n] = p.row_sums
        z = np.ascontiguousarray(np.broadcast_to(np.asarray(zero_point, np.int32), (self.n,)))
        cdef const int8_t[::1] pv = packed
        cdef const int32_t[::1] zv = z, rv = rs
        self.packed = &pv[0] if packed.size else NULL
        self.zp = &zv[0] if self.n else NULL
        self.rowsum = &rv[0] if self.n else NULL
        self.any_zp = bool(np.any(z))
        self.arrays = [packed, z, rs]

    cdef int matmul(self, const uint8_t* x, Py_ssize_t m, int32_t x_zp, const qrt_epilogue* e) noexcept nogil:
        """(x - x_zp) @ (w - w_zp).T, exact in int32, to the epilogue e; x is [m, k]. -1: out of memory."""
        cdef const qrt_kernels* kern = self.kern
        cdef Py_ssize_t n = self.n, k = self.k, i, t, cn, cm, mr = kern.i8_task_rows
        cdef Py_ssize_t panels = (n + kern.i8_nr - 1) // kern.i8_nr
        # one row with whole groups of 4 k is read as it is; anything else is packed into row tiles
        cdef bint plain = m == 1 and k > 0 and k % 4 == 0, small_x
        # small buffers live on this call's stack (a batch-1 product allocates nothing), larger ones on the heap
        cdef int32_t xsum_stack[SCRATCH_ROWS]
        cdef uint8_t xp_stack[SCRATCH_BYTES]
        cdef int32_t* xsum = NULL
        cdef const int32_t* w_zp = self.zp if self.any_zp else NULL
        cdef uint8_t* xp = <uint8_t*>x if plain else xp_stack
        cdef int err = 0, helpers
        cdef int64_t work
        cdef i8_job j
        if m == 0 or n == 0:
            return 0
        if not plain and kern.i8_packed_x_size(m, k) > SCRATCH_BYTES:
            xp = <uint8_t*>malloc(kern.i8_packed_x_size(m, k))
        if self.any_zp:  # rowsum(x) is only needed against nonzero weight zero points
            xsum = &xsum_stack[0] if m <= SCRATCH_ROWS else <int32_t*>malloc(m * sizeof(int32_t))
        if xp == NULL or (self.any_zp and xsum == NULL):
            err = -1
        else:
            # the faster flavour, where the variant has one, takes activations of at most 128; both are exact
            if plain:
                small_x = kern.i8_small_x and kern.u8_max(x, k) <= 128
            else:
                small_x = pack_x(kern, x, m, k, xp) <= 128
            if self.any_zp:
                for i in range(m):
                    xsum[i] = 0
                    for t in range(k):
                        xsum[i] += x[i * k + t]
            work = product_work(m, n, k)
            helpers = split_work(m, panels, mr, work, MIN_WORK_I8, i8_rows_first(m, n, k, mr, work), &cn, &cm)
            j = i8_job(kern, xp, x_zp, self.rowsum, self.packed, w_zp, xsum, n, k, m, mr, panels, cn, cm, small_x,
                       plain, e, NULL, 0, 0)
            run_product(&j, helpers)
        if xsum != xsum_stack:
            free(xsum)
        if xp != xp_stack and not plain:
            free(xp)
        return err

    cdef int matmul_float(self, const float* x, Py_ssize_t m, float inv, int32_t x_zp, bint round_first,
                          bint small_x, const qrt_epilogue* e, bint by_panels) noexcept nogil:
        """matmul of x [m, k] (m, n, k > 0) quantized by kern.quantize_u8 (inv, x_zp, round_first) straight into
        the packed layout (i8_quantize_pack_x), for weights without zero points (no rowsum(x) to take). Split
        by rows alone where every thread gets a chunk, each task quantizing the rows it multiplies; else the
        row chunks quantized first, then the product's grid. by_panels: the grid is panel chunks of all rows
        (the columns a thread writes are the heads its next step reads). -1: out of memory."""
        cdef const qrt_kernels* kern = self.kern
        cdef Py_ssize_t n = self.n, k = self.k, cn, cm, panels = (n + kern.i8_nr - 1) // kern.i8_nr
        cdef uint8_t xp_stack[SCRATCH_BYTES]
        cdef uint8_t* xp = xp_stack
        cdef int64_t work = product_work(m, n, k)
        cdef int helpers = split_work(m, panels, kern.i8_task_rows, work, MIN_WORK_I8,
                                      not by_panels and i8_rows_first(m, n, k, kern.i8_task_rows, work), &cn, &cm)
        cdef i8_job j
        if by_panels and helpers:  # one chunk a thread, its heads (MiniLM's 128x384x1152 on 2 threads: 8 chunks,
            cm, cn = 1, min(panels, helpers + 1)  # the usual 4 a thread, took 57.7 us against 49.0)
        elif cm >= num_threads:  # rows enough for every thread: one loop, no wait between quantizing and product
            cn = 1
        if kern.i8_packed_x_size(m, k) > SCRATCH_BYTES:
            xp = <uint8_t*>malloc(kern.i8_packed_x_size(m, k))
            if xp == NULL:
                return -1
        j = i8_job(kern, xp, x_zp, self.rowsum, self.packed, NULL, NULL, n, k, m, kern.i8_task_rows, panels, cn, cm,
                   small_x, False, e, x, inv, round_first)
        if cn * cm == 1:
            i8_quantize_product_task(&j, 0)
        elif cn == 1:
            qrt_parallel_for(cm, helpers, i8_quantize_product_task, &j)
        else:  # x's row chunks quantized first, then the grid; by_panels: a row chunk a thread (the grid's is all rows)
            j.cm = min((m + j.mr - 1) // j.mr, helpers + 1) if by_panels else cm
            qrt_parallel_for(j.cm, helpers, i8_quantize_task, &j)
            j.cm = cm
            qrt_parallel_for(cn * cm, helpers, i8_task, &j)
        if xp != xp_stack:
            free(xp)
        return 0

    def __call__(self, const uint8_t[:, ::1] x, int32_t x_zp, int32_t[:, ::1] acc):
        """acc = (x - x_zp) @ (w - w_zp).T (for tests and benchmarks)."""
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.k or acc.shape[0] != m or acc.shape[1] != self.n:
            raise ValueError("PackedS8: shape mismatch")
        cdef qrt_epilogue e
        memset(&e, 0, sizeof(e))
        e.acc = &acc[0, 0] if m and self.n else NULL
        cdef int err
        with nogil:
            err = self.matmul(&x[0, 0] if m and self.k else NULL, m, x_zp, &e)
        if err:
            raise MemoryError()


cdef struct fp_job:  # as i8_job, over row tiles of the float product, but task t the (t % cm)-th row chunk of the
    # (t // cm)-th panel chunk: panel chunks outermost, as its split (split_work, panels first); the chunks cut
    # groups of `group` panels (one row: the kernel's one-row pass), the last group cut short at `panels`
    const qrt_kernels* kern
    const float* xp
    const void* packed
    int half
    const float* bias
    Py_ssize_t n, k, m, tiles, panels, group, cn, cm
    float* y
    Py_ssize_t widen


cdef void fp_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef fp_job* j = <fp_job*>ctx
    cdef Py_ssize_t r = t % j.cm, c = t // j.cm
    j.kern.gemm_fp(j.xp, j.packed, j.half, j.bias, j.n, j.k, j.m, chunk(j.tiles, j.cm, r), chunk(j.tiles, j.cm, r + 1),
                   chunk_whole(j.panels, j.group, j.cn, c), chunk_whole(j.panels, j.group, j.cn, c + 1), j.y, j.n,
                   j.widen)


cdef class PackedFloat:
    """float16 weights (half; given as float16, or float32 holding float16 values) or float32 weights
    [n, k] in the packed layout every variant reads (a PackedMatrix used where it lies, a plain matrix
    packed once), for the float product: fma chains in fbgemm's float16 order."""
    cdef readonly Py_ssize_t n, k
    cdef readonly bint half
    cdef readonly Py_ssize_t widen  # k of float16 weights widened at once (gemm_fp); 0: never
    cdef const qrt_kernels* kern
    cdef object arrays
    cdef const void* packed

    def __init__(self, weight, bint half=True):
        self.n, self.k = weight.shape
        self.half = half
        self.kern = active
        self.widen = FP_WIDEN if FP_WIDEN >= 0 else qrt_fp_widen_default(active)
        dtype = np.float16 if half else np.float32  # float16 holds a float16 value exactly
        _, packed = packed_data(weight, dtype, qrt_fp_packed_size(self.n, self.k) * (2 if half else 4))
        cdef const uint8_t[::1] pv = packed.view(np.uint8)
        self.packed = &pv[0] if packed.size else NULL
        self.arrays = [packed]

    cdef int gemm(self, const float* x, Py_ssize_t m, const float* bias, float* y) noexcept nogil:
        """y[m, n] = x @ w.T (+ bias) with fbgemm's float16 rounding; x is [m, k]. -1: out of memory."""
        cdef const qrt_kernels* kern = self.kern
        cdef Py_ssize_t n = self.n, k = self.k, cn, cm, nr = kern.fp_nr, mr = kern.fp_mr
        cdef Py_ssize_t panels = (n + nr - 1) // nr, tiles = (m + mr - 1) // mr
        # one row runs whole passes of fp_row_nr columns: a task of fewer panels than a pass kept too few fma
        # chains (avx512-vnni, M=1 K=N=1024 at 16 threads on 2 CPUs, 32 one-panel tasks: 18.8 us; in passes 11.1)
        cdef Py_ssize_t group = kern.fp_row_nr // nr if m == 1 else 1
        cdef float* xp
        cdef fp_job j
        if m == 0 or n == 0:
            return 0
        xp = <float*>malloc(kern.fp_packed_x_size(m, k) * sizeof(float) + 1)
        if xp == NULL:
            return -1
        kern.fp_pack_x(x, m, k, xp)
        cdef int helpers = split_work(m, (panels + group - 1) // group, mr, product_work(m, n, k), MIN_WORK_F16, False,
                                      &cn, &cm)
        if cn * cm == 1:
            kern.gemm_fp(xp, self.packed, self.half, bias, n, k, m, 0, tiles, 0, panels, y, n, self.widen)
        else:
            j = fp_job(kern, xp, self.packed, self.half, bias, n, k, m, tiles, panels, group, cn, cm, y, self.widen)
            qrt_parallel_for(cn * cm, helpers, fp_task, &j)
        free(xp)
        return 0

    def __call__(self, const float[:, ::1] x, bias, float[:, ::1] y):
        """y = x @ w.T (+ bias); shapes are checked here, before the GIL is released."""
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.k or y.shape[0] != m or y.shape[1] != self.n:
            raise ValueError("PackedFloat: shape mismatch")
        cdef const float[::1] b
        cdef const float* bp = NULL
        if bias is not None:
            b = np.ascontiguousarray(bias, np.float32)
            if b.shape[0] != self.n:
                raise ValueError("PackedFloat: bias shape mismatch")
            bp = &b[0] if self.n else NULL
        cdef int err
        with nogil:
            err = self.gemm(&x[0, 0] if m and self.k else NULL, m, bp, &y[0, 0] if m and self.n else NULL)
        check_error(err)


# ------------------------------------------------------------ layers with prepared weights

cdef struct prepared_input:
    const float* x     # the input rows, [m, k]
    uint8_t* q         # int8 weights: x quantized with (scale, zero_point), [m, k]
    float scale
    int32_t zero_point
    float* scales      # per-row activation scales (per_row layers), [m]: release() frees them
    bint owned         # q was allocated by prepare(), release() frees it


cdef void release(prepared_input* p) noexcept nogil:
    if p.owned:
        free(p.q)
    free(p.scales)
    p.q, p.scales, p.owned = NULL, NULL, False


cdef inline void relu_to(const float* x, float* y, Py_ssize_t n) noexcept nogil:
    """y = relu(x) as torch.relu gives it (gate_math.h's qrt_relu: NaN and -0.0 stay)."""
    cdef Py_ssize_t i
    for i in range(n):
        y[i] = qrt_relu(x[i])


cdef class DynamicLinear:
    """A dynamic quantized linear layer, weights prepared once.

    int8 weights: y = fma(fl(acc), fl(s_x * s_w[n]), bias[n]) where acc is
    the exact integer product of the per-call quantized input and the
    weights; qnnpack: activations over 0..255 whatever reduce_range says, quantized as torch
    on aarch64 does (the zero point added after rounding), and y = fl(fl(acc) * fl(s_x * s_w[n])) + bias[n];
    per_row (torchao's Int8Tensor linear): one symmetric int8 scale s_x[m] per row (quantize_rows) and
    y = fl(fl(fl(acc) * s_x[m]) * s_w[n]) + bias[n]. float16 weights: applied
    with the fp16 kernel's accumulation order (PackedFloat), on either engine; float32 weights (the float
    recurrent ops' linears): the same chains over the float32 values, linear_float's product.
    """
    cdef readonly Py_ssize_t out_features, in_features
    cdef readonly bint is_int8, qnnpack, per_row
    cdef bint reduce_range
    cdef PackedS8 w8
    cdef PackedFloat wf  # float16 or float32 weights
    cdef object arrays  # keeps the buffers below alive
    cdef const float* scale
    cdef const float* bias

    def __init__(self, weight, scale=None, zero_point=None, bias=None, bint reduce_range=True,
                 bint qnnpack=False, bint per_row=False):
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.per_row = per_row
        self.reduce_range = reduce_range and not qnnpack  # qnnpack ignores reduce_range (with a warning)
        self.qnnpack = qnnpack
        self.is_int8 = weight.dtype == np.int8
        cdef const float[::1] fv
        keep = []
        if self.is_int8:
            self.w8 = PackedS8(weight, zero_point)
            s = np.ascontiguousarray(np.broadcast_to(np.asarray(scale, np.float32), (n,)))
            keep.append(s)
            fv = s
            self.scale = &fv[0] if n else NULL
        else:
            self.wf = PackedFloat(weight, half=weight.dtype != np.float32)
        if bias is not None:
            b = np.ascontiguousarray(bias, dtype=np.float32)
            keep.append(b)
            fv = b
            self.bias = &fv[0] if n else NULL
        self.arrays = keep

    cdef int prepare(self, const float* x, Py_ssize_t m, prepared_input* p, uint8_t* buf,
                     Py_ssize_t buf_size) noexcept nogil:
        """Make x[m, k] ready for project(): for int8 weights, quantize it (one scale for all m rows, or one
        a row if per_row), into buf if it holds m * k bytes, else into memory of its own. Returns 1 if x holds
        NaN or infinity, -1 if out of memory; p is to be released either way."""
        cdef Py_ssize_t n = self.out_features, k = self.in_features
        memset(p, 0, sizeof(prepared_input))
        p.x = x
        if not self.is_int8 or m == 0 or n == 0:
            return 0
        if buf != NULL and m * k <= buf_size:
            p.q = buf
        else:
            p.q, p.owned = <uint8_t*>malloc(m * k + 1), True  # + 1: k may be 0, and malloc(0) may be NULL
            if p.q == NULL:
                return -1
        if self.per_row:
            p.scales, p.zero_point = <float*>malloc(m * sizeof(float)), 128
            if p.scales == NULL:
                return -1
            return quantize_rows(self.w8.kern, x, m, k, p.q, p.scales)
        if k and quantize_activations(self.w8.kern, x, m * k, self.reduce_range, self.qnnpack, p.q, &p.scale,
                                      &p.zero_point):
            return 1
        return 0

    cdef int project(self, const prepared_input* p, Py_ssize_t row, Py_ssize_t m, float* y,
                     bint relu) noexcept nogil:
        """y[m, n] = layer(x[row:row + m]) (then relu(y) if relu) for x prepared by prepare().
        -1: out of memory."""
        cdef qrt_epilogue e
        cdef int err
        if m == 0 or self.out_features == 0:
            return 0
        if not self.is_int8:
            err = self.wf.gemm(p.x + row * self.in_features, m, self.bias, y)
            if err == 0 and relu:
                relu_to(y, y, m * self.out_features)
            return err
        memset(&e, 0, sizeof(e))
        e.y, e.x_scale, e.w_scale, e.bias, e.relu, e.qnnpack = y, p.scale, self.scale, self.bias, relu, self.qnnpack
        e.x_scales = p.scales + row if self.per_row else NULL
        return self.w8.matmul(p.q + row * self.in_features, m, p.zero_point, &e)

    cdef int forward(self, const float* x, Py_ssize_t m, float* y, bint relu, bint by_panels) noexcept nogil:
        """y[m, n] from x[m, k], then relu(y) if relu. by_panels: threads split the product by columns
        (PackedS8.matmul_float), where it can. Returns 1 if x holds NaN or infinity, -1 if out of memory."""
        cdef Py_ssize_t k = self.in_features
        if (self.is_int8 and not self.per_row and not self.w8.any_zp and m and k and self.out_features
                and not (m == 1 and k % 4 == 0)):  # one such row is read as it is: nothing to pack
            return self.forward_packed(x, m, y, relu, by_panels)
        cdef prepared_input p
        cdef uint8_t buf[SCRATCH_BYTES]  # a batch-1 input quantizes into this call's stack
        cdef int err = self.prepare(x, m, &p, buf, SCRATCH_BYTES)
        if err == 0:
            err = self.project(&p, 0, m, y, relu)
        release(&p)
        return err

    cdef int forward_packed(self, const float* x, Py_ssize_t m, float* y, bint relu, bint by_panels) noexcept nogil:
        """forward() of int8 weights without zero points: x's range, then x quantized straight into the packed
        layout the product reads (PackedS8.matmul_float), the q values and sums those of prepare() and project().
        The largest q, which picks the product's flavour, is hi's: quantization is monotonic in x."""
        cdef const qrt_kernels* kern = self.w8.kern
        cdef float lo, hi
        cdef uint8_t largest
        cdef qrt_epilogue e
        memset(&e, 0, sizeof(e))
        if x_range(kern, x, m * self.in_features, &lo, &hi):
            return 1
        cdef int32_t zp
        qrt_choose_qparams(lo, hi, self.reduce_range, &e.x_scale, &zp)
        cdef float inv = <float>1.0 / e.x_scale
        kern.quantize_u8(&hi, 1, inv, <float>zp, self.qnnpack, &largest)
        e.y, e.w_scale, e.bias, e.relu, e.qnnpack = y, self.scale, self.bias, relu, self.qnnpack
        return self.w8.matmul_float(x, m, inv, zp, self.qnnpack, largest <= 128, &e, by_panels)

    def __call__(self, const float[:, ::1] x, float[:, ::1] y, bint relu=False):
        """y = layer(x), then relu(y) if relu. Shapes are checked here, before the GIL is released."""
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.in_features or y.shape[0] != m or y.shape[1] != self.out_features:
            raise ValueError("DynamicLinear: shape mismatch")
        cdef int err
        with nogil:
            err = self.forward(&x[0, 0] if m and self.in_features else NULL, m,
                               &y[0, 0] if m and self.out_features else NULL, relu, False)
        check_error(err)


cdef check_error(int err):
    if err == 1:
        raise ValueError("input contains NaN or infinity, which dynamic quantization cannot represent")
    if err:
        raise MemoryError()


def qnnpack_bias(b, a_w) -> np.ndarray:
    """The bias as torch's qnnpack packs it: quantize_per_tensor/channel to qint32 at scale a_w, zero
    point 0, so rne(fl(b * fl(1 / a_w))) clamped to int32 (measured, docs/NUMERICS.md)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.rint(np.asarray(b, np.float32) * (np.float32(1) / np.asarray(a_w, np.float32))).astype(np.float64)
    return np.ascontiguousarray(np.clip(np.nan_to_num(v), -(2.0**31), 2.0**31 - 1), dtype=np.int32)


cdef class StaticLinear:
    """Static quantized linear (+ReLU): quint8 in, qint8 weights, float bias, quint8 out.

    Requantization as fbgemm does it: a float multiplier per output channel,
    the bias folded into the accumulator scale first, the rounded value
    saturated to int16 before the zero point is added and the result clamped.
    qnnpack: the bias quantized to int32 (scale fl(s_x * s_w)) and added to the
    sums exactly, the multiplier fl(fl(s_x * s_w) * fl(1 / s_y)); the rest alike.
    """
    cdef readonly Py_ssize_t out_features, in_features
    cdef int32_t x_zp, y_zp, lo
    cdef bint per_channel, has_bias
    cdef float bias_inv  # per-tensor: fl(1 / double(a_w))
    cdef PackedS8 w
    cdef object arrays
    cdef const float* bias
    cdef const float* bias_q  # per-channel: fl(bias / a_w)
    cdef const float* mult
    cdef const int32_t* bias_i  # qnnpack: the bias in int32

    def __init__(self, weight, w_scale, w_zero_point, bias, float x_scale, int32_t x_zero_point,
                 float y_scale, int32_t y_zero_point, bint relu, bint qnnpack=False):
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.x_zp, self.y_zp = x_zero_point, y_zero_point
        self.lo = y_zero_point if relu else 0  # ReLU is the lower clamp at the zero point
        self.per_channel = np.ndim(w_scale) == 1
        self.has_bias = bias is not None
        self.w = PackedS8(weight, w_zero_point)
        s_w = np.broadcast_to(np.asarray(w_scale, np.float32), (n,))
        a_w = (np.float32(x_scale) * s_w).astype(np.float32)
        if qnnpack:
            mult = np.ascontiguousarray(a_w * (np.float32(1) / np.float32(y_scale)), dtype=np.float32)
        else:
            mult = np.ascontiguousarray(a_w / np.float32(y_scale), dtype=np.float32)
        b = np.ascontiguousarray(bias if bias is not None else np.zeros(n), dtype=np.float32)
        with np.errstate(over="ignore"):  # a huge bias over a tiny a_w saturates: inf is its right value
            bq = (b / a_w).astype(np.float32)
        self.bias_inv = np.float32(1.0 / np.float64(a_w[0])) if n else 0
        bi = qnnpack_bias(b, a_w) if qnnpack and self.has_bias else None
        self.arrays = [mult, b, bq, bi]
        cdef const float[::1] fv
        cdef const int32_t[::1] iv
        if n:
            if bi is not None:
                iv = bi
                self.bias_i = &iv[0]
            fv = mult
            self.mult = &fv[0]
            fv = b
            self.bias = &fv[0]
            fv = bq
            self.bias_q = &fv[0]

    cdef int forward(self, const uint8_t* x, Py_ssize_t m, uint8_t* y) noexcept nogil:
        cdef qrt_epilogue e
        memset(&e, 0, sizeof(e))
        e.q, e.bias_inv, e.mult, e.zp, e.lo = y, self.bias_inv, self.mult, self.y_zp, self.lo
        e.bias_i = self.bias_i
        if self.has_bias and self.bias_i == NULL:
            if self.per_channel:
                e.bias_q = self.bias_q
            else:
                e.bias_t = self.bias
        return self.w.matmul(x, m, self.x_zp, &e)

    def __call__(self, const uint8_t[:, ::1] x, uint8_t[:, ::1] y):
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.in_features or y.shape[0] != m or y.shape[1] != self.out_features:
            raise ValueError("StaticLinear: shape mismatch")
        if m == 0 or self.out_features == 0:
            return
        cdef int err
        with nogil:
            err = self.forward(&x[0, 0] if self.in_features else NULL, m, &y[0, 0])
        check_error(err)


# ------------------------------------------------------------ recurrent layers

cdef extern from "gate_math.h" nogil:
    enum qrt_cell:
        QRT_RNN_TANH, QRT_RNN_RELU, QRT_LSTM, QRT_GRU
    float qrt_tanh(float v)
    float qrt_sigmoid(float v)
    float qrt_relu(float v)

KINDS = {"rnn_tanh": QRT_RNN_TANH, "rnn_relu": QRT_RNN_RELU, "lstm": QRT_LSTM, "gru": QRT_GRU}
GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}


def check_states(Py_ssize_t batch, Py_ssize_t hidden, list shapes):
    for shape in shapes:
        if shape != (batch, hidden):
            raise ValueError(f"state has shape {list(shape)}, expected {[batch, hidden]}")


cdef inline Py_ssize_t align64(Py_ssize_t n) noexcept nogil:
    return (n + 63) // 64 * 64


cdef inline void* align_up(void* p) noexcept nogil:
    """p moved up to the next 64-byte boundary (scratch sizes allow 64 bytes for it)."""
    return <void*>((<size_t>p + 63) // 64 * 64)


cdef struct gate_job:  # a step's gates, task t the t-th run of whole vectors of hidden units
    const qrt_kernels* kern
    int kind
    const float* gi
    float* gh
    const float* h
    const float* c
    float* h_out
    float* c_out
    Py_ssize_t b, hidden, parts


cdef void gate_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef gate_job* j = <gate_job*>ctx
    j.kern.gate_update(j.kind, j.gi, j.gh, j.h, j.c, j.h_out, j.c_out, j.b, j.hidden,
                       chunk_whole(j.hidden, 16, j.parts, t), chunk_whole(j.hidden, 16, j.parts, t + 1))


cdef class Recurrent:
    """One direction of a dynamic quantized recurrent layer: RNN (tanh/relu), LSTM or GRU.

    ``step`` runs one cell step; ``sequence`` runs the whole time loop in
    compiled code. For LSTM and GRU the input projection of all time steps is
    one dynamic linear over T*B rows (torch quantizes it over the whole
    sequence at once); for RNN it is per step, as a loop of RNNCells does.
    """
    cdef DynamicLinear ih, hh
    cdef const qrt_kernels* kern
    cdef int kind
    cdef readonly Py_ssize_t hidden, input_size
    cdef Py_ssize_t gates

    def __init__(self, str kind, DynamicLinear ih, DynamicLinear hh):
        self.kind = KINDS[kind]
        self.kern = active
        self.gates = GATES[kind]
        self.ih, self.hh = ih, hh
        self.hidden = hh.in_features
        self.input_size = ih.in_features
        if hh.out_features != self.gates * self.hidden or ih.out_features != hh.out_features:
            raise ValueError("Recurrent: weight shapes do not match the gate count")

    cdef void update(self, const float* gi, float* gh, const float* h, const float* c, float* h_out, float* c_out,
                     Py_ssize_t b) noexcept nogil:
        """The step's gates and new states (the variant's gate_update), hidden units split across threads
        in runs of 16 (whole vectors)."""
        cdef Py_ssize_t hidden = self.hidden, vectors = (hidden + 15) // 16
        cdef Py_ssize_t parts = max(1, min(<Py_ssize_t>num_threads, b * hidden // MIN_GATE_UNITS, vectors))
        cdef gate_job j
        if parts == 1:
            self.kern.gate_update(self.kind, gi, gh, h, c, h_out, c_out, b, hidden, 0, hidden)
            return
        j = gate_job(self.kern, self.kind, gi, gh, h, c, h_out, c_out, b, hidden, parts)
        qrt_parallel_for(parts, <int>parts - 1, gate_task, &j)

    def step(self, const float[:, ::1] x, const float[:, ::1] h, const float[:, ::1] c,
             float[:, ::1] h_out, float[:, ::1] c_out):
        """One step; c and c_out are used by LSTM only (pass h and h_out otherwise)."""
        cdef Py_ssize_t b = x.shape[0], hidden = self.hidden, rows = self.gates * self.hidden
        check_states(b, hidden, [(h.shape[0], h.shape[1]), (c.shape[0], c.shape[1]),
                                 (h_out.shape[0], h_out.shape[1]), (c_out.shape[0], c_out.shape[1])])
        if x.shape[1] != self.input_size:
            raise ValueError(f"x has {x.shape[1]} features, expected {self.input_size}")
        if b == 0 or hidden == 0:
            return
        cdef float[::1] gi = np.empty(b * rows, np.float32)
        cdef float[::1] gh = np.empty(b * rows, np.float32)
        cdef int err
        with nogil:
            err = self.step_into(&x[0, 0] if self.input_size else NULL, &h[0, 0], &c[0, 0], &h_out[0, 0],
                                 &c_out[0, 0], b, &gi[0], &gh[0])
        check_error(err)

    cdef int step_into(self, const float* x, const float* h, const float* c, float* h_out, float* c_out,
                       Py_ssize_t b, float* gi, float* gh) noexcept nogil:
        """One step on raw pointers; gi and gh are scratch of b * gates * hidden floats each.
        Returns 1 if x or h holds NaN or infinity, -1 if out of memory."""
        cdef int err = self.ih.forward(x, b, gi, False, False)
        if err == 0:
            err = self.hh.forward(h, b, gh, False, False)
        if err == 0:
            self.update(gi, gh, h, c, h_out, c_out, b)
        return err

    def sequence(self, const float[:, :, ::1] x, float[:, :, ::1] y, Py_ssize_t y_offset, bint reverse,
                 float[:, ::1] h, float[:, ::1] c):
        """Run over x [T, B, I]; write h_t into y[t, :, y_offset:y_offset+H].

        h and c hold the initial state on entry and the final state on return.
        """
        cdef Py_ssize_t steps = x.shape[0], b = x.shape[1], hidden = self.hidden
        if x.shape[2] != self.input_size or y.shape[0] != steps or y.shape[1] != b or y_offset + hidden > y.shape[2]:
            raise ValueError("Recurrent: sequence shape mismatch")
        check_states(b, hidden, [(h.shape[0], h.shape[1]), (c.shape[0], c.shape[1])])
        if steps == 0 or b == 0 or hidden == 0:
            return
        cdef Py_ssize_t block = self.sequence_block(steps, b)
        scratch = aligned_empty(self.sequence_scratch(steps, b, block))
        cdef uint8_t[::1] sv = scratch
        cdef int err
        with nogil:
            err = self.sequence_into(&x[0, 0, 0] if self.input_size else NULL, steps, b, &y[0, 0, y_offset],
                                     y.strides[0] // sizeof(float), y.strides[1] // sizeof(float), reverse,
                                     &h[0, 0], &c[0, 0], block, &sv[0])
        check_error(err)

    cdef Py_ssize_t sequence_block(self, Py_ssize_t steps, Py_ssize_t b) noexcept nogil:
        """Steps whose input projections sequence_into computes at once (1 for RNN)."""
        if self.kind != QRT_LSTM and self.kind != QRT_GRU:
            return 1
        return max(1, min(steps, PROJECTION_BYTES // (b * self.gates * self.hidden * sizeof(float))))

    cdef Py_ssize_t sequence_scratch(self, Py_ssize_t steps, Py_ssize_t b, Py_ssize_t block) noexcept nogil:
        """Bytes of scratch sequence_into needs: the quantized inputs (LSTM, GRU), then the projections
        and the new states, each part on a 64-byte boundary."""
        cdef Py_ssize_t rows = self.gates * self.hidden
        cdef Py_ssize_t q = 0
        if self.kind == QRT_LSTM or self.kind == QRT_GRU:
            q = steps * b * self.input_size
        return align64(q) + align64((block * b * rows + b * rows + 2 * b * self.hidden) * sizeof(float)) + 64

    cdef int sequence_into(self, const float* x, Py_ssize_t steps, Py_ssize_t b, float* y, Py_ssize_t ldt,
                           Py_ssize_t ldb, bint reverse, float* h, float* c, Py_ssize_t block,
                           uint8_t* scratch) noexcept nogil:
        """The time loop over x [steps, b, I] (steps, b, hidden > 0): h_t row i goes to y + t * ldt + i * ldb;
        h and c ([b, H]; c is read and written by LSTM only) hold the initial state on entry and the final
        one on return. block: sequence_block(steps, b); scratch: sequence_scratch(steps, b, block) bytes.
        Returns 1 if x or a state holds NaN or infinity, -1 if out of memory."""
        cdef Py_ssize_t hidden = self.hidden, n_in = self.input_size, rows = self.gates * hidden, s, t, i, first = 0
        # LSTM and GRU quantize the inputs of all steps at once (torch's sequence layers do), then
        # project them a block of steps at a time, so the projections are still in cache when the
        # steps read them; RNN quantizes each step's input on its own, as a loop of RNNCells does.
        cdef bint whole = self.kind == QRT_LSTM or self.kind == QRT_GRU
        cdef uint8_t* q = <uint8_t*>align_up(scratch)
        cdef float* gi = <float*>(q + align64(steps * b * n_in if whole else 0))
        cdef float* gh = gi + block * b * rows
        cdef float* h_new = gh + b * rows
        cdef float* c_new = h_new + b * hidden
        cdef prepared_input xin
        cdef int err = 0
        cdef const float* gi_t
        # The states a step reads and writes, swapped after each step rather than copied back: c between the
        # caller's c and c_new; h straight into y's row for the step where that row is b * hidden floats in
        # a row (one batch row, or rows hidden apart), which the next step then reads.
        cdef float* h_in = h
        cdef float* c_in = c
        cdef float* h_out = h_new
        cdef float* c_out = c_new
        cdef bint h_in_y = b == 1 or ldb == hidden
        memset(&xin, 0, sizeof(xin))
        if whole:
            err = self.ih.prepare(x if n_in else NULL, steps * b, &xin, q, steps * b * n_in)
        for s in range(steps):
            if err:
                break
            t = steps - 1 - s if reverse else s
            if not whole:
                err = self.ih.forward(x + t * b * n_in if n_in else NULL, b, gi, False, False)
                gi_t = gi
            else:
                if s % block == 0:  # project the block of steps s .. s + block - 1, in time order
                    first = steps - min(s + block, steps) if reverse else s
                    err = self.ih.project(&xin, first * b, min(block, steps - s) * b, gi, False)
                gi_t = gi + (t - first) * b * rows
            if err == 0:
                err = self.hh.forward(h_in, b, gh, False, False)
            if err:
                break
            if h_in_y:
                h_out = y + t * ldt
            self.update(gi_t, gh, h_in, c_in, h_out, c_out, b)
            if not h_in_y:
                for i in range(b):
                    memcpy(y + t * ldt + i * ldb, h_out + i * hidden, hidden * sizeof(float))
            h_in, h_out = h_out, h_in
            if self.kind == QRT_LSTM:
                c_in, c_out = c_out, c_in
        if h_in != h:
            memcpy(h, h_in, b * hidden * sizeof(float))
        if c_in != c:
            memcpy(c, c_in, b * hidden * sizeof(float))
        release(&xin)
        return err


def gate_activations(const float[::1] x, float[::1] tanh_out, float[::1] sigmoid_out) -> None:
    """The recurrent gates' tanh and sigmoid over an array, for the accuracy tests."""
    if tanh_out.shape[0] != x.shape[0] or sigmoid_out.shape[0] != x.shape[0]:
        raise ValueError("gate_activations: shape mismatch")
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            tanh_out[i] = qrt_tanh(x[i])
            sigmoid_out[i] = qrt_sigmoid(x[i])


include "_embedding.pxi"
include "_plan.pxi"
include "_mask_steps.pxi"
include "_float_ops.pxi"
include "_attention.pxi"
include "_checksum.pxi"
