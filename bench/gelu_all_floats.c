/* gelu's register-table forms (qrt/kernels/torch_gelu_avx512.h, torch_gelu_avx2.h) against their oracle, the
 * scalar qrt_gelu_onednn (torch_gelu.h), on every float32 bit pattern (or every STEP-th), bit for bit with NaN
 * payloads; and the time of each form and of the scalar loop (GCC's bit selects, which both builds ran before)
 * compiled for each build's ISA, on a [128, 1536] tensor of N(0, 9) values (one thread, median of 15 calls).
 *
 *   cc -O3 -ffp-contract=off -fno-trapping-math -std=gnu11 -mavx2 -mfma -I qrt/kernels \
 *      bench/gelu_all_floats.c -o /tmp/gelu_all_floats -lm
 *   /tmp/gelu_all_floats [STEP]    # needs an AVX-512 CPU; STEP 1 (the default) takes ~30 s
 *
 * As in float_ops_fma.c and float_ops_avx512.c, the AVX2 code is compiled for AVX2 and FMA only and the AVX-512
 * code under a target pragma.
 */
#define _POSIX_C_SOURCE 200112L
#include "clock.h"
#include "common.h"
#include "torch_gelu_avx2.h"

__attribute__((noinline)) static void gelu_scalar_avx2(const float* restrict x, float* restrict y, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++)
        y[i] = qrt_gelu_onednn(x[i]);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,prefer-vector-width=512")
#include "torch_gelu_avx512.h"

__attribute__((noinline)) static void gelu_scalar(const float* restrict x, float* restrict y, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++)
        y[i] = qrt_gelu_onednn(x[i]);
}
#pragma GCC pop_options

#include <stdio.h>
#include <stdlib.h>

#define CHUNK (1 << 20)

typedef void (*gelu_row)(const float* restrict, float* restrict, ptrdiff_t);

/* mismatches of f against the oracle (the scalar loop of the avx512 build) over every step-th bit pattern, in chunks of odd lengths (the tails) */
static unsigned long long mismatches(gelu_row f, const char* name, unsigned step) {
    static float x[CHUNK], want[CHUNK], got[CHUNK];
    unsigned long long bad = 0;
    for (unsigned long long base = 0; base < (1ull << 32); base += (unsigned long long)CHUNK * step) {
        const ptrdiff_t n = CHUNK - (ptrdiff_t)(base / ((unsigned long long)CHUNK * step) % 17);
        for (ptrdiff_t i = 0; i < n; i++) {
            const unsigned b = (unsigned)(base + (unsigned long long)i * step);
            memcpy(&x[i], &b, 4);
        }
        gelu_scalar(x, want, n);
        f(x, got, n);
        for (ptrdiff_t i = 0; i < n; i++)
            if (memcmp(&want[i], &got[i], 4) != 0 && bad++ < 5) {
                unsigned xb, wb, gb;
                memcpy(&xb, &x[i], 4), memcpy(&wb, &want[i], 4), memcpy(&gb, &got[i], 4);
                printf("%s: x %08x want %08x got %08x\n", name, xb, wb, gb);
            }
    }
    return bad;
}

static int by_value(const void* a, const void* b) {
    const double u = *(const double*)a, v = *(const double*)b;
    return (u > v) - (u < v);
}

static double ns_per_element(gelu_row f, const float* x, float* y, ptrdiff_t n) {
    double t[15];
    for (int r = 0; r < 15; r++) {
        const double t0 = now();
        f(x, y, n);
        t[r] = (now() - t0) * 1e9 / (double)n;
    }
    qsort(t, 15, sizeof t[0], by_value);
    return t[7];
}

int main(int argc, char** argv) {
    const unsigned step = argc > 1 ? (unsigned)atoi(argv[1]) : 1u;
    const unsigned long long bad512 = mismatches(qrt_gelu_row_avx512, "avx512", step);
    const unsigned long long bad2 = mismatches(qrt_gelu_row_avx2, "avx2", step);
    printf("every %u-th float32: avx512 %llu mismatches, avx2 %llu\n", step, bad512, bad2);
    const ptrdiff_t n = 128 * 1536;
    float* x = malloc((size_t)n * sizeof(float));
    float* y = malloc((size_t)n * sizeof(float));
    srand(1);
    for (ptrdiff_t i = 0; i < n; i++) { /* a sum of 12 uniforms: near N(0, 1), times 3 */
        float u = 0.0f;
        for (int k = 0; k < 12; k++)
            u += (float)rand() / (float)RAND_MAX;
        x[i] = (u - 6.0f) * 3.0f;
    }
    printf("ns an element, [128, 1536]: avx512 build: scalar loop %.3f, table in registers %.3f; "
           "AVX2 build: scalar loop %.3f, table in registers %.3f\n",
           ns_per_element(gelu_scalar, x, y, n), ns_per_element(qrt_gelu_row_avx512, x, y, n),
           ns_per_element(gelu_scalar_avx2, x, y, n), ns_per_element(qrt_gelu_row_avx2, x, y, n));
    free(x);
    free(y);
    return bad512 || bad2;
}
