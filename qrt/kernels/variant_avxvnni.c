/* x86-64 with AVX-VNNI, AVX2, FMA and F16C but not AVX-512 (Alder Lake and later client cores, Zen 5
 * mobile; Sapphire Rapids has both and runs avx512-vnni): the AVX2 variant with vpdpbusd for int8. */
#if defined(__x86_64__) || defined(_M_X64)
#include "common.h"

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avxvnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avxvnni,avx2,fma,f16c")
#endif

#include "isa/f16_avx2.h"
#include "isa/i8_avxvnni.h"

#define QRT_VARIANT_ID avx_vnni
#define QRT_VARIANT_NAME "avx-vnni"
#include "variant.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
