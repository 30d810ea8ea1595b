/* u8 x s8 primitives, AVX2, in two flavours over one packing (panels of 16 columns, tiles of 4 rows):
 *   exact (any activations): bytes widened to int16, pairs summed exactly by vpmaddwd;
 *   u7 (activations <= 128): vpmaddubsw, twice the products per instruction, as fbgemm. */
#include <immintrin.h>

#include "requantize_avx2.h"
#define QRT_I8_ISA "avx2"
#define I8_NR 16
#define I8_MR 6
#define I8_COLS 4
#define I8_ROW_NV 8 /* a one-row pass: 8 sums, with the widened weights and x beside them */
#define I8_ROWS 2 /* 4 accumulators a row: 2 rows keep all of a tile's live values in the 16 registers */
#define I8_XBIAS 0
typedef __m256i i8_acc;
typedef __m256i i8_w;
typedef __m256i i8_x;
/* 4 columns x 4 k of s8 widened to 16 int16; x's 4 bytes widened and repeated to match.
 * vpmaddwd then sums pairs exactly (2 * 255 * 128 < 2^31): lane 2c + h holds column c, k pair h.
 * (vpmaddubsw would saturate the pair sums to int16 with 8-bit activations.) */
#define I8_LOADW(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p)))
#define I8_SETX(word) _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128((int)(word))))
#define I8_DOT(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
/* 4 partial sums back into pair form: (c, 0) per column */
#define I8_LOADC(p) _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(p)))
#define I8_OFFSET(p, f) _mm256_cvtepu32_epi64(_mm_mullo_epi32(_mm_loadu_si128((const __m128i*)(p)), _mm_set1_epi32(f)))
#define I8_ADD(a, b) _mm256_add_epi32((a), (b)) /* pair forms add lane by lane */
QRT_INLINE void I8_STORE(int32_t* out, i8_acc acc) {
    int32_t pairs[8];
    _mm256_storeu_si256((__m256i*)pairs, acc);
    for (int c = 0; c < 4; c++)
        out[c] = (int32_t)((uint32_t)pairs[2 * c] + (uint32_t)pairs[2 * c + 1]);
}

/* vpmaddubsw sums two u8 x s8 products into int16 with saturation; with x <= 128 the sum lies in
 * [2 * 128 * -128, 2 * 128 * 127] = [-32768, 32512], so it never saturates. vpmaddwd by ones then
 * adds the two pairs of each column's 4 k into int32: 8 columns per register, like vpdpbusd. */
#define I8_U7_COLS 8
#define I8_U7_ROWS 6
#define I8_U7_ROW_NV 12 /* a one-row pass: 12 sums, x, the ones and a product in the 16 registers */
typedef __m256i i8u7_acc;
typedef __m256i i8u7_w;
typedef __m256i i8u7_x;
#define I8_U7_LOADW(p) _mm256_loadu_si256((const __m256i*)(p))
#define I8_U7_SETX(word) _mm256_set1_epi32((int)(word))
#define I8_U7_DOT(acc, x, w) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((x), (w)), _mm256_set1_epi16(1)))
#define I8_U7_STORE(out, acc) _mm256_storeu_si256((__m256i*)(out), (acc))
#define I8_U7_LOADC(p) _mm256_loadu_si256((const __m256i*)(p))
#define I8_U7_OFFSET(p, f) _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(p)), _mm256_set1_epi32(f))
#define I8_U7_ADD(a, b) _mm256_add_epi32((a), (b))
