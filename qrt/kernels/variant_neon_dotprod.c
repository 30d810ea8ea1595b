/* aarch64 with the ARMv8.2 dot product instructions (Cortex-A55, A76, Neoverse N1 and later). */
#include "qrt_kernels.h"
#if defined(QRT_HAVE_NEON_DOTPROD)
#include "common.h"

#include <arm_neon.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include "isa/f16_neon.h"
#include "isa/i8_neon_dotprod.h"

#define QRT_VARIANT_ID neon_dotprod
#define QRT_VARIANT_NAME "neon-dotprod"
#include "variant.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
