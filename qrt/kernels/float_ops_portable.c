/* The float ops in plain C for any CPU of the architecture (float_ops.h), and the choice of table.
 * On aarch64 this is the only table: NEON and fused multiply-add are part of ARMv8.0. */
#define QRT_FLOAT_OPS_ID portable
#define QRT_FLOAT_OPS_NAME "portable"
#include "float_ops_body.h"
#include "attention_body.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
extern const qrt_float_ops qrt_float_ops_fma, qrt_float_ops_avx512;
#endif

const qrt_float_ops* qrt_float_ops_for(const char* kernel_variant) {
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(kernel_variant, "avx512-vnni") == 0 || strcmp(kernel_variant, "amx-int8") == 0)
        return &qrt_float_ops_avx512; /* amx-int8's CPUs run avx512-vnni's instructions (dispatch.c) */
    if (strcmp(kernel_variant, "portable") != 0)
        return &qrt_float_ops_fma;
#endif
    (void)kernel_variant;
    return &qrt_float_ops_portable;
}
