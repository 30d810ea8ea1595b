/* qrt's float32 math ops (the registry's "float math" block), as one table of kernels per build
 * of float_ops_body.h: plain C (float_ops_portable.c), and on x86-64 the same C compiled for
 * AVX2 with FMA (float_ops_fma.c), where fmaf is one instruction instead of a libm call (about
 * 13 times faster for the exp-based ops; fmaf is exact, so both give the same bits), and for
 * AVX-512 (float_ops_avx512.c, 512-bit vectors).
 *
 * Every op is a fixed sequence of IEEE operations whatever the CPU, the build, the layout or the
 * number of threads (docs/NUMERICS.md, "Float math ops"). Callers check shapes; the kernels trust
 * them. y never overlaps an input.
 */
#ifndef QRT_FLOAT_OPS_H
#define QRT_FLOAT_OPS_H

#include <math.h>
#include <stddef.h>

enum qrt_unary_op { QRT_SIGMOID, QRT_TANH, QRT_SILU, QRT_GELU, QRT_GELU_TANH, QRT_SQRT, QRT_RSQRT, QRT_LOG, QRT_SIN, QRT_COS,
                    QRT_CEIL, QRT_FLOOR };
enum qrt_binary_op { QRT_ADD, QRT_SUB, QRT_MUL, QRT_DIV };
#define QRT_BINARY_MAX_RANK 8

typedef struct {
    const char* name; /* "portable", "fma" or "avx512" */
    /* y[i] = f(x[i]), i < n */
    void (*unary)(int op, const float* x, float* y, ptrdiff_t n);
    /* y = a op b with numpy broadcasting: a_shape and b_shape have rank dims each (the shorter one
     * padded with 1s in front), each dimension equal or 1 in one of them; y has the broadcast shape;
     * all three contiguous */
    void (*binary)(int op, const float* a, const ptrdiff_t* a_shape, const float* b, const ptrdiff_t* b_shape,
                   float* y, int rank);
    /* x, y viewed as [outer, n, inner]: softmax (log_softmax when log) along n */
    void (*softmax)(int log, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n, ptrdiff_t inner);
    /* y[o][c] = the sum over j of x[o][j][c] (divided by n when mean), x viewed as [outer, n, inner] */
    void (*sum)(int mean, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n, ptrdiff_t inner);
    /* rows of n values each: (x - mean) / sqrt(var + eps) * w + b; w and b may be NULL; with x2 (NULL for
     * none, same shape as x) of fl(x + x2) instead of x */
    void (*layer_norm)(const float* x, const float* x2, const float* w, const float* b, float eps, float* y,
                       ptrdiff_t rows, ptrdiff_t n);
    /* batch_norm's elements: x, y viewed as [outer, channels, inner], y = fma(x, alpha[c], beta[c]) (the terms of
     * qrt_batch_norm_alpha and _beta, below) */
    void (*batch_norm)(const float* x, const float* alpha, const float* beta, float* y, ptrdiff_t outer,
                       ptrdiff_t channels, ptrdiff_t inner);
} qrt_float_ops;

/* batch_norm's per-channel terms, as torch's CPU kernel collects them (batch_norm_kernel.cpp, as its AVX2 and
 * AVX-512 builds compile it, contraction on): the linear term alpha = fl(1 / sqrt(var + eps)) * w, the constant
 * term beta = fma(-mean, alpha, b) (its b - mean * alpha, contracted). Each element is then fma(x, alpha, beta).
 * Computed once a model is loaded, on either backend. */
static inline float qrt_batch_norm_alpha(float var, float w, float eps) { return 1.0f / sqrtf(var + eps) * w; }

static inline float qrt_batch_norm_beta(float mean, float alpha, float b) { return fmaf(-mean, alpha, b); }

/* The table for the CPUs of a kernel variant (qrt_kernels.h; one this CPU runs): AVX-512 for
 * "avx512-vnni" and "amx-int8", AVX2 with FMA for the other x86-64 SIMD variants, plain C for "portable" and on
 * aarch64. */
const qrt_float_ops* qrt_float_ops_for(const char* kernel_variant);

#endif /* QRT_FLOAT_OPS_H */
