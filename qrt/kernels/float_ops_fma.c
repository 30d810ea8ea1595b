/* The float ops compiled for x86-64 with AVX2 and FMA (float_ops.h): the table of the avx2 and
 * avx512-vnni kernel variants, whose CPUs have both. */
#if defined(__x86_64__) || defined(_M_X64)
#include "common.h"

#include <immintrin.h> /* before the target pragma, as the variant files: torch_gelu_avx*.h use it */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#define QRT_FLOAT_OPS_ID fma
#define QRT_FLOAT_OPS_NAME "fma"
#include "torch_gelu_avx2.h"
#define QRT_GELU_ROW qrt_gelu_row_avx2
#include "torch_exp_avx2.h"
#define QRT_EXP_ROWS qrt_exp_rows
#include "float_ops_body.h"
#include "attention_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
