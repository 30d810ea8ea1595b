/* x86-64 with AVX2, FMA and F16C (Haswell, Zen and later). */
#if defined(__x86_64__) || defined(_M_X64)
#pragma GCC target("avx2,fma,f16c")
#include "common.h"

#include "isa/f16_avx2.h"
#include "isa/i8_avx2.h"

#define QRT_VARIANT_ID avx2
#define QRT_VARIANT_NAME "avx2"
#include "variant.h"
#endif
