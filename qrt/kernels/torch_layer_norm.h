/* layer_norm as torch 2.13 computes it on the CPU for float32 (aten/src/ATen/native/cpu/layer_norm_kernel.cpp,
 * moments_utils.h), as fixed IEEE operations in portable C, so every qrt build and the GPU give torch's bits.
 * torch registers this kernel for its AVX2 capability only (its AVX-512 slot is empty: the AVX2 kernel runs),
 * so its lanes are AVX2's 8, and the operations below are those its compiled kernel performs (read off the
 * instructions of libtorch_cpu 2.13.0; GCC contracted some products into fmas, and regrouped one sum):
 *
 *  moments of a row of n (RowwiseMoments, Welford): the row's first 8 floor(n / 8) values are 8 lanes, value j
 *  in lane j % 8; each lane runs Welford over chunks of 16 values (m1 = fma(d, 1/(k+1), m1) with
 *  d = x - m1, then m2 = fma(d, x - m1, m2)); the chunks merge in a binary cascade (merge_lanes below); the last
 *  n mod 8 values run scalar Welford (m1 += d / k, m2 += d (x - m1), unfused); the 8 lanes then merge into that
 *  in lane order (merge_one). mean = m1, var = fl(m2 / n), rstd = fl(1 / fl(sqrt(fl(var + eps)))).
 *  output: t = fl(x - mean); with weight w, y = fma(fl(t rstd), w, b) (b = +0 without bias); without, y =
 *  fma(t, rstd, b).
 */
#ifndef QRT_TORCH_LAYER_NORM_H
#define QRT_TORCH_LAYER_NORM_H

#include "gate_math.h"

#define QRT_LN_LANES 8
#define QRT_LN_CHUNK 16
#define QRT_LN_DEPTH 40 /* the cascade's levels: ceil(log2(chunks)), chunks < 2^37 */
#ifndef QRT_LN_ROWS /* rows whose lanes run side by side (independent chains: the CPU's vectors stay busy) */
#define QRT_LN_ROWS 1
#endif
#define QRT_LN_ALL (QRT_LN_LANES * QRT_LN_ROWS)

/* AddMomentsVec as compiled: lanes l0..l1-1 of `rows` rows of (n, m1, m2) take in (add, a1, a2):
 * c = add / (n + add), d = a1 - m1, m1 = m1 + fl(c d), m2 = fma(fl(n d), fl(c d), fl(a2 + m2)). */
QRT_GATE_FN void qrt_ln_merge_lanes(long long add, const float* a1, const float* a2, long long* n, float* m1,
                                    float* m2, int rows, int l0, int l1) {
    const long long total = *n + add;
    const float c = total == 0 ? 0.0f : (float)add / (float)total, count = (float)*n;
    for (int r = 0; r < rows; r++)
        for (int l = r * QRT_LN_LANES + l0; l < r * QRT_LN_LANES + l1; l++) {
            const float d = a1[l] - m1[l], cd = c * d;
            m1[l] = m1[l] + cd;
            m2[l] = fmaf(count * d, cd, a2[l] + m2[l]);
        }
    *n = total;
}

/* AddMoments (one lane into the scalar moments) as compiled: m1 = fma(c, d, m1),
 * m2 = m2 + fma(fl(fl(d d) c), n, a2). */
QRT_GATE_FN void qrt_ln_merge_one(long long add, float a1, float a2, long long* n, float* m1, float* m2) {
    const long long total = *n + add;
    const float c = total == 0 ? 0.0f : (float)add / (float)total;
    const float d = a1 - *m1;
    *m1 = fmaf(c, d, *m1);
    *m2 = *m2 + fmaf(d * d * c, (float)*n, a2);
    *n = total;
}

/* Lanes l0..l1-1 of the vector parts (nvec vectors of 8) of `rows` rows x, x + stride, ... (row r's lane l at
 * r * 8 + l of m1, m2): Welford per chunk of 16 vectors, the chunks' moments in the cascade (stack level k holds
 * 2^k chunks), as torch's RowwiseMomentsImpl. */
