/* x86-64 with AMX-INT8 and the AVX-512 of avx512-vnni (Sapphire Rapids, Granite Rapids and later): the
 * avx512-vnni variant whose int8 product runs whole tiles of 16 rows on AMX (gemm_i8_amx.h). */
#include "qrt_kernels.h"
#if defined(QRT_HAVE_AMX)
#include "common.h"

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                                      \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"))),     \
    apply_to = function)
#else
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,prefer-vector-width=512")
#endif

#include "isa/f16_avx512.h"
#include "isa/i8_amx.h"

#define QRT_VARIANT_ID amx_int8
#define QRT_VARIANT_NAME "amx-int8"
#include "variant.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
