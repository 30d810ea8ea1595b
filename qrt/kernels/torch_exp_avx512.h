/* torch_exp_rows.h's softmax exp in 16-float registers: included by float_ops_avx512.c, under its target pragma. */
#include <immintrin.h>

#define E_VEC __m512
#define E_LANES 16
#define E_LOAD _mm512_loadu_ps
#define E_STORE _mm512_storeu_ps
#define E_SET1 _mm512_set1_ps
#define E_ADD _mm512_add_ps
#define E_SUB _mm512_sub_ps
#define E_MUL _mm512_mul_ps
#define E_FMA _mm512_fmadd_ps
#define E_FNMA _mm512_fnmadd_ps
#define E_MIN _mm512_min_ps
#define E_MAX _mm512_max_ps
#define E_FLOOR(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define E_POW2(fx, x, lo)                                                                                         \
    _mm512_castsi512_ps(_mm512_maskz_slli_epi32(                                                                 \
        _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ),                                                                  \
        _mm512_add_epi32(_mm512_cvttps_epi32(_mm512_sub_ps(fx, _mm512_set1_ps(1.0f))), _mm512_set1_epi32(127)), \
        23))
#include "torch_exp_rows.h"