QRT_GATE_FN void qrt_ln_lane_moments(const float* x, long long stride, long long nvec, int rows, int l0, int l1,
                                     float* m1, float* m2) {
    long long counts[QRT_LN_DEPTH];
    float s1[QRT_LN_DEPTH][QRT_LN_ALL], s2[QRT_LN_DEPTH][QRT_LN_ALL];
    const long long chunks = (nvec + QRT_LN_CHUNK - 1) / QRT_LN_CHUNK;
    int depth = 1; /* utils::CeilLog2, at least 1 */
    while (depth < QRT_LN_DEPTH && (1ll << depth) < chunks)
        depth++;
    for (int k = 0; k < depth; k++) {
        counts[k] = 0;
        for (int l = 0; l < QRT_LN_ALL; l++)
            s1[k][l] = s2[k][l] = 0.0f;
    }
    for (long long i = 0; i < chunks; i++) {
        const long long m = nvec - i * QRT_LN_CHUNK < QRT_LN_CHUNK ? nvec - i * QRT_LN_CHUNK : QRT_LN_CHUNK;
        float c1[QRT_LN_ALL], c2[QRT_LN_ALL];
        for (int l = 0; l < QRT_LN_ALL; l++)
            c1[l] = c2[l] = 0.0f;
        for (long long j = 0; j < m; j++) {
            const float inv = 1.0f / (float)(j + 1);
            for (int r = 0; r < rows; r++) {
                const float* v = x + r * stride + (i * QRT_LN_CHUNK + j) * QRT_LN_LANES;
                float* a1 = c1 + r * QRT_LN_LANES;
                float* a2 = c2 + r * QRT_LN_LANES;
                for (int l = l0; l < l1; l++) {
                    const float d = v[l] - a1[l];
                    a1[l] = fmaf(d, inv, a1[l]);
                    a2[l] = fmaf(d, v[l] - a1[l], a2[l]);
                }
            }
        }
        qrt_ln_merge_lanes(m, c1, c2, &counts[0], s1[0], s2[0], rows, l0, l1);
        for (int k = 1; k < depth && ((i + 1) >> (k - 1) & 1) == 0; k++) { /* a carry: level k - 1 moves up */
            qrt_ln_merge_lanes(counts[k - 1], s1[k - 1], s2[k - 1], &counts[k], s1[k], s2[k], rows, l0, l1);
            counts[k - 1] = 0;
            for (int l = 0; l < QRT_LN_ALL; l++)
                s1[k - 1][l] = s2[k - 1][l] = 0.0f;
        }
    }
    for (int k = 1; k < depth; k++)
        qrt_ln_merge_lanes(counts[k], s1[k], s2[k], &counts[0], s1[0], s2[0], rows, l0, l1);
    for (int l = 0; l < QRT_LN_ALL; l++) {
        m1[l] = s1[0][l];
        m2[l] = s2[0][l];
    }
}

/* The row's mean and rstd from its lanes' moments (each over nvec values): the tail's scalar Welford, the
 * lanes merged into it in order, var = m2 / n. */
QRT_GATE_FN void qrt_ln_finish(const float* x, long long n, const float* m1, const float* m2, float eps, float* mean,
                               float* rstd) {
    const long long nvec = n / QRT_LN_LANES;
    long long k = 0;
    float t1 = 0.0f, t2 = 0.0f;
    for (long long j = nvec * QRT_LN_LANES; j < n; j++) {
        const float d = x[j] - t1;
        k++;
        t1 = t1 + d / (float)k;
        t2 = t2 + (x[j] - t1) * d;
    }
    for (int l = 0; l < QRT_LN_LANES; l++)
        qrt_ln_merge_one(nvec, m1[l], m2[l], &k, &t1, &t2);
    *mean = t1;
    *rstd = 1.0f / sqrtf(t2 / (float)n + eps);
}

/* One output: t = fl(x - mean); y = fma(fl(t rstd), w, b) with a weight, fma(t, rstd, b) without (b = +0
 * without a bias). */
QRT_GATE_FN float qrt_ln_out(float x, float mean, float rstd, const float* w, const float* b, long long j) {
    const float t = x - mean, bias = b ? b[j] : 0.0f;
    return w ? fmaf(t * rstd, w[j], bias) : fmaf(t, rstd, bias);
}

#endif /* QRT_TORCH_LAYER_NORM_H */
