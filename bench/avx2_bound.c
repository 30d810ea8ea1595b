/* How close qrt's AVX2 int8 product is to what AVX2 itself allows on this core.
 *
 *   cc -O3 -ffp-contract=off -std=c11 -I qrt/kernels bench/avx2_bound.c qrt/kernels/*.c -o /tmp/avx2_bound -lm
 *   /tmp/avx2_bound 512 256 256    # m k n: the int8 product to time (x of at most 7 bits, as torch's)
 *
 * Without VNNI, 32 int8 multiply-adds take one group: vpmaddubsw (u8 x s8 pairs to int16), vpmaddwd by
 * ones (int16 pairs to int32), vpaddd; fbgemm's AVX2 kernels issue the same. The bound is the cycles a
 * group takes when nothing else runs, in independent chains (inline assembly: the compiler cannot
 * change it); beside it, one widening that needs no second multiply (vpxor of 0x8000 and vpsrad: the
 * low and high int16 halves summed apart, exact modulo 2^32), to show whether it would pay. Core
 * cycles are counted against a chain of dependent adds (one cycle each), since the clock varies.
 * qrt: the avx2 variant's product, float epilogue, weights from cache, one thread, best of 7.
 */
#define _POSIX_C_SOURCE 200112L
#include "cycles.h"
#include "layout.h"
#include "qrt_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
/* 4 groups a run: ymm15 x ymm14 into ymm0-3, widened by ones (ymm13), added to ymm4-7 */
__attribute__((target("avx2"))) static void madd_groups(void) {
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile(
#define GROUP(t, acc) \
    "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n\tvpmaddwd %%ymm13, %%ymm" #t ", %%ymm" #t "\n\tvpaddd %%ymm" #t \
    ", %%ymm" #acc ", %%ymm" #acc "\n\t"
            GROUP(0, 4) GROUP(1, 5) GROUP(2, 6) GROUP(3, 7)
#undef GROUP
            ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
}

/* 4 groups a run with one multiply each: low halves (xor 0x8000, ymm13) summed into ymm4-7, high
 * halves (vpsrad 16) into ymm8-11 */
__attribute__((target("avx2"))) static void xor_groups(void) {
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile(
#define GROUP(t, lo, hi)                                                                                        \
    "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #t "\n\tvpxor %%ymm13, %%ymm" #t ", %%ymm12\n\tvpaddd %%ymm12, %%ymm" #lo \
    ", %%ymm" #lo "\n\tvpsrad $16, %%ymm" #t ", %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #hi ", %%ymm" #hi "\n\t"
            GROUP(0, 4, 8) GROUP(1, 5, 9) GROUP(2, 6, 10) GROUP(3, 7, 11)
#undef GROUP
            ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12");
}

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s m k n\n", argv[0]);
        return 2;
    }
    const ptrdiff_t m = atol(argv[1]), k = atol(argv[2]), n = atol(argv[3]);
    const qrt_kernels* kern = qrt_kernels_named("avx2");
    if (!kern || m < 1 || k < 1 || n < 1) {
        fprintf(stderr, "needs m, k, n >= 1 and a CPU that runs the avx2 variant\n");
        return 2;
    }
    const double hz = 4.0 / best_of_3(add_chain);
    const double madd = best_of_3(madd_groups) * hz / 4.0, xor = best_of_3(xor_groups) * hz / 4.0;

    const ptrdiff_t panels = (n + kern->i8_nr - 1) / kern->i8_nr;
    int8_t* w = malloc((size_t)(n * k));
    int8_t* packed = aligned_alloc(64, (size_t)(qrt_i8_packed_size(n, k) + 63) / 64 * 64);
    uint8_t* x = malloc((size_t)(m * k));
    uint8_t* xp = aligned_alloc(64, (size_t)(kern->i8_packed_x_size(m, k) + 63) / 64 * 64);
    int32_t* rowsum = calloc((size_t)qrt_round_up(n, QRT_I8_NPAD), 4); /* zero past n, as the product reads */
    float *y = malloc((size_t)(m * n) * 4), *scale = malloc((size_t)n * 4);
    for (ptrdiff_t i = 0; i < n * k; i++)
        w[i] = (int8_t)(i * 37);
    for (ptrdiff_t i = 0; i < m * k; i++)
        x[i] = (uint8_t)(i * 11 % 128);
    for (ptrdiff_t j = 0; j < n; j++)
        scale[j] = 1e-3f;
    qrt_i8_pack(w, n, k, packed);
    qrt_epilogue e;
    memset(&e, 0, sizeof e);
    e.y = y;
    e.x_scale = 1.0f;
    e.w_scale = scale;
    const int reps = (int)(2e9 / (double)(m * n * k)) + 1;
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        const double t = now();
        for (int r = 0; r < reps; r++) {
            const int small = kern->i8_pack_x(x, m, k, xp) <= 128;
            kern->gemm_u8s8(xp, 3, rowsum, packed, NULL, NULL, n, k, 0, m, 0, panels, small, 0, &e);
        }
        const double s = (now() - t) / reps;
        best = s < best ? s : best;
    }
    const double groups = (double)m * (double)n * (double)((k + 3) / 4 * 4) / 32.0;
    printf("core clock %.2f GHz (dependent adds)\n", hz / 1e9);
    printf("bound: vpmaddubsw + vpmaddwd + vpaddd  %.2f cycles a group of 32 multiply-adds\n", madd);
    printf("       one multiply (vpxor, vpsrad)    %.2f cycles a group\n", xor);
    printf("qrt avx2 m=%td k=%td n=%td: %.1f us, %.2f cycles a group: %.0f%% of the bound\n", m, k, n, best * 1e6,
           best * hz / groups, 100.0 * madd / (best * hz / groups));
    return 0;
}
#else
int main(void) {
    fprintf(stderr, "x86-64 only\n");
    return 2;
}
#endif
