/* The int8 multiply-add peak of this core's VNNI instructions: what no int8 product on it can beat.
 *
 *   cc -O2 -std=c11 bench/vnni_peak.c -o /tmp/vnni_peak && taskset -c 1 /tmp/vnni_peak
 *
 * vpdpbusd (u8 x s8, 4 products summed into each int32 lane) in 12 independent chains, inline assembly so that
 * the compiler cannot change it, on zmm (AVX-512 VNNI: 64 multiply-adds) and ymm (AVX-VNNI: 32) where the CPU
 * has them; core cycles counted against a chain of dependent adds (one cycle each), since the clock varies.
 * The whole-model floors in docs/PERFORMANCE.md divide a model's multiply-adds by the rate printed here.
 */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>

#include "cycles.h"

#if defined(__x86_64__)
#define CHAINS(REG) /* 12 vpdpbusd a run, REG31 x REG30 into REG0-11 */                                       \
    DP(REG, 0) DP(REG, 1) DP(REG, 2) DP(REG, 3) DP(REG, 4) DP(REG, 5) DP(REG, 6) DP(REG, 7) DP(REG, 8) DP(REG, 9) \
        DP(REG, 10) DP(REG, 11)
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

__attribute__((target("avx512f,avx512vnni"))) static void dp_zmm(void) {
#define DP(REG, a) "vpdpbusd %%" #REG "30, %%" #REG "31, %%" #REG #a "\n\t"
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile(CHAINS(zmm)::: CLOBBERS);
}

/* {vex}: AVX-VNNI's encoding, on ymm0-15 (the sources ymm14, ymm15) */
__attribute__((target("avxvnni"))) static void dp_ymm(void) {
#undef DP
#define DP(REG, a) "%{vex%} vpdpbusd %%" #REG "14, %%" #REG "15, %%" #REG #a "\n\t"
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile(CHAINS(ymm)::: CLOBBERS);
}

static void report(const char* what, int macs, double run, double cycle) {
    const double each = run / 12;
    printf("%-28s %.3f cycles each: %.1f multiply-adds a cycle, %.0f a ns\n", what, each / cycle, macs * cycle / each,
           macs / each * 1e-9);
}

int main(void) {
    const double cycle = best_of_3(add_chain) / 4;
    printf("core clock %.2f GHz (a chain of dependent adds)\n", 1e-9 / cycle);
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni"))
        report("vpdpbusd zmm (AVX-512 VNNI)", 64, best_of_3(dp_zmm), cycle);
    if (__builtin_cpu_supports("avxvnni"))
        report("vpdpbusd ymm (AVX-VNNI)", 32, best_of_3(dp_ymm), cycle);
    return 0;
}
#else
int main(void) {
    puts("x86-64 only");
    return 0;
}
#endif
