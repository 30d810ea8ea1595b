/* The elementwise part of a recurrent step (RNN, LSTM, GRU), written so the compiler vectorises it.
 *
 * torch evaluates sigmoid and tanh with vectorised approximations of its own; libm's scalar expf
 * and tanhf made these loops cost ten times the int8 products of a step. Here exp is a
 * Cody-Waite reduction and a degree-5 polynomial (Cephes' expf coefficients) in fmaf, with no
 * calls and no branches, so a loop over the hidden units becomes vector code. Measured against
 * the exact functions over 6 million inputs it stays within about 1 ulp; the tests hold every
 * cell to 3e-7 of torch per step.
 *
 * Every product and sum of the gate formulas rounds on its own (the extension is built with
 * -ffp-contract=off), in torch's order (docs/NUMERICS.md).
 */
#ifndef QRT_GATES_H
#define QRT_GATES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* GCC vectorises with 256-bit registers by default even where AVX-512 exists; these loops are
 * pure arithmetic with no loads to split, so full-width vectors do twice the work per instruction. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")
#define QRT_GATES_WIDE 1
#endif

/* exp(x), clamped to [-87, 87] first: beyond that the callers' results no longer change
 * (sigmoid reaches 0 or 1 to within 1e-38; tanh is 1 in float32 from |x| > 9). */
static inline float qrt_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 87.0f ? 87.0f : x;
    const float n = nearbyintf(x * 1.44269504088896341f);   /* x = n ln2 + r, |r| <= ln2 / 2 */
    float r = fmaf(n, -0.693359375f, x);                      /* ln2 in two parts: the high part */
    r = fmaf(n, 2.12194440e-4f, r);                           /* is exact in n * 0.693359375 */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;                             /* e^r = 1 + r + r^2 P(r) */
    const int32_t bits = ((int32_t)n + 127) << 23;            /* 2^n, n in [-126, 126] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float qrt_sigmoid(float v) { return 1.0f / (1.0f + qrt_exp(-v)); }

/* tanh: an odd polynomial below 0.625 (Cephes' tanhf), where 1 - 2/(e^2a + 1) would lose its
 * relative accuracy to cancellation; that formula above. Both are computed, one is kept:
 * a select, not a branch, so the loop still vectorises. */
static inline float qrt_tanh(float v) {
    const float a = fabsf(v);
    const float z = a * a;
    float small = -5.70498872745e-3f;
    small = fmaf(small, z, 2.06390887954e-2f);
    small = fmaf(small, z, -5.37397155531e-2f);
    small = fmaf(small, z, 1.33314422036e-1f);
    small = fmaf(small, z, -3.33332819422e-1f);
    small = fmaf(small * z, a, a);
    const float large = 1.0f - 2.0f / (qrt_exp(2.0f * a) + 1.0f);
    return copysignf(a < 0.625f ? small : large, v);
}

enum qrt_cell { QRT_RNN_TANH, QRT_RNN_RELU, QRT_LSTM, QRT_GRU };

/* Units [0, n) of one row of a step for each cell kind; xi and xh point at the first unit of the
 * row's first gate, and gate g of a unit is `stride` (the hidden size) further on per g. Outputs
 * never alias inputs (restrict), which lets the compiler vectorise without run-time alias checks. */
static void qrt_rnn_row(int relu, const float* restrict xi, const float* restrict xh, float* restrict ho,
                        ptrdiff_t n) {
    if (relu) {
        for (ptrdiff_t j = 0; j < n; j++) {
            const float v = xh[j] + xi[j];
            ho[j] = v > 0.0f ? v : 0.0f;
        }
    } else {
        for (ptrdiff_t j = 0; j < n; j++)
            ho[j] = qrt_tanh(xh[j] + xi[j]);
    }
}

static void qrt_sigmoid_add(const float* restrict xi, float* restrict xh, ptrdiff_t n) {
    for (ptrdiff_t j = 0; j < n; j++)
        xh[j] = qrt_sigmoid(xh[j] + xi[j]);
}

