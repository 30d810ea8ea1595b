/* The scalar functions of qrt's float32 ops (float_ops.h): log, and the activations built on gate_math.h's
 * exp (gelu's erf form is torch's, torch_gelu.h). Every one is a fixed sequence of IEEE float (and, where said,
 * double) operations, with no libm transcendental, so every CPU and build gives the same bits:
 * libm's expf, logf and erff differ between libcs and their versions.
 *
 * qrt_logf is FreeBSD msun's e_logf.c, ported, under this notice:
 *
 * ====================================================
 * Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 *
 * Developed at SunPro, a Sun Microsystems, Inc. business.
 * Permission to use, copy, modify, and distribute this
 * software is freely granted, provided that this notice
 * is preserved.
 * ====================================================
 * Conversion to float by Ian Lance Taylor, Cygnus Support, ian@cygnus.com.
 *
 * Changes from msun: no floating-point exception flags or errno.
 */
#ifndef QRT_FLOAT_MATH_H
#define QRT_FLOAT_MATH_H

/* first: its QRT_GATE_FN makes these functions device code too (qrt/cuda/float_ops.cu) */
#include "gate_math.h"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#include <stdint.h>
#include <string.h>
#else /* NVRTC has no system headers: what the code below takes from them, with the CPU's bits */
typedef int int32_t;
typedef unsigned int uint32_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
#endif

/* gate_math.h's bit casts, signed as msun's code below reads them */
QRT_GATE_FN int32_t qrt_float_word(float x) { return (int32_t)qrt_float_bits(x); }

QRT_GATE_FN float qrt_word_float(int32_t w) { return qrt_bits_float((unsigned)w); }

/* exp over the whole float range: gate_math.h's qrt_exp (the same bits on [-87, 87], where tanh's exp
 * clamps), and beyond it the value down to the subnormals, then 0 below -103.9, and inf above 88.7. */
QRT_GATE_FN float qrt_exp_full(float x) {
    x = qrt_clamp_bits(x, 0x42d00000u, 0x42b20000u); /* to [-104, 89], as qrt_exp clamps */
    int n;
    const float p = qrt_exp_parts(x, &n);
    /* 2^n, n in [-150, 128], as two factors that are normal floats: p * 2^h is exact, so the result
     * rounds once, only where it is subnormal or overflows (elsewhere, the bits of p * 2^n) */
    const int h = n / 2;
    return p * qrt_pow2(h) * qrt_pow2(n - h);
}

/* log(x): msun's e_logf.c, max error below 1 ulp. */
QRT_GATE_FN float qrt_logf(float x) {
    static const float ln2_hi = 6.9313812256e-01f, /* 0x3f317180 */
        ln2_lo = 9.0580006145e-06f,                /* 0x3717f7d1 */
        two25 = 3.355443200e+07f,                  /* 0x4c000000 */
        /* |(log(1+s)-log(1-s))/s - Lg(s)| < 2**-34.24 (~[-4.95e-11, 4.97e-11]). */
        Lg1 = 0xaaaaaa.0p-24f, /* 0.66666662693 */
        Lg2 = 0xccce13.0p-25f, /* 0.40000972152 */
        Lg3 = 0x91e9ee.0p-25f, /* 0.28498786688 */
        Lg4 = 0xf89e26.0p-26f; /* 0.24279078841 */
    float hfsq, f, s, z, R, w, t1, t2, dk;
    int32_t k = 0, ix = qrt_float_word(x), i, j;
    if (ix < 0x00800000) {          /* x < 2**-126 */
        if ((ix & 0x7fffffff) == 0) /* log(+-0) = -inf */
            return -INFINITY;
        if (ix < 0) /* log(-#) = NaN */
            return NAN;
        k -= 25; /* subnormal number, scale up x */
        x *= two25;
        ix = qrt_float_word(x);
    }
    if (ix >= 0x7f800000)
        return x + x;
    k += (ix >> 23) - 127;
    ix &= 0x007fffff;
    i = (ix + (0x95f64 << 3)) & 0x800000;
    x = qrt_word_float(ix | (i ^ 0x3f800000)); /* normalize x or x/2 */
    k += (i >> 23);
    f = x - 1.0f;
    if ((0x007fffff & (0x8000 + ix)) < 0xc000) { /* -2**-9 <= f < 2**-9 */
        if (f == 0.0f) {
            if (k == 0)
                return 0.0f;
            dk = (float)k;
            return dk * ln2_hi + dk * ln2_lo;
        }
        R = f * f * (0.5f - 0.33333333333333333f * f);
        if (k == 0)
            return f - R;
        dk = (float)k;
        return dk * ln2_hi - ((R - dk * ln2_lo) - f);
    }
    s = f / (2.0f + f);
    dk = (float)k;
    z = s * s;
    i = ix - (0x6147a << 3);
    w = z * z;
    j = (0x6b851 << 3) - ix;
    t1 = w * (Lg2 + w * Lg4);
    t2 = z * (Lg1 + w * Lg3);
    i |= j;
    R = t2 + t1;
    if (i > 0) {
        hfsq = 0.5f * f * f;
        if (k == 0)
            return f - (hfsq - s * (hfsq + R));
        return dk * ln2_hi - ((hfsq - (s * (hfsq + R) + dk * ln2_lo)) - f);
    }
    if (k == 0)
        return f - s * (f - R);
    return dk * ln2_hi - ((s * (f - R) - dk * ln2_lo) - f);
}

