/* The elementwise part of a recurrent step (RNN, LSTM, GRU), written so the compiler vectorises it.
 *
 * Every product and sum of the gate formulas rounds on its own (-ffp-contract=off), in torch's
 * order (docs/NUMERICS.md). Included by each variant (variant.h), which compiles these loops for
 * its vector width.
 */
#ifndef QRT_GATES_H
#define QRT_GATES_H

#include <stddef.h>

#include "gate_math.h"

/* Units [0, n) of one row of a step for each cell kind; xi and xh point at the first unit of the
 * row's first gate, and gate g of a unit is `stride` (the hidden size) further on per g. Outputs
 * never alias inputs (restrict), which lets the compiler vectorise without run-time alias checks. */
static void qrt_rnn_row(int relu, const float* restrict xi, const float* restrict xh, float* restrict ho,
                        ptrdiff_t n) {
    if (relu) {
        for (ptrdiff_t j = 0; j < n; j++) {
            const float v = xh[j] + xi[j];
            ho[j] = qrt_relu(v);
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

#endif /* QRT_GATES_H */
