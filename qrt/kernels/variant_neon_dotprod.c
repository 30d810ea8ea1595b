/* aarch64 with the ARMv8.2 dot product instructions (Cortex-A55, A76, Neoverse N1 and later). */
#if defined(__aarch64__)
#pragma GCC target("arch=armv8.2-a+dotprod")
#include "common.h"

#include "isa/f16_neon.h"
#include "isa/i8_neon_dotprod.h"

#define QRT_VARIANT_ID neon_dotprod
#define QRT_VARIANT_NAME "neon-dotprod"
#include "variant.h"
#endif