/* x * sigmoid(v) for v = hi + lo (lo = 0 for a plain float): x / (1 + e^-v), or x e^v below v = -80, where
 * e^-v would soon overflow (from -88.7) though x * sigmoid(v) is still a normal float for |x| > 1; there
 * 1 + e^v rounds to 1, so x e^v is the same formula's value. lo enters to first order, e^-(hi+lo) =
 * e^-hi (1 - lo): it corrects the rounding of v to hi, which would otherwise cost up to |v| / 2 ulp. */
QRT_GATE_FN float qrt_times_sigmoid(float x, float hi, float lo) {
    const int tail = hi < -80.0f;
    const float e0 = qrt_exp_full(tail ? hi : -hi);
    const float e = fmaf(e0, tail ? lo : -lo, e0);
    return tail ? x * e : x / (1.0f + e);
}

/* silu(x) = x * sigmoid(x): torch's x / (1 + e^-x) but for the tail, where torch's gives 0 below -88.7. */
QRT_GATE_FN float qrt_silu(float x) { return qrt_times_sigmoid(x, x, 0.0f); }

/* torch's tanh form, x/2 * (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as x * sigmoid(2u) (the same
 * function; 1 + tanh(u) would cancel for x < 0). 2u is formed in double, clamped to [-200, 200]
 * (sigmoid is 0 or 1 in float beyond), and split into two floats hi + lo: qrt_gelu_tanh_arg returns hi
 * and sets *lo (its own function: the CPU's loop runs it over a block before the float part, as GCC does
 * not vectorise a loop that mixes the two widths' compares). */
QRT_GATE_FN float qrt_gelu_tanh_arg(float x, float* lo) {
    const double xd = x;
    double v = xd * (1.5957691216057307117 + 0.071354816272600248776 * (xd * xd));
    v = v < -200.0 ? -200.0 : v;
    v = v > 200.0 ? 200.0 : v;
    const float hi = (float)v;
    *lo = (float)(v - (double)hi);
    return hi;
}

QRT_GATE_FN float qrt_gelu_tanh(float x) {
    float lo;
    const float hi = qrt_gelu_tanh_arg(x, &lo);
    return qrt_times_sigmoid(x, hi, lo);
}

/* sin and cos (rotary position embeddings). The argument is reduced to r = |x| - n pi/2, |r| <= pi/4: below 2^19
 * by Cody and Waite's method in double (qrt_pio2_reduce_small), from there by Payne and Hanek's, |x|'s 24-bit
 * significand times a 96-bit window of 2/pi's bits in integers (qrt_pio2_reduce_large), each holding r to within 2^-52
 * of its size for every float; then Taylor polynomials in double (truncation below 5e-17 relative on
 * [-pi/4, pi/4]) and one rounding to float. So the result is the exact
 * value correctly rounded but where it lies within about 2^-40 of its size from a point halfway between two
 * floats. Integer and double IEEE operations only (no fma, no libm), so every CPU and the GPU give the same bits. */

/* 32 bits of 2/pi from bit i on (bit 1 the first after the point; bits at 0 and before are 0) */
QRT_GATE_FN unsigned qrt_two_over_pi_bits(int i) {
    if (i < -30)
        return 0u;
    if (i < 1)
        return qrt_two_over_pi_bits(1) >> (1 - i);
    const int j = (i - 1) / 32, off = (i - 1) % 32;
    unsigned w[2];
    for (int k = 0; k < 2; k++) {
        switch (j + k) { /* 2/pi's first 256 bits: enough for every float (i up to 199) */
        case 0: w[k] = 0xa2f9836eu; break;
        case 1: w[k] = 0x4e441529u; break;
        case 2: w[k] = 0xfc2757d1u; break;
        case 3: w[k] = 0xf534ddc0u; break;
        case 4: w[k] = 0xdb629599u; break;
        case 5: w[k] = 0x3c439041u; break;
        case 6: w[k] = 0xfe5163abu; break;
        default: w[k] = 0xdebbc561u; break;
        }
    }
    return off ? (w[0] << off) | (w[1] >> (32 - off)) : w[0];
}

