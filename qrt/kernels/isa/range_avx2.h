/* range_body.h's range of the activations in 8-float registers (avx2, avx-vnni). */
#define R_VEC __m256
#define R_LANES 8
#define R_LOAD _mm256_loadu_ps
#define R_STORE _mm256_store_ps
#define R_SET1 _mm256_set1_ps
#define R_MIN _mm256_min_ps
#define R_MAX _mm256_max_ps
#define R_FMA _mm256_fmadd_ps
#define R_ADD _mm256_add_ps
#include "range_body.h"
