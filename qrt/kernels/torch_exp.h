/* The two exponentials torch 2.13's CPU attention (FlashAttentionKernel.cpp) takes, as fixed sequences of
 * IEEE operations, so that qrt's attention (attention_body.h, qrt/cuda/attention.cu) gives torch's bits on
 * every CPU and build (docs/NUMERICS.md, "Matrix product and attention"):
 *
 *  - qrt_exp_u20: ATen's Vectorized<float>::exp_u20 (vec512_float.h; vec256_float.h's is the same sequence),
 *    the vector exp of its softmax: a degree-5 polynomial on x - n ln2, every step one fma or one rounded
 *    operation, as its intrinsics do;
 *  - qrt_exp_double: the exp its softmax takes for the keys past the last whole vector, `exp(tmp1)` of a
 *    float, which resolves to C's exp(double): torch stores (float)exp and adds the double to its float sum.
 */
#ifndef QRT_TORCH_EXP_H
#define QRT_TORCH_EXP_H

#include "gate_math.h"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#include <stdint.h>
#include <string.h>
#else /* NVRTC has no system headers */
typedef unsigned long long uint64_t;
#endif

/* exp_u20(x): inputs below ln(FLT_MIN) give +0, above ln(FLT_MAX) clamp there (a NaN takes the upper
 * clamp, as _mm512_min_ps(x, hi) returns hi for it). */
QRT_GATE_FN float qrt_exp_u20(float x) {
    const float lo = qrt_bits_float(0xc2aeac50u), hi = qrt_bits_float(0x42b17218u);
    const float log2e = qrt_bits_float(0x3fb8aa3bu), ln2 = qrt_bits_float(0x3f317218u);
    float src = x < hi ? x : hi;
    src = src > lo ? src : lo;
    const float fx = floorf(fmaf(src, log2e, 0.5f)); /* an integer in [-126, 128] */
    const float r = fmaf(-fx, ln2, src);
    float p = fmaf(r, 0.00828929059f, 0.0418978221f);
    p = fmaf(r, p, 0.166676521f);
    p = fmaf(r, p, 0.499991506f);
    p = fmaf(r, p, 0.999999701f);
    p = fmaf(r, p, 1.0f);
    const float pow2 = x < lo ? 0.0f : qrt_bits_float((unsigned)((int)(fx - 1.0f) + 127) << 23); /* 2^(fx - 1) */
    return p * pow2 * 2.0f;
}

QRT_GATE_FN double qrt_bits_double(uint64_t u) {
#if defined(__CUDACC__)
    return __longlong_as_double((long long)u);
#else
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* exp(x) in double, x a float, within a few ulps of double (|r| <= ln2 / 2, Taylor to r^13 by Horner, two
 * exact scalings by powers of 2): rounded to float, or added to a float and rounded, it gives the bits that
 * a correctly rounded exp would, but where the exact value lies within about 2^-50 of the midpoint of two
 * floats. torch's tail calls the C exp(double) of glibc, which is as close. */
QRT_GATE_FN double qrt_exp_double(float x) {
    if (x != x)
        return (double)x;
    const double xd = x < -746.0f ? -746.0 : x > 710.0f ? 710.0 : (double)x;
    const double shift = 0x1.8p+52, ln2_hi = 0x1.62e42fefa39efp-1, ln2_lo = 0x1.abc9e3b39803fp-56;
    const double kd = (xd * 0x1.71547652b82fep+0 + shift) - shift; /* round(x / ln2) */
    const double r = fma(-kd, ln2_lo, fma(-kd, ln2_hi, xd));
    double p = 1.0 / 6227020800.0; /* 1/13!, then Horner down through 1/n! */
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    const int k = (int)kd, h = k / 2; /* 2^k as two factors, each a normal double */
    return p * qrt_bits_double((uint64_t)(h + 1023) << 52) * qrt_bits_double((uint64_t)(k - h + 1023) << 52);
}

#endif /* QRT_TORCH_EXP_H */
