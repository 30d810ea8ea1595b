/* range_avx512.h's range of the activations in 8-float registers (AVX2, AVX-VNNI); the last n % 8 floats one at a
 * time in the same order of operations. */
#define I8_RANGE i8_range
QRT_INLINE int i8_range(const float* x, ptrdiff_t n, float* lo, float* hi) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 mn[4], mx[4], bad[4];
    for (int u = 0; u < 4; u++) {
        mn[u] = _mm256_set1_ps(INFINITY);
        mx[u] = _mm256_set1_ps(-INFINITY);
        bad[u] = zero;
    }
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32)
        QRT_UNROLL for (int u = 0; u < 4; u++) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * u);
            mn[u] = _mm256_min_ps(v, mn[u]);
            mx[u] = _mm256_max_ps(v, mx[u]);
            bad[u] = _mm256_fmadd_ps(v, zero, bad[u]);
        }
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        mn[0] = _mm256_min_ps(v, mn[0]);
        mx[0] = _mm256_max_ps(v, mx[0]);
        bad[0] = _mm256_fmadd_ps(v, zero, bad[0]);
    }
    _Alignas(32) float l[8], h[8], s[8];
    _mm256_store_ps(l, _mm256_min_ps(_mm256_min_ps(mn[0], mn[1]), _mm256_min_ps(mn[2], mn[3])));
    _mm256_store_ps(h, _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3])));
    _mm256_store_ps(s, _mm256_add_ps(_mm256_add_ps(bad[0], bad[1]), _mm256_add_ps(bad[2], bad[3])));
    float a = l[0], b = h[0], z = s[0];
    for (int u = 1; u < 8; u++) {
        a = l[u] < a ? l[u] : a;
        b = h[u] > b ? h[u] : b;
        z += s[u];
    }
    for (; i < n; i++) {
        a = x[i] < a ? x[i] : a;
        b = x[i] > b ? x[i] : b;
        z += x[i] * 0.0f;
    }
    if (z != z)
        return 1;
    *lo = a;
    *hi = b;
    return 0;
}
