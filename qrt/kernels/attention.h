/* qrt's float32 matrix product and fused scaled-dot-product attention, as one table of kernels per
 * build of attention_body.h, which the float ops' files compile beside float_ops_body.h (plain C,
 * AVX2 with FMA, AVX-512: float_ops.h says which variant runs which).
 *
 * One order, whatever the CPU, the build or the number of threads (docs/NUMERICS.md, "Matrix product
 * and attention"): every product of a row and a column is one fma chain over k in order, from +0,
 * linear_float's chain (attention's context beyond 384 keys a block: two, as torch's sgemm); attention
 * follows torch 2.13's CPU flash attention step by step. Vectors run across the outputs, never across a
 * sum. Callers check shapes; the kernels trust them. Outputs never overlap inputs.
 */
#ifndef QRT_ATTENTION_H
#define QRT_ATTENTION_H

#include <stddef.h>

#include "common.h"

enum qrt_attention_mask { QRT_MASK_NONE, QRT_MASK_BOOL, QRT_MASK_FLOAT };

typedef struct {
    const char* name; /* the float ops' build: "portable", "fma" or "avx512" */
    /* y[i][j] = the fma chain over t < k of a[i][t] * b[t][j], i < m, j < n; a, b, y row-major and
     * contiguous ([m, k], [k, n], [m, n]); scratch holds qrt_matmul_scratch(k) floats where n is not a
     * multiple of QRT_MM_TAIL (else it may be NULL) */
    void (*matmul)(const float* a, const float* b, float* y, ptrdiff_t m, ptrdiff_t k, ptrdiff_t n, float* scratch);
    /* One attention head: y[l][ev] = softmax(scale * q k^T + mask) v for the l query rows of q ([l, e]),
     * the s keys of k ([s, e]) and values of v ([s, ev]); q's first row is query row `row0` of the
     * head (for is_causal: key j is masked out for query row i when j > i). Each matrix's rows lie ld*
     * floats apart (its width when contiguous; a head's slice of [.., heads * e] rows read in place
     * otherwise). mask (NULL for none) holds row i's s values at mask + i * mask_stride (uint8 0/1 for
     * QRT_MASK_BOOL, 0 masking out; float32 added for QRT_MASK_FLOAT); mask_stride 0 repeats one row.
     * scratch holds qrt_attention_scratch(s, e, ev) floats. */
    void (*attention)(const float* q, ptrdiff_t ldq, const float* k, ptrdiff_t ldk, const float* v, ptrdiff_t ldv,
                      const void* mask, int mask_kind, ptrdiff_t mask_stride, float scale, int causal,
                      ptrdiff_t row0, ptrdiff_t l, ptrdiff_t s, ptrdiff_t e, ptrdiff_t ev, float* y, ptrdiff_t ldy,
                      float* scratch);
} qrt_attention_ops;

/* Query rows an attention call takes at a time at most: its score rows held at once. */
#define QRT_ATTENTION_ROWS 8

/* Floats in a cache line */
#define QRT_LINE_FLOATS 16

/* The row length of k transposed and of the score rows: s keys rounded up to a cache line of floats, so that
 * every row starts on a line (from a scratch that does), the score product runs whole vectors over zero
 * keys past s, and the softmax's max reads each row's last vector whole (its padding set to -inf). Rows of
 * 100 or 108 floats split a vector load in most rows across two lines: 108 keys took 1.9x the time of 112. */
static inline ptrdiff_t qrt_attention_keys_padded(ptrdiff_t s) {
    return qrt_round_up(s, QRT_LINE_FLOATS);
}

/* Floats of scratch one attention call needs: k transposed, a tile of score rows, and one of partial contexts,
 * rounded up to a cache line of floats so that the scratches of tasks laid end to end each start on a line. */
static inline ptrdiff_t qrt_attention_scratch(ptrdiff_t s, ptrdiff_t e, ptrdiff_t ev) {
    const ptrdiff_t sp = qrt_attention_keys_padded(s);
    return qrt_round_up(e * sp + QRT_ATTENTION_ROWS * (sp + ev), QRT_LINE_FLOATS);
}

/* matmul's last n % QRT_MM_TAIL columns run as QRT_MM_TAIL columns over a zero-padded copy of b's (k rows) into
 * a tile of QRT_ATTENTION_ROWS rows, copied out: a whole vector a row on AVX-512, a whole tile on AVX2. */
#define QRT_MM_TAIL 16

static inline ptrdiff_t qrt_matmul_scratch(ptrdiff_t k) {
    return (k + QRT_ATTENTION_ROWS) * QRT_MM_TAIL;
}

/* The table for the CPUs of a kernel variant: the float ops' choice (float_ops.h). */
const qrt_attention_ops* qrt_attention_ops_for(const char* kernel_variant);

#endif /* QRT_ATTENTION_H */
