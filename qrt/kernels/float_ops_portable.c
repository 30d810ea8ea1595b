/* The float ops in plain C for any CPU of the architecture (float_ops.h), and the choice of table.
 * On aarch64 this is the only table: NEON and fused multiply-add are part of ARMv8.0. */
#define QRT_FLOAT_OPS_ID portable
#define QRT_FLOAT_OPS_NAME "portable"
#include "float_ops_body.h"

#if defined(__x86_64__) || defined(_M_X64)
extern const qrt_float_ops qrt_float_ops_fma;
#endif

const qrt_float_ops* qrt_float_ops_for(int portable) {
#if defined(__x86_64__) || defined(_M_X64)
    if (!portable)
        return &qrt_float_ops_fma;
#endif
    (void)portable;
    return &qrt_float_ops_portable;
}
