/* x86-64 with AVX-512 F/BW/DQ/VL and VNNI (Cascade Lake, Ice Lake, Zen 4 and later). The loops the
 * compiler vectorises (gates, quantization) use whole 512-bit registers: they are pure arithmetic,
 * so full-width vectors do twice the work per instruction (GCC prefers 256 bits by default). */
#if defined(__x86_64__) || defined(_M_X64)
#include "common.h"

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,prefer-vector-width=512")
#endif

#include "isa/f16_avx512.h"
#include "isa/i8_avx512vnni.h"

#define QRT_VARIANT_ID avx512_vnni
#define QRT_VARIANT_NAME "avx512-vnni"
#include "variant.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
