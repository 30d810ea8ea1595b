/* float x float16 primitives, AVX2 + FMA + F16C: 8 columns per register, weights widened on the fly. */
#include <immintrin.h>
#define QRT_F16_ISA "avx2-fma-f16c"
#define F_NR 16
#define F_MR 6
#define F_LANES 8
#define F_ROW_NV 8 /* a one-row pass: 8 chains of the 16 registers, 64 columns */
typedef __m256 f_vec;
#define F_ZERO() _mm256_setzero_ps()
#define F_LOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
#define F_LOADF(p) _mm256_loadu_ps(p)
#define F_SET1(v) _mm256_set1_ps(v)
#define F_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define F_ADD(a, b) _mm256_add_ps((a), (b))
#define F_STORE(out, v) _mm256_storeu_ps((out), (v))
#define F_LOADC(p) _mm256_loadu_ps(p)
