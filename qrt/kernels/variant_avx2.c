/* x86-64 with AVX2, FMA and F16C (Haswell, Zen and later). */
#if defined(__x86_64__) || defined(_M_X64)
#include "common.h"

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include "isa/f16_avx2.h"
#include "isa/i8_avx2.h"

#define QRT_VARIANT_ID avx2
#define QRT_VARIANT_NAME "avx2"
#include "variant.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
