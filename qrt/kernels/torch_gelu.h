/* gelu (the erf form) as torch 2.13 computes it on the CPU for float32: F.gelu hands a contiguous float tensor
 * of two or more elements to oneDNN (ideep eltwise_gelu_erf), whose JIT kernel on AVX-512 CPUs
 * (jit_uni_eltwise_injector's gelu_erf_minimax_approx) evaluates erf(x / sqrt(2)) as one of 24 degree-5
 * polynomials in |x| picked by |x|'s exponent and two leading mantissa bits, then x (1 + erf) / 2. Here the
 * same IEEE operations in portable C (each product fused where the kernel fuses it, explicit fmaf), so every
 * qrt build and the GPU (qrt/cuda/float_ops.cu) give torch's bits: equal to torch 2.13 on all 2^32 float32
 * inputs (NaN as NaN), on an AVX-512 Xeon (docs/NUMERICS.md, section 8). The avx512 and fma builds look the
 * table up in registers instead (torch_gelu_avx512.h, torch_gelu_avx2.h): this is their oracle, bit for bit. */
#ifndef QRT_TORCH_GELU_H
#define QRT_TORCH_GELU_H

#include "gate_math.h"

#define QRT_GELU_POLYS 24

/* gelu_erf_minimax_pol's coefficients by degree (0 to 5), polynomials 1 to 24 (the kernel's index 0 is never
 * taken: its index is clamped to [1, 24]); oneDNN's table, exactly (float hex literals) */
#if defined(__CUDACC__)
__device__
#endif
static const float qrt_gelu_coeffs[6][QRT_GELU_POLYS] = {
    {0x1.04ef24p-26f, 0x1.039818p-24f, 0x1.a47a94p-23f, 0x1.35889ap-21f, 0x1.e6db1p-20f, 0x1.dd0452p-18f,
     0x1.714776p-16f, 0x1.cf4426p-15f, 0x1.800676p-13f, 0x1.54b43ap-11f, 0x1.c6b0c6p-10f, 0x1.f051e4p-9f,
     0x1.116296p-7f, 0x1.a2bda6p-7f, -0x1.a0646cp-9f, -0x1.1b1cbcp-4f, -0x1.1579b2p-2f, -0x1.183344p-1f,
     -0x1.99665p-2f, 0x1.2ed9dap-3f, 0x1.8e1b32p-1f, 0x1.f5765p-1f, 0x1p+0f, 0.0f},
    {0x1.98843ep-1f, 0x1.98840ep-1f, 0x1.988396p-1f, 0x1.988276p-1f, 0x1.987f5ap-1f, 0x1.98745ep-1f,
     0x1.985a8p-1f, 0x1.9828d4p-1f, 0x1.978682p-1f, 0x1.95a118p-1f, 0x1.91f19ep-1f, 0x1.8bf58ep-1f,
     0x1.809c0ep-1f, 0x1.77301ep-1f, 0x1.91bfe6p-1f, 0x1.f16436p-1f, 0x1.760e08p+0f, 0x1.033864p+1f,
     0x1.ca6dacp+0f, 0x1.02663cp+0f, 0x1.d90d08p-3f, 0x1.31f26cp-6f, 0.0f, 0x1p+0f},
    {0x1.6bc99ep-17f, 0x1.e5ff12p-16f, 0x1.18477cp-14f, 0x1.2ea6b8p-13f, 0x1.56556p-12f, 0x1.c1f5b6p-11f,
     0x1.f372cp-10f, 0x1.dca922p-9f, 0x1.149d8ap-7f, 0x1.4b5518p-6f, 0x1.4271b2p-5f, 0x1.0e6fa8p-4f,
     0x1.bf6ccp-4f, 0x1.1e4f56p-3f, 0x1.280096p-4f, -0x1.1dfbd6p-3f, -0x1.3b2d86p-1f, -0x1.13b6bp+0f,
     -0x1.db312ep-1f, -0x1.ed3f7p-2f, -0x1.89f15p-4f, -0x1.bcc844p-8f, 0.0f, 0.0f},
    {-0x1.108aep-3f, -0x1.10c736p-3f, -0x1.11306ep-3f, -0x1.11e812p-3f, -0x1.13572ap-3f, -0x1.16cdap-3f,
     -0x1.1c8014p-3f, -0x1.249bfp-3f, -0x1.37bc04p-3f, -0x1.5e3392p-3f, -0x1.92637ep-3f, -0x1.d0bf78p-3f,
     -0x1.1392bep-2f, -0x1.2d9794p-2f, -0x1.008954p-2f, -0x1.0aa1e4p-3f, 0x1.9fad42p-4f, 0x1.29904cp-2f,
     0x1.f268bep-3f, 0x1.d9d922p-4f, 0x1.48cadp-6f, 0x1.43c014p-10f, 0.0f, 0.0f},
    {0x1.e12f46p-12f, 0x1.b08bb8p-11f, 0x1.63f46ap-10f, 0x1.19df7p-9f, 0x1.ca756cp-9f, 0x1.95ca4ep-8f,
     0x1.442e24p-7f, 0x1.d8b08p-7f, 0x1.814e06p-6f, 0x1.3b9832p-5f, 0x1.c6cadap-5f, 0x1.2ab20ep-4f,
     0x1.7f322p-4f, 0x1.aa7ed2p-4f, 0x1.6fb9dep-4f, 0x1.c73d7cp-5f, -0x1.ddbc9p-11f, -0x1.457cd2p-5f,
     -0x1.0839e2p-5f, -0x1.c9eb56p-7f, -0x1.12f464p-9f, -0x1.d7e7p-14f, 0.0f, 0.0f},
    {0x1.36c0ap-6f, 0x1.2f1a22p-6f, 0x1.25d0ap-6f, 0x1.1a0b16p-6f, 0x1.0908a8p-6f, 0x1.d9ac46p-7f,
     0x1.990496p-7f, 0x1.54f26ap-7f, 0x1.c1672p-8f, 0x1.0ca358p-9f, -0x1.465ea6p-9f, -0x1.a85f4p-8f,
     -0x1.58a6ccp-7f, -0x1.92593cp-7f, -0x1.54f54cp-7f, -0x1.aaba08p-8f, -0x1.0474ecp-10f, 0x1.20555p-9f,
     0x1.c4b4fcp-10f, 0x1.63ef24p-11f, 0x1.7086eap-14f, 0x1.1376b4p-18f, 0.0f, 0.0f},
};

