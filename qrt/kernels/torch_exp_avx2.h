/* torch_exp_rows.h's softmax exp in 8-float registers: included by float_ops_fma.c, under its target pragma. */
#include <immintrin.h>

#define E_VEC __m256
#define E_LANES 8
#define E_LOAD _mm256_loadu_ps
#define E_STORE _mm256_storeu_ps
#define E_SET1 _mm256_set1_ps
#define E_ADD _mm256_add_ps
#define E_SUB _mm256_sub_ps
#define E_MUL _mm256_mul_ps
#define E_FMA _mm256_fmadd_ps
#define E_FNMA _mm256_fnmadd_ps
#define E_MIN _mm256_min_ps
#define E_MAX _mm256_max_ps
#define E_FLOOR(v) _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define E_POW2(fx, x, lo)                                                                                          \
    _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_NLT_UQ),                                                              \
                  _mm256_castsi256_ps(_mm256_slli_epi32(                                                          \
                      _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_sub_ps(fx, _mm256_set1_ps(1.0f))),              \
                                       _mm256_set1_epi32(127)),                                                   \
                      23)))
#include "torch_exp_rows.h"
