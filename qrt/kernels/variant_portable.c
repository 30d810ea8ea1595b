/* Plain C for any CPU of the architecture (x86-64 baseline SSE2, ARMv8.0): the fallback, and the
 * variant the stored reference outputs (tests/golden) were produced with. */
#include "common.h"

#include "isa/f16_portable.h"
#include "isa/i8_portable.h"

#define QRT_VARIANT_ID portable
#define QRT_VARIANT_NAME "portable"
#include "variant.h"
