/* The float ops compiled for x86-64 with AVX-512 (float_ops.h): the table of the avx512-vnni kernel
 * variant, whose CPUs have it. Whole 512-bit registers, as that variant's own loops: the exp-based
 * ops are pure arithmetic, so each instruction does twice the work of the AVX2 build's. */
#if defined(__x86_64__) || defined(_M_X64)
#include "common.h"

#include <immintrin.h> /* before the target pragma, as the variant files: torch_gelu_avx*.h use it */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512")
#endif

#define QRT_FLOAT_OPS_ID avx512
#define QRT_FLOAT_OPS_NAME "avx512"
#define QRT_FLOAT_OPS_LANES_IN_ONE 1 /* a register holds the reductions' 16 lanes (float_ops_body.h) */
#include "torch_gelu_avx512.h"
#define QRT_GELU_ROW qrt_gelu_row_avx512
#include "torch_exp_avx512.h"
#define QRT_EXP_ROWS qrt_exp_rows
#include "float_ops_body.h"
#include "attention_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