static void qrt_tanh_add(const float* restrict xi, float* restrict xh, ptrdiff_t n) {
    for (ptrdiff_t j = 0; j < n; j++)
        xh[j] = qrt_tanh(xh[j] + xi[j]);
}

/* LSTM and GRU evaluate their gates in separate passes, each a short loop of one activation:
 * one loop over all of a row's formulas keeps too many vectors live and spills (measured 10-15%
 * slower). The activations overwrite xh in place. */
static void qrt_lstm_row(const float* restrict xi, float* restrict xh, const float* restrict c,
                         float* restrict ho, float* restrict co, ptrdiff_t stride, ptrdiff_t n) {
    const float *ig = xh, *fg = xh + stride, *cg = xh + 2 * stride, *og = xh + 3 * stride;
    qrt_sigmoid_add(xi, xh, n);
    qrt_sigmoid_add(xi + stride, xh + stride, n);
    qrt_tanh_add(xi + 2 * stride, xh + 2 * stride, n);
    qrt_sigmoid_add(xi + 3 * stride, xh + 3 * stride, n);
    for (ptrdiff_t j = 0; j < n; j++) {
        const float c_new = fg[j] * c[j] + ig[j] * cg[j];
        co[j] = c_new;
        ho[j] = og[j] * qrt_tanh(c_new);
    }
}

static void qrt_gru_row(const float* restrict xi, float* restrict xh, const float* restrict h,
                        float* restrict ho, ptrdiff_t stride, ptrdiff_t n) {
    const float *r = xh, *z = xh + stride;
    qrt_sigmoid_add(xi, xh, n);
    qrt_sigmoid_add(xi + stride, xh + stride, n);
    for (ptrdiff_t j = 0; j < n; j++) {
        const float g = qrt_tanh(xi[2 * stride + j] + xh[2 * stride + j] * r[j]);
        ho[j] = (h[j] - g) * z[j] + g;
    }
}

/* Units [j0, j1) of every batch row of one step, from gi = lin_ih(x) and gh = lin_hh(h), rows of
 * `gates * hidden`:
 *   RNN:  h' = act(gh + gi)
 *   LSTM: chunks i, f, g, o;  c' = sig(f) * c + sig(i) * tanh(g);  h' = sig(o) * tanh(c')
 *   GRU:  chunks r, z, n;  r = sig(gh_r + gi_r);  z = sig(gh_z + gi_z);
 *         n = tanh(gi_n + gh_n * r);  h' = (h - n) * z + n
 * Units are independent, so threads can take disjoint ranges. gh is scratch: LSTM and GRU
 * overwrite it with their gate activations. h_out and c_out must not overlap gi, gh, h or c
 * (c_out is written by LSTM only). */
static void qrt_gate_update(int kind, const float* gi, float* gh, const float* h, const float* c,
                            float* h_out, float* c_out, ptrdiff_t batch, ptrdiff_t hidden, ptrdiff_t j0,
                            ptrdiff_t j1) {
    const ptrdiff_t gates = kind == QRT_LSTM ? 4 : (kind == QRT_GRU ? 3 : 1), n = j1 - j0;
    for (ptrdiff_t b = 0; b < batch; b++) {
        const float* xi = gi + b * gates * hidden + j0;
        float* xh = gh + b * gates * hidden + j0;
        const ptrdiff_t at = b * hidden + j0;
        if (kind == QRT_LSTM)
            qrt_lstm_row(xi, xh, c + at, h_out + at, c_out + at, hidden, n);
        else if (kind == QRT_GRU)
            qrt_gru_row(xi, xh, h + at, h_out + at, hidden, n);
        else
            qrt_rnn_row(kind == QRT_RNN_RELU, xi, xh, h_out + at, n);
    }
}

#ifdef QRT_GATES_WIDE
#pragma GCC pop_options
#endif

#endif /* QRT_GATES_H */
