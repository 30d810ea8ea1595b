/* qrt_gelu_onednn (torch_gelu.h) over a row with AVX-512, as oneDNN's own kernel does it: the 24 polynomials'
 * coefficients of each degree sit in two registers, and one vpermt2ps per degree picks every lane's from the
 * row index in the lane's low 5 bits. The same IEEE operations as qrt_gelu_onednn in the same order (the
 * portable build's loop is its oracle: same bits, NaN payloads included); the row's tail under a lane mask.
 * Included by float_ops_avx512.c, under its target pragma. */
#ifndef QRT_TORCH_GELU_AVX512_H
#define QRT_TORCH_GELU_AVX512_H

#include <immintrin.h>

#include "torch_gelu.h"

/* qrt_gelu_onednn on one vector: t[d] and t[d + 6] hold degree d's coefficients of rows 0-15 and 16-23 */
QRT_INLINE __m512 qrt_gelu_avx512(__m512 x, const __m512 t[12]) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    const __m512 ax = _mm512_castsi512_ps(a);
    /* qrt_gelu_poly's row: the polynomial's index less one is (a - 0x3e000001) >> 21 (arithmetic: below the
     * first switch it is negative), clamped to [0, 23]; row 22 (the constant 1) from 0x1.62b9dcp2 to inf */
    __m512i row = _mm512_srai_epi32(_mm512_sub_epi32(a, _mm512_set1_epi32(0x3e000001)), 21);
    row = _mm512_min_epi32(_mm512_max_epi32(row, _mm512_setzero_si512()), _mm512_set1_epi32(QRT_GELU_POLYS - 1));
    const __mmask16 one = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x40b15cee)) &
                          _mm512_cmple_epi32_mask(a, _mm512_set1_epi32(0x7f800000));
    row = _mm512_mask_mov_epi32(row, one, _mm512_set1_epi32(22));
    __m512 p = _mm512_fmadd_ps(_mm512_permutex2var_ps(t[5], row, t[11]), ax,
                               _mm512_permutex2var_ps(t[4], row, t[10]));
    for (int d = 3; d >= 0; d--)
        p = _mm512_fmadd_ps(p, ax, _mm512_permutex2var_ps(t[d], row, t[d + 6]));
    p = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(p),
                                             _mm512_and_si512(bits, _mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_add_ps(p, _mm512_set1_ps(1.0f))), _mm512_set1_ps(0.5f));
}

static void qrt_gelu_row_avx512(const float* restrict x, float* restrict y, ptrdiff_t n) {
    __m512 t[12];
    for (int d = 0; d < 6; d++) {
        t[d] = _mm512_loadu_ps(qrt_gelu_coeffs[d]);
        t[d + 6] = _mm512_maskz_loadu_ps(0x00ff, qrt_gelu_coeffs[d] + 16); /* rows 16-23 */
    }
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, qrt_gelu_avx512(_mm512_loadu_ps(x + i), t));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, tail, qrt_gelu_avx512(_mm512_maskz_loadu_ps(tail, x + i), t));
    }
}

#endif /* QRT_TORCH_GELU_AVX512_H */
