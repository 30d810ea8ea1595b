/* The static linear's requantization (gemm_i8.h's qrt_requantize_row) for 8 columns in AVX2, each lane
 * the same operations in the same order. GCC's vectorisation of the C loop narrows int32 to uint8 one
 * element at a time on AVX2: 3.5 cycles an output, about a fifth of a static M=512 K=N=256 product. */
#define I8_REQUANTIZE_COLS 8
QRT_INLINE void i8_requantize(const int32_t* a, const float* mult, const float* bias_q, const float* bias_t,
                              float bias_inv, int32_t zp, int32_t lo, uint8_t* out) {
    __m256 v = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)a));
    if (bias_q)
        v = _mm256_add_ps(v, _mm256_loadu_ps(bias_q));
    else if (bias_t)
        v = _mm256_fmadd_ps(_mm256_loadu_ps(bias_t), _mm256_set1_ps(bias_inv), v);
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v, _mm256_loadu_ps(mult)), _MM_FROUND_CUR_DIRECTION);
    /* max(c, r) is r < c ? c : r, and min(c, r) is r > c ? c : r: both keep a NaN r, as the C does */
    r = _mm256_min_ps(_mm256_set1_ps(32767.0f), _mm256_max_ps(_mm256_set1_ps(-32768.0f), r));
    __m256i q = _mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(zp));
    q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(lo)), _mm256_set1_epi32(255));
    const __m128i q16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64((__m128i*)out, _mm_packus_epi16(q16, q16)); /* values in [0, 255]: packing is exact */
}
