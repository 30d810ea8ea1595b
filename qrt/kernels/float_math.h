/* The scalar functions of qrt's float32 ops (float_ops.h): log, erfc, and the activations built on
 * them and on gate_math.h's exp. Every one is a fixed sequence of IEEE float (and, where said,
 * double) operations, with no libm transcendental, so every CPU and build gives the same bits:
 * libm's expf, logf and erff differ between libcs and their versions.
 *
 * qrt_logf and qrt_erfc are FreeBSD msun's e_logf.c and s_erff.c (erfcf), ported, under this notice:
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
 * Changes from msun: no floating-point exception flags or errno; expf is qrt_exp_full; erfc takes the
 * low part of a double-float argument (qrt_erfc below).
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

/* exp over the whole float range: gate_math.h's qrt_exp (the same bits on [-87, 87], where the gates
 * clamp), and beyond it the value down to the subnormals, then 0 below -103.9, and inf above 88.7. */
QRT_GATE_FN float qrt_exp_full(float x) {
    x = qrt_clamp_bits(x, 0x42d00000u, 0x42b20000u); /* to [-104, 89], as qrt_exp clamps */
    int n;
    const float p = qrt_exp_parts(x, &n);
    /* 2^n, n in [-150, 128], as two factors that are normal floats: p * 2^h is exact, so the result
     * rounds once, only where it is subnormal or overflows (elsewhere, the bits of p * 2^n) */
    const int h = n / 2;
    return p * qrt_pow2(h) * qrt_pow2(n - h);
}

/* sigmoid over the whole range: the gates' qrt_sigmoid (the same bits) from -87 up; below, where the
 * gates' clamped exp holds it at 1.65e-38, the value, and 0 below -88.7 (as torch). */
QRT_GATE_FN float qrt_sigmoid_full(float x) { return 1.0f / (1.0f + qrt_exp_full(-x)); }

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

/* erfc(x + lo), where lo is the low part of an argument known to about twice float's precision
 * (|lo| <= ulp(x) / 2; lo = 0 for a plain float). Without it the rounding of the argument alone
 * would cost up to 2 ulp near |x| = 1 and 2 x^2 ulp in the tail, where erfc(x) ~ e^-x^2 amplifies
 * a relative change d of x into 2 x^2 d. lo enters to first order, erfc(x + lo) = erfc(x) -
 * lo (2/sqrt(pi)) e^-x^2, and in the tail through e^-(x+lo)^2 = e^-x^2 e^(-2 x lo) and 1/(x + lo).
 * msun's erfcf otherwise (its Kargl revision with shorter rational approximations). */
