/* qrt_gelu_onednn (torch_gelu.h) over a row with AVX2: vpermps picks from 8 entries only, so each degree's 24
 * coefficients are three 8-entry tables, each permuted by the row index's low 3 bits, and two blends on its
 * bits 3 and 4 keep the right one: 1.3x faster than GCC's bit selects, as fast as vgatherdps on the Xeon
 * measured (docs/PERFORMANCE.md), and gathers are slow on many CPUs. The same IEEE operations as
 * qrt_gelu_onednn in the same order (the portable build's loop is its oracle: same bits); the row's tail
 * through a copy. Included by float_ops_fma.c, under its target pragma. */
#ifndef QRT_TORCH_GELU_AVX2_H
#define QRT_TORCH_GELU_AVX2_H

#include <immintrin.h>

#include "torch_gelu.h"

/* degree d's coefficient of each lane's row (0 to 23) */
QRT_INLINE __m256 qrt_gelu_coeff_avx2(int d, __m256i row, __m256 bit3, __m256 bit4) {
    const float* c = qrt_gelu_coeffs[d];
    const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c), row);
    const __m256 mid = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c + 8), row);
    const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(c + 16), row);
    return _mm256_blendv_ps(_mm256_blendv_ps(lo, mid, bit3), hi, bit4);
}

/* qrt_gelu_onednn on one vector; the row as in torch_gelu_avx512.h */
QRT_INLINE __m256 qrt_gelu_avx2(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256 ax = _mm256_castsi256_ps(a);
    __m256i row = _mm256_srai_epi32(_mm256_sub_epi32(a, _mm256_set1_epi32(0x3e000001)), 21);
    row = _mm256_min_epi32(_mm256_max_epi32(row, _mm256_setzero_si256()), _mm256_set1_epi32(QRT_GELU_POLYS - 1));
    const __m256i one = _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)),
                                            _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x40b15cee)));
    row = _mm256_blendv_epi8(row, _mm256_set1_epi32(22), one);
    const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(row, 28)); /* blendv reads the sign bit */
    const __m256 bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(row, 27));
    __m256 p = _mm256_fmadd_ps(qrt_gelu_coeff_avx2(5, row, bit3, bit4), ax, qrt_gelu_coeff_avx2(4, row, bit3, bit4));
    for (int d = 3; d >= 0; d--)
        p = _mm256_fmadd_ps(p, ax, qrt_gelu_coeff_avx2(d, row, bit3, bit4));
    p = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(p),
                                             _mm256_and_si256(bits, _mm256_set1_epi32((int)0x80000000u))));
    return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_add_ps(p, _mm256_set1_ps(1.0f))), _mm256_set1_ps(0.5f));
}

static void qrt_gelu_row_avx2(const float* restrict x, float* restrict y, ptrdiff_t n) {
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, qrt_gelu_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float tail[8] = {0};
        memcpy(tail, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(tail, qrt_gelu_avx2(_mm256_loadu_ps(tail)));
        memcpy(y + i, tail, (size_t)(n - i) * sizeof(float));
    }
}

#endif /* QRT_TORCH_GELU_AVX2_H */
