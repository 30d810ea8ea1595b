/* The softmax's exp pass of attention (attention_body.h) over several score rows at once, for the ISA whose
 * file includes this one (torch_exp_avx512.h, torch_exp_avx2.h) after naming its vector type and operations:
 * E_VEC of E_LANES floats (16 or 8), E_LOAD, E_STORE, E_SET1, E_ADD, E_SUB, E_MUL, E_FMA, E_FNMA (c - a b),
 * E_MIN and E_MAX (x86's: the second operand where either is NaN), E_FLOOR, and E_POW2(fx, x, lo): 2^(fx - 1)
 * for an integer-valued fx, +0 where x < lo.
 *
 * qrt_exp_u20 (torch_exp.h) is ATen's exp_u20, written with these intrinsics in its own order; compiled from
 * the scalar C, GCC made its two clamps and the cut below lo into 10 compares and blends a vector (27
 * instructions against 20 here). The rows advance together, one vector each in turn, so that one row's
 * exps and sum chain overlap another's: row by row, 12 heads' softmax at 128 keys took 1.2x as long on Zen 5
 * (bench/attention_ab.py). The same IEEE operations as the scalar qrt_exp_u20 in the same order: the portable
 * build (which runs that one) is the oracle, and the attention tests hold every build to its bits. */
#ifndef QRT_TORCH_EXP_ROWS_H
#define QRT_TORCH_EXP_ROWS_H

#include "attention.h"
#include "torch_exp.h"

#define E_PARTS (16 / E_LANES) /* vectors per 16 lanes of torch's sums */

/* qrt_exp_u20 on one vector */
QRT_INLINE E_VEC qrt_exp_u20_vec(E_VEC x) {
    const E_VEC lo = E_SET1(qrt_bits_float(0xc2aeac50u)), hi = E_SET1(qrt_bits_float(0x42b17218u));
    const E_VEC src = E_MAX(E_MIN(x, hi), lo); /* NaN takes hi, as _mm512_min_ps(x, hi) */
    const E_VEC fx = E_FLOOR(E_FMA(src, E_SET1(qrt_bits_float(0x3fb8aa3bu)), E_SET1(0.5f)));
    const E_VEC r = E_FNMA(fx, E_SET1(qrt_bits_float(0x3f317218u)), src);
    E_VEC p = E_FMA(r, E_SET1(0.00828929059f), E_SET1(0.0418978221f));
    p = E_FMA(r, p, E_SET1(0.166676521f));
    p = E_FMA(r, p, E_SET1(0.499991506f));
    p = E_FMA(r, p, E_SET1(0.999999701f));
    p = E_FMA(r, p, E_SET1(1.0f));
    p = E_MUL(p, E_POW2(fx, x, lo));
    return E_ADD(p, p); /* times 2: exact, as the scalar's p * pow2 * 2.0f */
}

/* Rows r < rows of t (ldt floats apart), each with a max m[r] other than -inf (+inf and NaN included: the exp
 * takes them as the scalar does): t_j = qrt_exp_u20(t_j - m[r]) in place
 * for j < whole (a multiple of 16), and lanes[16 r + l] = the sum of row r's p_j with j = l mod 16, in order
 * from +0 (torch's lane sums, which the caller folds). Inlined with a constant row count. */
QRT_INLINE void qrt_exp_rows(float* restrict t, ptrdiff_t ldt, ptrdiff_t whole, const int rows, const float* m,
                             float* restrict lanes) {
    E_VEC max[QRT_ATTENTION_ROWS], sum[QRT_ATTENTION_ROWS][E_PARTS];
    QRT_UNROLL for (int r = 0; r < QRT_ATTENTION_ROWS; r++) { /* all: GCC cannot tell which rows are read */
        max[r] = E_SET1(r < rows ? m[r] : 0.0f);
        QRT_UNROLL for (int p = 0; p < E_PARTS; p++)
            sum[r][p] = E_SET1(0.0f);
    }
    for (ptrdiff_t j = 0; j < whole; j += 16)
        QRT_UNROLL for (int r = 0; r < rows; r++)
            QRT_UNROLL for (int p = 0; p < E_PARTS; p++) {
                float* restrict x = t + r * ldt + j + p * E_LANES;
                const E_VEC y = qrt_exp_u20_vec(E_SUB(E_LOAD(x), max[r]));
                E_STORE(x, y);
                sum[r][p] = E_ADD(sum[r][p], y);
            }
    QRT_UNROLL for (int r = 0; r < rows; r++)
        QRT_UNROLL for (int p = 0; p < E_PARTS; p++)
            E_STORE(lanes + 16 * r + p * E_LANES, sum[r][p]);
}

#undef E_PARTS
#endif /* QRT_TORCH_EXP_ROWS_H */
