/* qrt's exp, sigmoid and tanh: the scalar functions every gate applies, as a fixed sequence of
 * operations (an explicit fmaf where a product is fused, every other step rounded on its own under
 * -ffp-contract=off), so every ISA and build gives the same bits.
 *
 * torch evaluates sigmoid and tanh with vectorised approximations of its own; libm's scalar expf
 * and tanhf made the gate loops cost ten times the int8 products of a step. Here exp is a
 * Cody-Waite reduction and a degree-5 polynomial (Cephes' expf coefficients) in fmaf, with no
 * calls and no branches, so a loop over the hidden units becomes vector code. Measured against
 * the exact functions over 6 million inputs it stays within about 1 ulp; the tests hold every
 * cell to 3e-7 of torch per step.
 *
 * The GPU's gate kernels (qrt/cuda/rnn_cell.cu) compile these same functions as device code, with
 * contraction off (--fmad=false), so both backends give the same bits.
 */
#ifndef QRT_GATE_MATH_H
#define QRT_GATE_MATH_H

#if defined(__CUDACC__)
#define QRT_GATE_FN __device__ static inline
#else
#define QRT_GATE_FN static inline
#endif
#if !defined(__CUDACC_RTC__) /* NVRTC declares the math functions itself and has no system headers */
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

/* A float's bits and back (unsigned int: 32 bits on every target, and NVRTC has no stdint.h). Bit
 * operations are how the functions below avoid compares and conversions that vectorise poorly. */
QRT_GATE_FN unsigned qrt_float_bits(float x) {
#if defined(__CUDACC__)
    return __float_as_uint(x);
#else
    unsigned w;
    memcpy(&w, &x, sizeof w);
    return w;
#endif
}

QRT_GATE_FN float qrt_bits_float(unsigned w) {
#if defined(__CUDACC__)
    return __uint_as_float(w);
#else
    float x;
    memcpy(&x, &w, sizeof x);
    return x;
#endif
}

/* e^x = 2^n e^r for an x already clamped to a finite range: returns e^r and sets *n (the float ops in
 * float_math.h scale the result over the whole float range, the gates below within [-87, 87] (tanh) and
 * [-89, 89] (sigmoid)) */
QRT_GATE_FN float qrt_exp_parts(float x, int* n_out) {
    /* x = n ln2 + r, |r| <= ln2 / 2, n = nearbyintf(x log2e) by the 1.5 * 2^23 shift: for |v| < 2^22,
     * v + 1.5 * 2^23 rounds v to an integer (ties to even, as nearbyintf) and holds it in its low bits,
     * so n takes no rounding instruction and no conversion to int. A NaN x gives NaN through r,
     * whatever n's bits are. */
    const float shifted = x * 1.44269504088896341f + 12582912.0f;
    const float n = shifted - 12582912.0f;
    float r = fmaf(n, -0.693359375f, x);                      /* ln2 in two parts: the high part */
    r = fmaf(n, 2.12194440e-4f, r);                           /* is exact in n * 0.693359375 */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    *n_out = (int)(qrt_float_bits(shifted) - 0x4b400000u);   /* less the bits of 1.5 * 2^23 */
    return fmaf(p, r * r, r) + 1.0f;                          /* e^r = 1 + r + r^2 P(r) */
}

/* 2^n, n in [-126, 127] (any bits for a NaN's n: unsigned arithmetic cannot overflow) */
QRT_GATE_FN float qrt_pow2(int n) { return qrt_bits_float(((unsigned)n + 127u) << 23); }

/* x clamped to [-below, above], both bounds given as the bits of positive floats, on x's bits: |x| past
 * the bound on its side (infinity included) becomes that bound with x's sign; NaN stays NaN. Written as
 * float compares, GCC carried both clamped cases through exp as constants: with that, nearbyintf and a
 * conversion to int, Zen 5's LSTM gate loops ran 8-17% slower. */
QRT_GATE_FN float qrt_clamp_bits(float x, unsigned below, unsigned above) {
    const unsigned bits = qrt_float_bits(x), magnitude = bits & 0x7fffffffu;
    const unsigned bound = bits >> 31 ? below : above;
    return magnitude > bound && magnitude <= 0x7f800000u ? qrt_bits_float((bits & 0x80000000u) | bound) : x;
}

/* exp(x), clamped to [-87, 87] (0x42ae0000) first: beyond that tanh's result no longer changes (it is 1 in
 * float32 from |x| > 9). */
QRT_GATE_FN float qrt_exp(float x) {
    x = qrt_clamp_bits(x, 0x42ae0000u, 0x42ae0000u);
    int n;
    const float p = qrt_exp_parts(x, &n);
    return p * qrt_pow2(n);
}

/* sigmoid over the whole float range, the gates' and the op's: 1 / (1 + e^-v), e^-v clamped to [-89, 89] and
 * formed as p 2^(n-1) 2, exact where normal and inf from 88.7 on, so the sigmoid is 0 below -88.7, as torch's
 * (a clamp at 87 had held a gate there at 1.65e-38). Below -87, where e^-v < 2^-125, n is raised to -125 so
 * that 2^(n-1) stays normal: 1 plus either is 1. One bound for both signs and an integer max cost less than a
 * bound chosen by the sign (batch-32 LSTM and GRU sequences 0.3-1.7% faster, the op 11%). The same bits as
 * 1 / (1 + qrt_exp_full(-v)) for every float (bench/sigmoid_all_floats.c). */
QRT_GATE_FN float qrt_sigmoid(float v) {
    int n;
    const float p = qrt_exp_parts(qrt_clamp_bits(-v, 0x42b20000u, 0x42b20000u), &n);
    n = n < -125 ? -125 : n;
    return 1.0f / (1.0f + p * qrt_pow2(n - 1) * 2.0f);
}

/* torch.relu: 0 where v < 0, else v, so NaN and -0.0 stay (max(v, 0) would make -0.0 +0.0); the relu cell's,
 * the op's and a dynamic Linear's fused one */
QRT_GATE_FN float qrt_relu(float v) { return v < 0.0f ? 0.0f : v; }

/* tanh: an odd polynomial below 0.625 (Cephes' tanhf), where 1 - 2/(e^2a + 1) would lose its
 * relative accuracy to cancellation; that formula above. Both are computed, one is kept:
 * a select, not a branch, so the loop still vectorises. */
QRT_GATE_FN float qrt_tanh(float v) {
    const float a = fabsf(v);
    const float z = a * a;
    float small = -5.70498872745e-3f;
    small = fmaf(small, z, 2.06390887954e-2f);
    small = fmaf(small, z, -5.37397155531e-2f);
    small = fmaf(small, z, 1.33314422036e-1f);
    small = fmaf(small, z, -3.33332819422e-1f);
    small = fmaf(small * z, a, a);
    const float large = 1.0f - 2.0f / (qrt_exp(2.0f * a) + 1.0f);
    return copysignf(a < 0.625f ? small : large, v);
}

enum qrt_cell { QRT_RNN_TANH, QRT_RNN_RELU, QRT_LSTM, QRT_GRU };

#endif /* QRT_GATE_MATH_H */
