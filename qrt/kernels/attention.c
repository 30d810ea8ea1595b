/* The choice of attention table (attention.h): the one compiled with the float ops' table that the
 * kernel variant runs (float_ops.h), so both always come from the same build. */
#include "attention.h"

#include <string.h>

#include "float_ops.h"

extern const qrt_attention_ops qrt_attention_ops_portable;
#if defined(__x86_64__) || defined(_M_X64)
extern const qrt_attention_ops qrt_attention_ops_fma, qrt_attention_ops_avx512;
#endif

const qrt_attention_ops* qrt_attention_ops_for(const char* kernel_variant) {
    const char* build = qrt_float_ops_for(kernel_variant)->name;
#if defined(__x86_64__) || defined(_M_X64)
    if (strcmp(build, qrt_attention_ops_avx512.name) == 0)
        return &qrt_attention_ops_avx512;
    if (strcmp(build, qrt_attention_ops_fma.name) == 0)
        return &qrt_attention_ops_fma;
#endif
    (void)build;
    return &qrt_attention_ops_portable;
}
