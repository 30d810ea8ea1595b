/* float_math.h's gelu (erfc) without branches, for the CPU's vector loops (float_ops_body.h).
 *
 * msun's erfc picks one of four rational approximations by |x| and finishes each interval its own way;
 * as branches, GCC keeps the loop scalar (3.1 ms for 128 x 1536 values). Here every element evaluates one
 * rational whose variable and coefficients are selected by its interval, one exp whose argument is selected,
 * and every interval's finishing formula, and keeps the one its interval calls for: the same IEEE
 * operations, on the same values, as qrt_erfc's path for that element, so the same bits (tests hold every
 * build to the scalar functions, which stay the oracle and the GPU's code).
 *
 * The two rationals of lower degree take a zero top coefficient: c2 + v * 0 is c2 exactly wherever v is
 * finite, which it is on their intervals (v = x^2 < 0.72 and v = 1 / x^2 < 0.13).
 */
#ifndef QRT_FLOAT_MATH_LANES_H
#define QRT_FLOAT_MATH_LANES_H

#include "common.h"
#include "float_math.h"

/* c ? a : b on the bits: GCC merges nested ?: into a PHI of more than 4 values, which it does not if-convert,
 * and the loop stays scalar */
QRT_INLINE float qrt_pick(int c, float a, float b) {
    const unsigned m = 0u - (unsigned)(c != 0);
    return qrt_bits_float((qrt_float_bits(a) & m) | (qrt_float_bits(b) & ~m));
}

/* of four values by the interval: small, near, tail_a, beyond */
QRT_INLINE float qrt_pick4(int small, int near, int tail_a, float s, float n, float a, float b) {
    return qrt_pick(small, s, qrt_pick(near, n, qrt_pick(tail_a, a, b)));
}

QRT_INLINE float qrt_erfc_lanes(float x, float lo) {
    const float erx = 8.42697144e-01f, two_over_sqrt_pi = 1.12837916709551257f;
    const int32_t hx = qrt_float_word(x), ix = hx & 0x7fffffff;
    const int small = ix < 0x3f580000, near = ix < 0x3fa00000, tail_a = ix < 0x4036db8c; /* 0.84375, 1.25, 2.857 */
    const float a = fabsf(x), xx = x * x; /* |x| * |x| and x * x are the same float */
    /* the rational: pp/qq of x^2 below 0.84375, pa/qa of |x| - 1 below 1.25, ra/sa, rb/sb of 1 / x^2 beyond */
    const float v = qrt_pick(small, xx, qrt_pick(near, a - 1.0f, 1.0f / (a * a)));
    const float n0 =
        qrt_pick4(small, near, tail_a, 1.28379166e-01f, 3.65041046e-06f, -9.88156721e-03f, -9.86496918e-03f);
    const float n1 =
        qrt_pick4(small, near, tail_a, -3.36030394e-01f, 4.15109307e-01f, -5.43658376e-01f, -5.48049808e-01f);
    const float n2 =
        qrt_pick4(small, near, tail_a, -1.86261395e-03f, -2.09395722e-01f, -1.66828310e+00f, -1.84115684e+00f);
    const float n3 =
        qrt_pick4(small, near, tail_a, 0.0f, 8.67677554e-02f, -6.91554189e-01f, 0.0f);
    const float d1 =
        qrt_pick4(small, near, tail_a, 3.12324315e-01f, 4.95560974e-01f, 4.48581553e+00f, 4.87132740e+00f);
    const float d2 =
        qrt_pick4(small, near, tail_a, 2.16070414e-02f, 3.71248513e-01f, 4.10799170e+00f, 3.04982710e+00f);
    const float d3 =
        qrt_pick4(small, near, tail_a, -1.98859372e-03f, 3.92478965e-02f, 5.53855181e-01f, -7.61900663e-01f);
    const float q = (n0 + v * (n1 + v * (n2 + v * n3))) / (1.0f + v * (d1 + v * (d2 + v * d3)));
    /* the tail's exponent, split as qrt_erfc splits it */
    const float z = qrt_word_float(hx & 0xffffe000);
    const float A = -z * z - 0.5625f, B = ((z - x) * (z + x) - 2.0f * x * lo) + q, sum = A + B;
    const float e = qrt_exp_full(qrt_pick(near, -(x * x), sum));
    /* below 1.25 */
    const float d = lo * (two_over_sqrt_pi * e);
    const float xq = x * q + d;
    const float below_quarter = 1.0f - (x + xq), from_quarter = 0.5f - (xq + (x - 0.5f));
    const float tiny = 1.0f - (x + d);
    const float up = qrt_pick(hx >= 0, (1.0f - erx) - (q + d), 1.0f + (erx + (q - d)));
    const float below_near = qrt_pick(ix < 0x33800000, tiny, qrt_pick(hx < 0x3e800000, below_quarter, from_quarter));
    /* 1.25 to 11 */
    const float r = fmaf(e, (A - sum) + B, e), ra = r / a;
    const float far = qrt_pick(hx > 0, ra - ra * (lo / a), qrt_pick(hx < 0 && ix >= 0x40a00000, 2.0f, 2.0f - ra));
    /* from 11, infinities, NaN */
    const float beyond = qrt_pick(ix > 0x7f800000, x + x, qrt_pick(hx > 0, 0.0f, 2.0f));
    return qrt_pick4(small, near, ix < 0x41300000, below_near, up, far, beyond);
}

/* qrt_gelu with qrt_erfc_lanes */
QRT_INLINE float qrt_gelu_lanes(float x) {
    const double t = (double)x * -0.70710678118654752440;
    const float hi = (float)t;
    return x * (0.5f * qrt_erfc_lanes(hi, (float)(t - (double)hi)));
}

#endif /* QRT_FLOAT_MATH_LANES_H */
