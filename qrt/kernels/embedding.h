/* Embedding lookups: the rows of a table, or sums, means and maxima of bags of rows (qrt/_embedding.pxi).
 *
 * A table holds float32 rows (bits 32) or quantized rows with a float32 scale and bias per row: bits 8
 * one uint8 per value, bits 4 two per byte, the low nibble first (torch's quint4x2). A quantized value
 * is fmaf(scale, q, bias), rounded once, and a quantized bag sums as fbgemm's EmbeddingSpMDM does:
 * acc = fmaf(scale, q, acc + bias). Callers check every index and offset first; nothing here does.
 *
 * This file is compiled with the extension's baseline flags, where fmaf is a libm call per value (about
 * 2 ns); on x86-64 the same loops are also compiled for AVX2 with FMA, taken when the table says so
 * (t->fma: the CPU runs an avx2 or avx512 kernel variant). fmaf is exact, so both give the same bits.
 */
#pragma once

#include "common.h"

typedef struct {
    const uint8_t* data; /* row r starts at data + r * row_bytes */
    ptrdiff_t row_bytes;
    ptrdiff_t dim;       /* values per row */
    int bits;            /* 32, 8 or 4 */
    const float* scale;  /* bits 8 and 4: one per row */
    const float* bias;
    int fma;             /* the CPU has AVX2 and FMA: run the loops compiled for them */
} qrt_table;

enum { QRT_BAG_SUM = 0, QRT_BAG_MEAN = 1, QRT_BAG_MAX = 2 };

static inline float qrt_table_q(const uint8_t* row, int bits, ptrdiff_t j) {
    return bits == 8 ? (float)row[j] : (float)((row[j >> 1] >> ((j & 1) * 4)) & 15);
}

/* out[i, :] = row idx[i] of the table, dequantized. */
QRT_INLINE void qrt_rows_body(const qrt_table* t, const int64_t* idx, ptrdiff_t n, float* out) {
    const ptrdiff_t dim = t->dim;
    for (ptrdiff_t i = 0; i < n; i++, out += dim) {
        const uint8_t* row = t->data + idx[i] * t->row_bytes;
        if (t->bits == 32) {
            memcpy(out, row, (size_t)dim * sizeof(float)); /* bits as stored, -0.0 and NaN payloads too */
            continue;
        }
        const float s = t->scale[idx[i]], b = t->bias[idx[i]];
        for (ptrdiff_t j = 0; j < dim; j++) out[j] = fmaf(s, qrt_table_q(row, t->bits, j), b);
    }
}

/* out[g, :] = the reduction of rows idx[ends[g]] .. idx[ends[g + 1] - 1], in index order:
 * sum: acc = +0.0, then acc + w (float32 rows) or fmaf(scale, q, acc + bias) (quantized rows);
 * mean: that sum divided by the count; max: the first value, then each value greater than the
 * current (torch's rule: a NaN is kept only when it comes first). An empty bag is +0.0. */
QRT_INLINE void qrt_bags_body(const qrt_table* t, const int64_t* idx, const int64_t* ends, ptrdiff_t bags,
                              int mode, float* out) {
    const ptrdiff_t dim = t->dim;
    for (ptrdiff_t g = 0; g < bags; g++, out += dim) {
        memset(out, 0, (size_t)dim * sizeof(float));
        for (int64_t k = ends[g]; k < ends[g + 1]; k++) {
            const int first = k == ends[g];
            const uint8_t* row = t->data + idx[k] * t->row_bytes;
            if (t->bits == 32) {
                const float* w = (const float*)row;
                if (mode == QRT_BAG_MAX) {
                    for (ptrdiff_t j = 0; j < dim; j++) out[j] = first || w[j] > out[j] ? w[j] : out[j];
                } else {
                    for (ptrdiff_t j = 0; j < dim; j++) out[j] = out[j] + w[j];
                }
                continue;
            }
            const float s = t->scale[idx[k]], b = t->bias[idx[k]];
            if (mode == QRT_BAG_MAX) {
                for (ptrdiff_t j = 0; j < dim; j++) {
                    const float v = fmaf(s, qrt_table_q(row, t->bits, j), b);
                    out[j] = first || v > out[j] ? v : out[j];
                }
            } else {
                for (ptrdiff_t j = 0; j < dim; j++) out[j] = fmaf(s, qrt_table_q(row, t->bits, j), out[j] + b);
            }
        }
        if (mode == QRT_BAG_MEAN && ends[g + 1] > ends[g]) {
            const float count = (float)(ends[g + 1] - ends[g]);
            for (ptrdiff_t j = 0; j < dim; j++) out[j] = out[j] / count;
        }
    }
}

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
#define QRT_EMBEDDING_FMA 1
__attribute__((target("avx2,fma"))) static void qrt_rows_fma(const qrt_table* t, const int64_t* idx, ptrdiff_t n,
                                                             float* out) {
    qrt_rows_body(t, idx, n, out);
}

__attribute__((target("avx2,fma"))) static void qrt_bags_fma(const qrt_table* t, const int64_t* idx,
                                                             const int64_t* ends, ptrdiff_t bags, int mode,
                                                             float* out) {
    qrt_bags_body(t, idx, ends, bags, mode, out);
}
#endif

static void qrt_embedding_rows(const qrt_table* t, const int64_t* idx, ptrdiff_t n, float* out) {
#ifdef QRT_EMBEDDING_FMA
    if (t->fma) {
        qrt_rows_fma(t, idx, n, out);
        return;
    }
#endif
    qrt_rows_body(t, idx, n, out);
}

static void qrt_embedding_bags(const qrt_table* t, const int64_t* idx, const int64_t* ends, ptrdiff_t bags, int mode,
                               float* out) {
#ifdef QRT_EMBEDDING_FMA
    if (t->fma) {
        qrt_bags_fma(t, idx, ends, bags, mode, out);
        return;
    }
#endif
    qrt_bags_body(t, idx, ends, bags, mode, out);
}