/* The polynomial's row (0 to 23) for |x|'s bits a: the kernel adds 0xc21fffff to the bits, shifts right by 21
 * (two mantissa bits per exponent) and clamps to [1, 24]; above 0x1.62b9dcp2 (where erf rounds to 1, inf
 * included) it takes polynomial 23, the constant 1; NaN stays on 24, which gives NaN. In integer arithmetic and
 * bit selects: GCC vectorises the loop around it only so (a ?: makes it split the table's loads). */
QRT_GATE_FN int qrt_gelu_poly(unsigned a) {
    int i = (int)((a > 0x3de00001u ? a - 0x3de00001u : 0u) >> 21);
    i = i < 1 ? 1 : i;
    i = i > QRT_GELU_POLYS ? QRT_GELU_POLYS : i;
    const int one = -(int)((a > 0x40b15ceeu) & (a <= 0x7f800000u));
    return ((i & ~one) | (23 & one)) - 1;
}

/* x (1 + erf(x / sqrt(2))) / 2: p = the polynomial in |x| (Horner, one fma a step), its sign set to x's,
 * fl(fl(x fl(1 + p)) / 2). NaN for NaN and for either infinity (the constant polynomial times inf is 0 inf),
 * as torch gives. */
QRT_GATE_FN float qrt_gelu_onednn(float x) {
    const unsigned a = qrt_float_bits(x) & 0x7fffffffu;
    const int i = qrt_gelu_poly(a);
    const float ax = qrt_bits_float(a);
    float p = fmaf(qrt_gelu_coeffs[5][i], ax, qrt_gelu_coeffs[4][i]);
    p = fmaf(p, ax, qrt_gelu_coeffs[3][i]);
    p = fmaf(p, ax, qrt_gelu_coeffs[2][i]);
    p = fmaf(p, ax, qrt_gelu_coeffs[1][i]);
    p = fmaf(p, ax, qrt_gelu_coeffs[0][i]);
    p = qrt_bits_float(qrt_float_bits(p) ^ (qrt_float_bits(x) & 0x80000000u));
    return x * (p + 1.0f) * 0.5f;
}

#endif /* QRT_TORCH_GELU_H */
