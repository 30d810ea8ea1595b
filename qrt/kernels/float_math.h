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

#endif /* QRT_FLOAT_MATH_H */
