/* u8 x s8 primitives, AVX-VNNI (Alder Lake, Sapphire Rapids, Zen 5): the 256-bit vpdpbusd, 8 columns
 * of 4 k per register, summed into int32 without saturation, so one flavour is exact for any u8. */
#include <immintrin.h>

#include "range_avx2.h"
#include "requantize_avx2.h"
#define QRT_I8_ISA "avx-vnni"
#define I8_NR 16
#define I8_MR 6 /* 6 rows x 2 registers: 12 accumulators, 2 weights and a broadcast in the 16 registers */
#define I8_COLS 8
#define I8_ROW_NV 12 /* a one-row pass: 12 of the 16 registers, 96 columns */
#define I8_XBIAS 0
typedef __m256i i8_acc;
typedef __m256i i8_w;
typedef __m256i i8_x;
#define I8_LOADW(p) _mm256_loadu_si256((const __m256i*)(p))
#define I8_SETX(word) _mm256_set1_epi32((int)(word))
#define I8_DOT(acc, x, w) _mm256_dpbusd_avx_epi32((acc), (x), (w))
#define I8_STORE(out, acc) _mm256_storeu_si256((__m256i*)(out), (acc))
#define I8_LOADC(p) _mm256_loadu_si256((const __m256i*)(p))
#define I8_OFFSET(p, f) _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(p)), _mm256_set1_epi32(f))
#define I8_ADD(a, b) _mm256_add_epi32((a), (b))

/* The dynamic linear's epilogue (gemm_i8.h's qrt_dequantize_row) on one accumulator, 8 columns:
 * y = fma(fl(acc), scale, bias) (i8_out's tables), or fl(fl(acc) * scale) + bias where separate (qnnpack's), then
 * +0.0 where y < 0 under relu (torch.relu: -0.0 and NaN kept); the first `lanes` stored */
#define I8_DEQUANTIZE i8_dequantize
QRT_INLINE void i8_dequantize(float* y, __m256i acc, const float* scale, const float* bias, int separate, int relu,
                              int lanes) {
    const __m256 a = _mm256_cvtepi32_ps(acc), s = _mm256_loadu_ps(scale), b = _mm256_loadu_ps(bias);
    __m256 v = separate ? _mm256_add_ps(_mm256_mul_ps(a, s), b) : _mm256_fmadd_ps(a, s, b);
    if (relu)
        v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    if (lanes == 8)
        _mm256_storeu_ps(y, v);
    else
        _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                            v);
}
