/* u8 x s8 primitives, AVX-512 VNNI: 16 columns per register, one vpdpbusd per 4 k. */
#include <immintrin.h>
#define QRT_I8_ISA "avx512vnni"
#define I8_NR 64
#define I8_MR 6
#define I8_COLS 16
#define I8_ROW_NV 16 /* a one-row pass: 16 of the 32 registers, 256 columns */
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
