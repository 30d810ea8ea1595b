/* The two exponentials torch 2.13's CPU attention (FlashAttentionKernel.cpp) takes, as fixed sequences of
 * IEEE operations, so that qrt's attention (attention_body.h, qrt/cuda/attention.cu) gives torch's bits on
 * every CPU and build (docs/NUMERICS.md, "Matrix product and attention"):
 *
 *  - qrt_exp_u20: ATen's Vectorized<float>::exp_u20 (vec512_float.h; vec256_float.h's is the same sequence),
 *    the vector exp of its softmax: a degree-5 polynomial on x - n ln2, every step one fma or one rounded
 *    operation, as its intrinsics do;
 *  - qrt_exp_rounded: the exp its softmax takes for the keys past the last whole vector: torch's values there
 *    are the correctly rounded ones (measured), which its exp in double rounded to float gives;
 *  - qrt_expf_glibc: glibc's expf on x86-64 CPUs with FMA (its __expf_fma ifunc), torch's std::exp(float) for
 *    the factor exp(m_old - m_new) that rescales its running sum between blocks of keys: x N / ln2 = k + r in
 *    double, 2^(k/N) from a table of N = 32 doubles, a cubic in r, each a + b c contracted to one fma as that
 *    build compiles it (x N / ln2 too: its product feeds both the rounding to k and r). The algorithm
 *    (Szabolcs Nagy's, ARM optimized-routines) with its published constants; equal to glibc 2.36's expf on
 *    every float in [-110, 90] (checked exhaustively), which tests/test_ops_attention.py samples.
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

#define QRT_EXPF_BITS 5
#define QRT_EXPF_N (1 << QRT_EXPF_BITS)

/* glibc's __exp2f_data.tab: the bits of 2^(i/N), correctly rounded, less i << (52 - QRT_EXPF_BITS) */
#if defined(__CUDACC__)
__device__
#endif
static const uint64_t qrt_expf_tab[QRT_EXPF_N] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

QRT_GATE_FN uint64_t qrt_double_bits(double x) {
#if defined(__CUDACC__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

/* glibc's expf(x) as its x86-64 FMA build computes it: +0 below log(2^-150), +inf above log(2^128), NaN for
 * NaN; elsewhere x N / ln2 = k + r (k an integer, by adding 1.5 2^52), s = 2^(k/N) from the table, and
 * (float)(s fma(fma(c0, r, c1), r^2, fma(c2, r, 1))). */
QRT_GATE_FN float qrt_expf_glibc(float x) {
    if (x != x)
        return x + x;
    if (x > 0x1.62e42ep6f)
        return INFINITY;
    if (x < -0x1.9fe368p6f)
        return 0.0f;
    const double shift = 0x1.8p+52, invln2n = 0x1.71547652b82fep+0 * QRT_EXPF_N;
    const double c0 = 0x1.c6af84b912394p-5 / QRT_EXPF_N / QRT_EXPF_N / QRT_EXPF_N;
    const double c1 = 0x1.ebfce50fac4f3p-3 / QRT_EXPF_N / QRT_EXPF_N, c2 = 0x1.62e42ff0c52d6p-1 / QRT_EXPF_N;
    double kd = fma(invln2n, (double)x, shift); /* x N / ln2 rounded to an integer k, held in the low bits */
    const uint64_t ki = qrt_double_bits(kd);
    kd -= shift;
    const double r = fma(invln2n, (double)x, -kd); /* x N / ln2 - k */
    const double s = qrt_bits_double(qrt_expf_tab[ki % QRT_EXPF_N] + (ki << (52 - QRT_EXPF_BITS)));
    return (float)(s * fma(fma(c0, r, c1), r * r, fma(c2, r, 1.0)));
}

/* exp(x) correctly rounded to float, as torch's tail gets it from the C exp(double) of glibc rounded to
 * float: x 32 / ln2 = k + f (k an integer, by adding 1.5 2^52), r = x - k ln2 / 32 (|r| <= ln2 / 64) in two
 * fma steps, 2^(k/32) from qrt_expf_tab, and exp(r) as Taylor to r^6 by Horner (truncation below 2^-58): within
 * about 2 ulps of double, and rounded to float equal to expl(x) rounded to float on every float (checked
 * exhaustively, and equal there to the Taylor-to-r^13 form on ln2 / 2 this replaces, at half its operations).
 * Below -104 exp(x) < 2^-150 rounds to +0; above 89 to +inf. The edges are selects, not branches, so that a
 * loop of it vectorises (the index k mod 32 is in the table whatever x is, NaN included). */
QRT_GATE_FN float qrt_exp_rounded(float x) {
    const float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;
    const double shift = 0x1.8p+52, n_ln2 = 0x1.71547652b82fep+0 * QRT_EXPF_N;
    const double ln2n_hi = 0x1.62e42fefa39efp-1 / QRT_EXPF_N, ln2n_lo = 0x1.abc9e3b39803fp-56 / QRT_EXPF_N;
    double kd = fma((double)xc, n_ln2, shift); /* x N / ln2 rounded to an integer k, held in the low bits */
    const uint64_t ki = qrt_double_bits(kd);
    kd -= shift;
    const double r = fma(-kd, ln2n_lo, fma(-kd, ln2n_hi, (double)xc));
    double p = 1.0 / 720.0; /* 1/6!, then Horner down through 1/n! */
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    const float y = (float)(qrt_bits_double(qrt_expf_tab[ki % QRT_EXPF_N] + (ki << (52 - QRT_EXPF_BITS))) * p);
    return x != x ? x + x : x < -104.0f ? 0.0f : x > 89.0f ? INFINITY : y;
}

#endif /* QRT_TORCH_EXP_H */
