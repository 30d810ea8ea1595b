/* range_body.h's range of the activations in 16-float registers (avx512-vnni, amx-int8). */
#define R_VEC __m512
#define R_LANES 16
#define R_LOAD _mm512_loadu_ps
#define R_STORE _mm512_store_ps
#define R_SET1 _mm512_set1_ps
#define R_MIN _mm512_min_ps
#define R_MAX _mm512_max_ps
#define R_FMA _mm512_fmadd_ps
#define R_ADD _mm512_add_ps
#include "range_body.h"