/* a = |x| >= pi/4, finite (qrt_pio2_reduce takes it from 2^19): returns r = a - n pi/2 (|r| <= pi/4, in double) and sets *n to n mod 4. a = m 2^s, m
 * its 24-bit integer significand; a 2/pi mod 4 = m B 2^-94 mod 4 with B bits s - 1 .. s + 94 of 2/pi (earlier
 * bits add multiples of 4), so its 96 low bits, y (the top 64, a 2/pi mod 4 times 2^62) and the 32 below. */
QRT_GATE_FN double qrt_pio2_reduce_large(float a, int* n) {
    const unsigned bits = qrt_float_bits(a);
    const unsigned long long m = (bits & 0x7fffffu) | 0x800000u;
    const int i = (int)(bits >> 23) - 151; /* s - 1, s = the biased exponent - 150 */
    const unsigned long long p2 = m * qrt_two_over_pi_bits(i), p1 = m * qrt_two_over_pi_bits(i + 32),
                             p0 = m * qrt_two_over_pi_bits(i + 64);
    const unsigned long long y = (p2 << 32) + p1 + (p0 >> 32);
    const unsigned long long q = (y + (1ull << 61)) >> 62; /* the nearest multiple of pi/2 (mod 4) */
    const long long f = (long long)(y - (q << 62));         /* a 2/pi - q, times 2^62: |f| <= 2^61 */
    *n = (int)(q & 3u);
    return ((double)f + (double)(p0 & 0xffffffffu) * 0x1p-32) * 0x1.921fb54442d18p-62; /* times pi/2 2^-62 */
}

/* pi/4 <= a < 2^19: n = the nearest integer to a 2/pi (below 2^19, exact in double and int), r = a - n pi/2 with
 * pi/2 in three parts, the first two of 33 bits (n times each is exact, a - n P1 exact by Sterbenz's lemma). */
QRT_GATE_FN double qrt_pio2_reduce_small(float a, int* n) {
    const double k = (double)(long long)((double)a * 0x1.45f306dc9c883p-1 + 0.5);
    *n = (int)((long long)k & 3);
    return (((double)a - k * 0x1.921fb544p0) - k * 0x1.0b4611a6p-34) - k * 0x1.3198a2e037073p-69;
}

/* a = |x| finite: r = a - n pi/2, |r| <= pi/4, by the reduction a's size takes (n = 0 below pi/4); sets *n to
 * n mod 4 */
QRT_GATE_FN double qrt_pio2_reduce(float a, int* n) {
    *n = 0;
    return a < 0.785398163f ? (double)a : a < 0x1p19f ? qrt_pio2_reduce_small(a, n) : qrt_pio2_reduce_large(a, n);
}

QRT_GATE_FN double qrt_sin_poly(double r) { /* sin r, |r| <= pi/4: Taylor to r^15 */
    const double z = r * r;
    double p = -1.0 / 1307674368000.0;
    p = p * z + 1.0 / 6227020800.0;
    p = p * z - 1.0 / 39916800.0;
    p = p * z + 1.0 / 362880.0;
    p = p * z - 1.0 / 5040.0;
    p = p * z + 1.0 / 120.0;
    p = p * z - 1.0 / 6.0;
    return r + r * z * p;
}

QRT_GATE_FN double qrt_cos_poly(double r) { /* cos r, |r| <= pi/4: Taylor to r^16 */
    const double z = r * r;
    double p = 1.0 / 20922789888000.0;
    p = p * z - 1.0 / 87178291200.0;
    p = p * z + 1.0 / 479001600.0;
    p = p * z - 1.0 / 3628800.0;
    p = p * z + 1.0 / 40320.0;
    p = p * z - 1.0 / 720.0;
    p = p * z + 1.0 / 24.0;
    p = p * z - 0.5;
    return 1.0 + z * p;
}

/* sin(a + q pi/2), a = |x| finite: with a = n pi/2 + r, sin(r + (n + q) pi/2) = S, C, -S, -C for n + q = 0, 1, 2, 3
 * mod 4 (cos(a) = sin(a + pi/2): q = 1) */
QRT_GATE_FN float qrt_sin_quadrant(float a, int q) {
    int n;
    const double r = qrt_pio2_reduce(a, &n);
    n += q;
    const double v = n & 1 ? qrt_cos_poly(r) : qrt_sin_poly(r);
    return (float)(n & 2 ? -v : v);
}

/* sin(x) = -sin(-x), cos(x) = cos(-x); NaN at infinities */
QRT_GATE_FN float qrt_sinf(float x) {
    const float a = fabsf(x);
    if (!(a < INFINITY))
        return x - x;
    const float y = qrt_sin_quadrant(a, 0);
    return qrt_float_bits(x) >> 31 ? -y : y;
}

QRT_GATE_FN float qrt_cosf(float x) {
    const float a = fabsf(x);
    return a < INFINITY ? qrt_sin_quadrant(a, 1) : x - x;
}

#endif /* QRT_FLOAT_MATH_H */
