/* float x float16 primitives, AVX-512F with F16C: 16 columns per register, weights widened on the fly. */
#include <immintrin.h>
#define QRT_F16_ISA "avx512f-f16c"
#define F_NR 32
#define F_MR 8
#define F_LANES 16
#define F_ROW_NV 4 /* a one-row pass: 4 chains, 64 columns; more strips streamed at once ran slower (Zen 4, M=1
                        * K=N=4096 against torch: 16 registers 0.64x, 8 0.88x, 4 0.96-1.01x) */
typedef __m512 f_vec;
#define F_ZERO() _mm512_setzero_ps()
#define F_LOADW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
#define F_LOADF(p) _mm512_loadu_ps(p)
#define F_SET1(v) _mm512_set1_ps(v)
#define F_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define F_ADD(a, b) _mm512_add_ps((a), (b))
#define F_STORE(out, v) _mm512_storeu_ps((out), (v))
#define F_LOADC(p) _mm512_loadu_ps(p)
