/* aarch64, ARMv8.0 Advanced SIMD (every 64-bit ARM core: Cortex-A53, A72 of the Raspberry Pi 4). */
#if defined(__aarch64__)
#include "common.h"

#include "isa/f16_neon.h"
#include "isa/i8_neon.h"

#define QRT_VARIANT_ID neon
#define QRT_VARIANT_NAME "neon"
#include "variant.h"
#endif
