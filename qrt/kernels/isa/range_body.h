/* The range of the activations a dynamic linear quantizes (quantize.h's qrt_min_max) as float compares, for the
 * ISA whose file includes this one (range_avx512.h, range_avx2.h) after naming its vector type and operations
 * (R_VEC of R_LANES floats: R_LOAD, R_STORE, R_SET1, R_MIN, R_MAX, R_FMA, R_ADD): 3 instructions a register where
 * the order keys take 5 (Sapphire Rapids, 128 x 1536 floats, bench/range_pass.c: avx512-vnni 15.3 -> 8.8 us, avx2
 * 12.8 -> 10.2; all-MiniLM-L6-v2 takes the range of 2 million floats a call at 128 tokens).
 *
 * min and max with x as the first operand (vminps, vmaxps) return the running value where x is NaN; an fma of x
 * times 0 into a sum is NaN from any NaN or infinity (0 times infinity) and 0 from every finite x. So the result
 * is qrt_min_max's: 1 wherever x holds NaN or an infinity, else its min and max, but for the sign of a zero
 * bound, which qrt_choose_qparams's extension of the range to 0 erases. The lanes fold, and the last n % R_LANES
 * floats join, one at a time in the same operations. */
#define I8_RANGE i8_range
QRT_INLINE int i8_range(const float* x, ptrdiff_t n, float* lo, float* hi) {
    const R_VEC zero = R_SET1(0.0f);
    R_VEC mn[4], mx[4], bad[4]; /* 4 of each: their chains' latency under the loads' pace */
    for (int u = 0; u < 4; u++) {
        mn[u] = R_SET1(INFINITY);
        mx[u] = R_SET1(-INFINITY);
        bad[u] = zero;
    }
    ptrdiff_t i = 0;
    for (; i + 4 * R_LANES <= n; i += 4 * R_LANES)
        QRT_UNROLL for (int u = 0; u < 4; u++) {
            const R_VEC v = R_LOAD(x + i + R_LANES * u);
            mn[u] = R_MIN(v, mn[u]);
            mx[u] = R_MAX(v, mx[u]);
            bad[u] = R_FMA(v, zero, bad[u]);
        }
    for (; i + R_LANES <= n; i += R_LANES) {
        const R_VEC v = R_LOAD(x + i);
        mn[0] = R_MIN(v, mn[0]);
        mx[0] = R_MAX(v, mx[0]);
        bad[0] = R_FMA(v, zero, bad[0]);
    }
    _Alignas(64) float l[R_LANES], h[R_LANES], s[R_LANES];
    R_STORE(l, R_MIN(R_MIN(mn[0], mn[1]), R_MIN(mn[2], mn[3])));
    R_STORE(h, R_MAX(R_MAX(mx[0], mx[1]), R_MAX(mx[2], mx[3])));
    R_STORE(s, R_ADD(R_ADD(bad[0], bad[1]), R_ADD(bad[2], bad[3])));
    float a = l[0], b = h[0], z = s[0];
    for (int u = 1; u < R_LANES; u++) {
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
