/* gelu (the erf form) as torch 2.13 computes it on the CPU for float32: F.gelu hands a contiguous float tensor
 * of two or more elements to oneDNN (ideep eltwise_gelu_erf), whose JIT kernel on AVX-512 CPUs
 * (jit_uni_eltwise_injector's gelu_erf_minimax_approx) evaluates erf(x / sqrt(2)) as one of 24 degree-5
 * polynomials in |x| picked by |x|'s exponent and two leading mantissa bits, then x (1 + erf) / 2. Here the
 * same IEEE operations in portable C (each product fused where the kernel fuses it, explicit fmaf), so every
 * qrt build and the GPU (qrt/cuda/float_ops.cu) give torch's bits: equal to torch 2.13 on all 2^32 float32
 * inputs (NaN as NaN), on an AVX-512 Xeon (docs/NUMERICS.md, section 8). */
#ifndef QRT_TORCH_GELU_H
#define QRT_TORCH_GELU_H

#include "gate_math.h"

#define QRT_GELU_POLYS 24

/* gelu_erf_minimax_pol's coefficients by degree (0 to 5), polynomials 1 to 24 (the kernel's index 0 is never
 * taken: its index is clamped to [1, 24]); the bits of oneDNN's table */
#if defined(__CUDACC__)
__device__
#endif
static const unsigned qrt_gelu_coeffs[6][QRT_GELU_POLYS] = {
    {0x32827792, 0x3381cc0c, 0x34523d4a, 0x351ac44d, 0x35f36d88, 0x36ee8229, 0x37b8a3bb, 0x3867a213,
     0x3940033b, 0x3a2a5a1d, 0x3ae35863, 0x3b7828f2, 0x3c08b14b, 0x3c515ed3, 0xbb503236, 0xbd8d8e5e,
     0xbe8abcd9, 0xbf0c19a2, 0xbeccb328, 0x3e176ced, 0x3f470d99, 0x3f7abb28, 0x3f800000, 0x00000000},
    {0x3f4c421f, 0x3f4c4207, 0x3f4c41cb, 0x3f4c413b, 0x3f4c3fad, 0x3f4c3a2f, 0x3f4c2d40, 0x3f4c146a,
     0x3f4bc341, 0x3f4ad08c, 0x3f48f8cf, 0x3f45fac7, 0x3f404e07, 0x3f3b980f, 0x3f48dff3, 0x3f78b21b,
     0x3fbb0704, 0x40019c32, 0x3fe536d6, 0x3f81331e, 0x3e6c8684, 0x3c98f936, 0x00000000, 0x3f800000},
    {0x3735e4cf, 0x37f2ff89, 0x388c23be, 0x3917535c, 0x39ab2ab0, 0x3a60fadb, 0x3af9b960, 0x3b6e5491,
     0x3c0a4ec5, 0x3ca5aa8c, 0x3d2138d9, 0x3d8737d4, 0x3ddfb660, 0x3e0f27ab, 0x3d94004b, 0xbe0efdeb,
     0xbf1d96c3, 0xbf89db58, 0xbf6d9897, 0xbef69fb8, 0xbdc4f8a8, 0xbbde6422, 0x00000000, 0x00000000},
    {0xbe084570, 0xbe08639b, 0xbe089837, 0xbe08f409, 0xbe09ab95, 0xbe0b66d0, 0xbe0e400a, 0xbe124df8,
     0xbe1bde02, 0xbe2f19c9, 0xbe4931bf, 0xbe685fbc, 0xbe89c95f, 0xbe96cbca, 0xbe8044aa, 0xbe0550f2,
     0x3dcfd6a1, 0x3e94c826, 0x3e79345f, 0x3decec91, 0x3ca46568, 0x3aa1e00a, 0x00000000, 0x00000000},
    {0x39f097a3, 0x3a5845dc, 0x3ab1fa35, 0x3b0cefb8, 0x3b653ab6, 0x3bcae527, 0x3c221712, 0x3c6c5840,
     0x3cc0a703, 0x3d1dcc19, 0x3d63656d, 0x3d955907, 0x3dbf9910, 0x3dd53f69, 0x3db7dcef, 0x3d639ebe,
     0xba6ede48, 0xbd22be69, 0xbd041cf1, 0xbc64f5ab, 0xbb097a32, 0xb8ebf380, 0x00000000, 0x00000000},
    {0x3c9b6050, 0x3c978d11, 0x3c92e850, 0x3c8d058b, 0x3c848454, 0x3c6cd623, 0x3c4c824b, 0x3c2a7935,
     0x3be0b390, 0x3b0651ac, 0xbb232f53, 0xbbd42fa0, 0xbc2c5366, 0xbc492c9e, 0xbc2a7aa6, 0xbbd55d04,
     0xba823a76, 0x3b102aa8, 0x3ae25a7e, 0x3a31f792, 0x38b84375, 0x3689bb5a, 0x00000000, 0x00000000},
};

/* The polynomial's row (0 to 23) for |x|'s bits a: the kernel adds 0xc21fffff to the bits, shifts right by 21
 * (two mantissa bits per exponent) and clamps to [1, 24]; above 0x1.62b9dcp2 (where erf rounds to 1) it takes
 * polynomial 23, the constant 1; NaN stays on 24, which gives NaN. */
QRT_GATE_FN int qrt_gelu_poly(unsigned a) {
    int i = a < 0x3de00001u ? 1 : (int)((a - 0x3de00001u) >> 21);
    i = i < 1 ? 1 : (i > QRT_GELU_POLYS ? QRT_GELU_POLYS : i);
    return (qrt_bits_float(0x40b15ceeu) < qrt_bits_float(a) ? 23 : i) - 1;
}

/* x (1 + erf(x / sqrt(2))) / 2: p = the polynomial in |x| (Horner, one fma a step), its sign set to x's,
 * fl(fl(x fl(1 + p)) / 2). NaN for NaN and for either infinity (the constant polynomial times inf is 0 inf),
 * as torch gives. */
QRT_GATE_FN float qrt_gelu_onednn(float x) {
    const unsigned a = qrt_float_bits(x) & 0x7fffffffu;
    const int i = qrt_gelu_poly(a);
    const float ax = qrt_bits_float(a);
    float p = qrt_bits_float(qrt_gelu_coeffs[5][i]);
    p = fmaf(p, ax, qrt_bits_float(qrt_gelu_coeffs[4][i]));
    p = fmaf(p, ax, qrt_bits_float(qrt_gelu_coeffs[3][i]));
    p = fmaf(p, ax, qrt_bits_float(qrt_gelu_coeffs[2][i]));
    p = fmaf(p, ax, qrt_bits_float(qrt_gelu_coeffs[1][i]));
    p = fmaf(p, ax, qrt_bits_float(qrt_gelu_coeffs[0][i]));
    p = qrt_bits_float(qrt_float_bits(p) ^ (qrt_float_bits(x) & 0x80000000u));
    return x * (p + 1.0f) * 0.5f;
}

#endif /* QRT_TORCH_GELU_H */
