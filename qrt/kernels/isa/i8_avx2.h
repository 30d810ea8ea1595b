/* u8 x s8 primitives, AVX2, in two flavours over one packing (panels of 16 columns, tiles of 6 rows):
 *   exact (any activations): bytes widened to int16, pairs summed exactly by vpmaddwd; the weights widened in
 *     the loop, or once per panel slice where several row tiles share them (I8_WIDE, gemm_i8.h);
 *   u7 (activations <= 128): vpmaddubsw, twice the products per instruction, as fbgemm.
 * A pair of products of 8-bit activations (qnnpack's dynamic layers, static layers) needs 17 bits, past
 * vpmaddubsw's int16, so exact sums take a vpmaddwd and a vpaddd per 16 products where u7 takes vpmaddubsw,
 * vpmaddwd and vpaddd per 32: on a core with three vector ALU ports (Intel) exact can be no faster than 4/3
 * of u7's time; from widened weights and x it is about 1.5x, with in-loop widening (one row) about 1.7x
 * (docs/PERFORMANCE.md). Splitting x into a 7-bit and a 1-bit or two 4-bit vpmaddubsw streams, summed in
 * int16 between flushes, needs as many instructions and ran no faster (a one-row product, Sapphire Rapids). */
#include <immintrin.h>

#include "range_avx2.h"
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
/* x: a broadcast from memory, then one vpshufb puts byte t in word t of each 64 bits (-1 in the mask: a zero
 * byte), where a move to a vector, vpmovzxbw and vpbroadcastq took three port-5 shuffles */
#define I8_SETX(word)                                                                                               \
    _mm256_shuffle_epi8(_mm256_set1_epi32((int)(word)),                                                         \
                        _mm256_setr_epi8(0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, \
                                         -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1))
#define I8_DOT(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
/* The exact product from weights widened once per panel slice (gemm_i8.h, I8_WIDE): a plain load each, so a
 * row's 4 accumulators take one vpmaddwd and one vpaddd per 16 products, and no vpmovsxbw competes with the
 * x shuffles for port 5. 2 rows a call: with 3, GCC 12 kept each weight in a register for all 3 rows and
 * spilled accumulators (M=64 K=N=256: 100 us against 75). x comes widened to int16 once a call (i8_widen_x):
 * its 4 values a group are what vpmaddwd wants in each 64 bits, so one vpbroadcastq from memory (a load, no
 * ALU port) where I8_SETX's vpshufb took a port-5 slot per row and group (one thread, 2-vCPU Sapphire Rapids
 * VM, the product with its packing: M=64 K=N=256 73-75 -> 64 us, M=64 K=N=1024 1115-1136 -> 989-1018 us,
 * M=512 K=N=1024 9.2-9.5 -> 8.8 ms; against u7's time 1.61-1.67x -> 1.48-1.54x). */
#define I8_WIDE 1
#define I8_WIDE_ROWS 2
#define I8_WIDE_LOADW(p) _mm256_loadu_si256((const __m256i*)(p))
#define I8_WIDE_XWORD uint64_t
#define I8_WIDE_SETX(word) _mm256_set1_epi64x((long long)(word))
/* 4 partial sums back into pair form: (c, 0) per column */
#define I8_LOADC(p) _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(p)))
#define I8_OFFSET(p, f) _mm256_cvtepu32_epi64(_mm_mullo_epi32(_mm_loadu_si128((const __m128i*)(p)), _mm_set1_epi32(f)))
#define I8_ADD(a, b) _mm256_add_epi32((a), (b)) /* pair forms add lane by lane */
/* lane 2c + lane 2c + 1 (wrapping) into lane 2c, then lanes 0, 2, 4, 6 out: 3 instructions where GCC made a
 * loop over the lanes into some 20 extracts and inserts */
QRT_INLINE void I8_STORE(int32_t* out, i8_acc acc) {
    const __m256i sums = _mm256_add_epi32(acc, _mm256_srli_epi64(acc, 32));
    const __m256i even = _mm256_permutevar8x32_epi32(sums, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    _mm_storeu_si128((__m128i*)out, _mm256_castsi256_si128(even));
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
