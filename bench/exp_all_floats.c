/* qrt_exp_rounded (qrt/kernels/torch_exp.h), the exp of attention's softmax tail, against exp correctly rounded
 * to float, on every float32 bit pattern (or every STEP-th): expl (x87's 64-bit mantissa) rounded to float, and
 * NaN for NaN. Prints the first mismatches and their count; exits 1 if there is one.
 *
 *   cc -O2 -mfma -ffp-contract=off -fno-trapping-math -std=gnu11 -I qrt/kernels bench/exp_all_floats.c \
 *      -o /tmp/exp_all_floats -lm
 *   /tmp/exp_all_floats [STEP]    # x86-64 (expl's 64-bit mantissa); STEP 1 (the default) takes ~8 min, most
 *                                 # of it in expl; STEP 16 ~30 s
 *
 * Found with it: Taylor to r^6 on |r| <= ln2 / 64 matches on every float; to r^5 it misses two
 * (-0x1.e1dbe2p-8 and -0x1.d2259ap+3, each one ulp low).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torch_exp.h"

int main(int argc, char** argv) {
    const uint64_t step = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    uint64_t checked = 0, wrong = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += step) {
        const uint32_t bits = (uint32_t)u;
        float x, want;
        memcpy(&x, &bits, sizeof x);
        const float got = qrt_exp_rounded(x);
        want = (float)expl((long double)x);
        const int same = x != x ? got != got : memcmp(&got, &want, sizeof got) == 0;
        checked++;
        if (!same && wrong++ < 10)
            printf("x = %a: %a, correctly rounded %a\n", x, got, want);
    }
    printf("%llu floats checked, %llu differ\n", (unsigned long long)checked, (unsigned long long)wrong);
    return wrong != 0;
}
