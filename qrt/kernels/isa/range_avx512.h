/* The range of the activations a dynamic linear quantizes (quantize.h's qrt_min_max), AVX-512: float compares
 * where the portable loop takes order keys, 3 instructions a vector against 5 (Sapphire Rapids, 128 x 1536
 * floats: 13.7 -> 7.7 us; an all-MiniLM-L6-v2 call at 128 tokens takes 2 million).
 *
 * vminps and vmaxps with x as the first operand return the running value where x is NaN; an fma of x times 0
 * into a sum is NaN from any NaN or infinity (0 times infinity), and 0 from every finite x. So the result is
 * qrt_min_max's: 1 wherever x holds NaN or an infinity, else its min and max, but for the sign of a zero bound,
 * which qrt_choose_qparams's extension of the range to 0 erases. */
#define I8_RANGE i8_range
QRT_INLINE int i8_range(const float* x, ptrdiff_t n, float* lo, float* hi) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 mn[4], mx[4], bad[4]; /* 4 of each: their chains' latency under the loads' pace */
    for (int u = 0; u < 4; u++) {
        mn[u] = _mm512_set1_ps(INFINITY);
        mx[u] = _mm512_set1_ps(-INFINITY);
        bad[u] = zero;
    }
    ptrdiff_t i = 0;
    for (; i + 64 <= n; i += 64)
        QRT_UNROLL for (int u = 0; u < 4; u++) {
            const __m512 v = _mm512_loadu_ps(x + i + 16 * u);
            mn[u] = _mm512_min_ps(v, mn[u]);
            mx[u] = _mm512_max_ps(v, mx[u]);
            bad[u] = _mm512_fmadd_ps(v, zero, bad[u]);
        }
    for (; i < n; i += 16) { /* the lanes past n keep their values */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        mn[0] = _mm512_mask_min_ps(mn[0], m, v, mn[0]);
        mx[0] = _mm512_mask_max_ps(mx[0], m, v, mx[0]);
        bad[0] = _mm512_mask3_fmadd_ps(v, zero, bad[0], m);
    }
    const __m512 b = _mm512_add_ps(_mm512_add_ps(bad[0], bad[1]), _mm512_add_ps(bad[2], bad[3]));
    if (_mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q))
        return 1;
    *lo = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(mn[0], mn[1]), _mm512_min_ps(mn[2], mn[3])));
    *hi = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
    return 0;
}