QRT_GATE_FN float qrt_erfc(float x, float lo) {
    static const float erx = 8.42697144e-01f, /* 0x3f57bb00 */
        two_over_sqrt_pi = 1.12837916709551257f,
        /* Domain [0, 0.84375], range ~[-5.4419e-10, 5.5179e-10]:
         * |(erf(x) - x)/x - pp(x)/qq(x)| < 2**-31 */
        pp0 = 1.28379166e-01f, /* 0x3e0375d4 */
        pp1 = -3.36030394e-01f, /* 0xbeac0c2d */
        pp2 = -1.86261395e-03f, /* 0xbaf422f4 */
        qq1 = 3.12324315e-01f, /* 0x3e9fe8f9 */
        qq2 = 2.16070414e-02f, /* 0x3cb10140 */
        qq3 = -1.98859372e-03f, /* 0xbb025311 */
        /* Domain [0.84375, 1.25], range ~[-1.023e-9, 1.023e-9]:
         * |(erf(x) - erx) - pa(x)/qa(x)| < 2**-31 */
        pa0 = 3.65041046e-06f, /* 0x3674f993 */
        pa1 = 4.15109307e-01f, /* 0x3ed48935 */
        pa2 = -2.09395722e-01f, /* 0xbe566bd5 */
        pa3 = 8.67677554e-02f, /* 0x3db1b34b */
        qa1 = 4.95560974e-01f, /* 0x3efdba2b */
        qa2 = 3.71248513e-01f, /* 0x3ebe1449 */
        qa3 = 3.92478965e-02f, /* 0x3d20c267 */
        /* Domain [1.25,1/0.35], range ~[-4.821e-9, 4.927e-9]:
         * |log(x*erfc(x)) + x**2 + 0.5625 - ra(x)/sa(x)| < 2**-28 */
        ra0 = -9.88156721e-03f, /* 0xbc21e64c */
        ra1 = -5.43658376e-01f, /* 0xbf0b2d32 */
        ra2 = -1.66828310e+00f, /* 0xbfd58a4d */
        ra3 = -6.91554189e-01f, /* 0xbf3109b2 */
        sa1 = 4.48581553e+00f, /* 0x408f8bcd */
        sa2 = 4.10799170e+00f, /* 0x408374ab */
        sa3 = 5.53855181e-01f, /* 0x3f0dc974 */
        /* Domain [2.85715, 11], range ~[-1.484e-9, 1.505e-9]:
         * |log(x*erfc(x)) + x**2 + 0.5625 - rb(x)/sb(x)| < 2**-30 */
        rb0 = -9.86496918e-03f, /* 0xbc21a0ae */
        rb1 = -5.48049808e-01f, /* 0xbf0c4cfe */
        rb2 = -1.84115684e+00f, /* 0xbfebab07 */
        sb1 = 4.87132740e+00f, /* 0x409be1ea */
        sb2 = 3.04982710e+00f, /* 0x4043305e */
        sb3 = -7.61900663e-01f; /* 0xbf430bec */
    float R, S, P, Q, s, y, z, r, a, d;  /* msun's names */
    const int32_t hx = qrt_float_word(x), ix = hx & 0x7fffffff;
    if (ix >= 0x7f800000) /* erfc(nan) = nan, erfc(+-inf) = 0, 2 */
        return (float)(((uint32_t)hx >> 31) << 1) + 1.0f / x;
    if (ix < 0x3fa00000) { /* |x| < 1.25: the first-order term of lo, d = lo * 2/sqrt(pi) * e^-x^2 */
        d = lo * (two_over_sqrt_pi * qrt_exp_full(-(x * x)));
        if (ix < 0x3f580000) { /* |x| < 0.84375 */
            if (ix < 0x33800000) /* |x| < 2**-24 */
                return 1.0f - (x + d);
            z = x * x;
            r = pp0 + z * (pp1 + z * pp2);
            s = 1.0f + z * (qq1 + z * (qq2 + z * qq3));
            y = r / s;
            if (hx < 0x3e800000) /* x < 1/4 */
                return 1.0f - (x + (x * y + d));
            r = x * y + d;
            r += (x - 0.5f);
            return 0.5f - r;
        }
        s = fabsf(x) - 1.0f; /* 0.84375 <= |x| < 1.25 */
        P = pa0 + s * (pa1 + s * (pa2 + s * pa3));
        Q = 1.0f + s * (qa1 + s * (qa2 + s * qa3));
        if (hx >= 0)
            return (1.0f - erx) - (P / Q + d);
        return 1.0f + (erx + (P / Q - d));
    }
    if (ix < 0x41300000) { /* |x| < 11 */
        a = fabsf(x);
        s = 1.0f / (a * a);
        if (ix < 0x4036db8c) { /* |x| < 2.85715 ~ 1/.35 */
            R = ra0 + s * (ra1 + s * (ra2 + s * ra3));
            S = 1.0f + s * (sa1 + s * (sa2 + s * sa3));
        } else { /* |x| >= 2.85715 ~ 1/.35 */
            if (hx < 0 && ix >= 0x40a00000) /* x < -5 */
                return 2.0f;
            R = rb0 + s * (rb1 + s * rb2);
            S = 1.0f + s * (sb1 + s * (sb2 + s * sb3));
        }
        /* erfc(a) = e^(-a^2 - 0.5625 + R/S) / a. msun splits the exponent at z, x with its low 13 bits
         * cleared: -z*z-0.5625 is exact, and the rest, B, small. One exp of their rounded sum,
         * corrected by the sum's rounding error (exact: |A| > |B|), costs less accuracy than msun's two
         * exps and their product. */
        z = qrt_word_float(hx & 0xffffe000);
        const float A = -z * z - 0.5625f, B = ((z - x) * (z + x) - 2.0f * x * lo) + R / S, sum = A + B;
        r = qrt_exp_full(sum);
        r = fmaf(r, (A - sum) + B, r);
        if (hx > 0) {
            r = r / a;
            return r - r * (lo / a); /* 1 / (a + lo) to first order */
        }
        return 2.0f - r / a;
    }
    return hx > 0 ? 0.0f : 2.0f;
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

/* gelu(x) = x * Phi(x) = x * erfc(-x / sqrt(2)) / 2. The argument is formed in double and split into
 * two floats for qrt_erfc; erfc, not 1 + erf, keeps the negative tail accurate (1 + erf(x) cancels
 * there: torch's gelu(-6) is 0, the exact value -5.9e-9). */
QRT_GATE_FN float qrt_gelu(float x) {
    const double t = (double)x * -0.70710678118654752440;
    const float hi = (float)t;
    return x * (0.5f * qrt_erfc(hi, (float)(t - (double)hi)));
}

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
