/* u8 x s8 primitives, AVX-512 VNNI: 16 columns per register, one vpdpbusd per 4 k. */
#include <immintrin.h>

#include "range_avx512.h"
#ifndef QRT_I8_ISA /* isa/i8_amx.h: its own name and tile rows */
#define QRT_I8_ISA "avx512vnni"
#define I8_MR 6
#endif
#define I8_NR 64
#define I8_COLS 16
/* a one-row pass: 8 of the 32 registers, 128 columns (16 ran M=1 K=64 N=256 in 73-79 ns, 8 in 67-72: GCC kept
 * 16 strips' addresses in too few registers, spilling them in the loop) */
#define I8_ROW_NV 8
#define I8_XBIAS 0
/* One row (batch 1) reads its panels straight through, which the hardware prefetcher follows: software
 * prefetches only slowed it, 1.1-1.5x at every size from L2 to DRAM (Ice Lake, bench/gemv_floor.c).
 * The other variants keep them (docs/PERFORMANCE.md: they took AVX2's one-row product from DRAM 8.6 -> 22 GB/s). */
#define I8_ROW_PREFETCH 0
typedef __m512i i8_acc;
typedef __m512i i8_w;
typedef __m512i i8_x;
#define I8_LOADW(p) _mm512_loadu_si512((const void*)(p))
#define I8_SETX(word) _mm512_set1_epi32((int)(word))
/* vpdpbusd: 4 u8*s8 products (each fits int16) summed into each int32 lane, no saturation */
#define I8_DOT(acc, x, w) _mm512_dpbusd_epi32((acc), (x), (w))
#define I8_STORE(out, acc) _mm512_storeu_si512((void*)(out), (acc))
#define I8_LOADC(p) _mm512_loadu_si512((const void*)(p))
#define I8_OFFSET(p, f) _mm512_mullo_epi32(_mm512_loadu_si512((const void*)(p)), _mm512_set1_epi32(f))
#define I8_ADD(a, b) _mm512_add_epi32((a), (b))

/* The dynamic linear's epilogue (gemm_i8.h's qrt_dequantize_row) on one accumulator, 16 columns:
 * y = fma(fl(acc), scale, bias) (i8_out's tables), or fl(fl(acc) * scale) + bias where separate (qnnpack's), then
 * +0.0 where y < 0 under relu (torch.relu: -0.0 and NaN kept); the first `lanes` stored */
#define I8_DEQUANTIZE i8_dequantize
QRT_INLINE void i8_dequantize(float* y, __m512i acc, const float* scale, const float* bias, int separate, int relu,
                              int lanes) {
    const __m512 a = _mm512_cvtepi32_ps(acc), s = _mm512_loadu_ps(scale), b = _mm512_loadu_ps(bias);
    __m512 v = separate ? _mm512_add_ps(_mm512_mul_ps(a, s), b) : _mm512_fmadd_ps(a, s, b);
    if (relu)
        v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps());
    if (lanes == 16)
        _mm512_storeu_ps(y, v);
    else
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << lanes) - 1), v);
}

/* The static linear's requantization (gemm_i8.h's qrt_requantize_row) for 16 columns, each lane the same
 * operations in the same order: GCC's vectorisation of the C loop took 4 cycles an output here. */
#define I8_REQUANTIZE_COLS 16
QRT_INLINE void i8_requantize(const int32_t* a, const float* mult, const float* bias_q, const float* bias_t,
                              float bias_inv, int32_t zp, int32_t lo, uint8_t* out) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void*)a));
    if (bias_q)
        v = _mm512_add_ps(v, _mm512_loadu_ps(bias_q));
    else if (bias_t)
        v = _mm512_fmadd_ps(_mm512_loadu_ps(bias_t), _mm512_set1_ps(bias_inv), v);
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_loadu_ps(mult)), _MM_FROUND_CUR_DIRECTION);
    /* max(c, r) is r < c ? c : r, and min(c, r) is r > c ? c : r: both keep a NaN r, as the C does */
    r = _mm512_min_ps(_mm512_set1_ps(32767.0f), _mm512_max_ps(_mm512_set1_ps(-32768.0f), r));
    __m512i q = _mm512_add_epi32(_mm512_cvttps_epi32(r), _mm512_set1_epi32(zp));
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(lo)), _mm512_set1_epi32(255));
    _mm_storeu_si128((__m128i*)out, _mm512_cvtepi32_epi8(q)); /* values in [0, 255]: narrowing is exact */
}
