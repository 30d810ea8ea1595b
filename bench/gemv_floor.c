/* How close qrt's one-row int8 product (a recurrent step at batch 1) is to what the core can stream.
 *
 *   cc -O3 -ffp-contract=off -std=c11 -I qrt/kernels bench/gemv_floor.c qrt/kernels/*.c -o /tmp/gemv_floor -lm
 *   /tmp/gemv_floor 256 1024     # k n: the hidden-to-hidden product of an LSTM with hidden 256
 *   /tmp/gemv_floor 256 1024 avx2  # ... with a kernel variant this CPU runs, instead of the best
 *
 * floor: the same number of weight bytes read once each, straight through, by one vpdpbusd per
 * 64 bytes into eight independent sums: no packing, no epilogue; what the cache level holding the
 * weights delivers to one core (AVX-512 VNNI machines only). qrt: the int8 product of the kernel
 * variant dispatch picks (qrt_kernels_best) or the one named, on one row, float epilogue, one thread.
 * Best of 7 timings of many repetitions each (the weights stay wherever they settled).
 */
#define _POSIX_C_SOURCE 200112L
#include "clock.h"
#include "layout.h"
#include "qrt_kernels.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f,avx512vnni"))) static double stream_floor(const int8_t* w, size_t bytes, int reps) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    const __m512i x = _mm512_set1_epi32(0x01020304);
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        double t = now();
        for (int r = 0; r < reps; r++)
            for (size_t o = 0; o + 512 <= bytes; o += 512) {
                s0 = _mm512_dpbusd_epi32(s0, x, _mm512_load_si512(w + o));
                s1 = _mm512_dpbusd_epi32(s1, x, _mm512_load_si512(w + o + 64));
                s2 = _mm512_dpbusd_epi32(s2, x, _mm512_load_si512(w + o + 128));
                s3 = _mm512_dpbusd_epi32(s3, x, _mm512_load_si512(w + o + 192));
                s4 = _mm512_dpbusd_epi32(s4, x, _mm512_load_si512(w + o + 256));
                s5 = _mm512_dpbusd_epi32(s5, x, _mm512_load_si512(w + o + 320));
                s6 = _mm512_dpbusd_epi32(s6, x, _mm512_load_si512(w + o + 384));
                s7 = _mm512_dpbusd_epi32(s7, x, _mm512_load_si512(w + o + 448));
            }
        t = (now() - t) / reps;
        best = t < best ? t : best;
    }
    __m512i all = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3)),
                                   _mm512_add_epi32(_mm512_add_epi32(s4, s5), _mm512_add_epi32(s6, s7)));
    volatile int sink = _mm512_reduce_add_epi32(all); /* keeps the sums alive */
    (void)sink;
    return best;
}
#endif

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s k n [kernel variant]\n", argv[0]);
        return 2;
    }
    const qrt_kernels* kern = qrt_kernels_best();
    if (argc == 4) { /* a variant by name (it must run on this CPU) */
        kern = qrt_kernels_named(argv[3]);
        if (!kern) {
            fprintf(stderr, "no runnable kernel variant %s\n", argv[3]);
            return 2;
        }
    }
    const ptrdiff_t k = atol(argv[1]), n = atol(argv[2]), panels = (n + kern->i8_nr - 1) / kern->i8_nr;
    const size_t bytes = (size_t)qrt_i8_packed_size(n, k);
    int8_t* w = malloc((size_t)(n * k));
    int8_t* packed = aligned_alloc(64, bytes);
    uint8_t* x = malloc((size_t)k);
    uint8_t* xp = aligned_alloc(64, (size_t)((kern->i8_packed_x_size(1, k) + 63) / 64 * 64));
    int32_t* rowsum = calloc((size_t)qrt_round_up(n, QRT_I8_NPAD), 4); /* zero past n, as the product reads */
    float *y = malloc((size_t)n * 4), *scale = malloc((size_t)n * 4);
    for (ptrdiff_t i = 0; i < n * k; i++)
        w[i] = (int8_t)(i * 37);
    for (ptrdiff_t i = 0; i < k; i++)
        x[i] = (uint8_t)(i * 11);
    for (ptrdiff_t j = 0; j < n; j++)
        scale[j] = 1e-3f;
    qrt_i8_pack(w, n, k, packed);
    const int small_x = kern->i8_pack_x(x, 1, k, xp) <= 128, plain = k % 4 == 0; /* one row: read as it is */
    qrt_epilogue e = {0};
    e.y = y;
    e.x_scale = 1.0f;
    e.w_scale = scale;
    const int reps = (int)(2e9 / (double)(n * k)) + 1;
    double best = 1e30;
    for (int trial = 0; trial < 7; trial++) {
        double t = now();
        for (int r = 0; r < reps; r++)
            kern->gemm_u8s8(plain ? x : xp, 3, rowsum, packed, NULL, NULL, n, k, 0, 1, 0, panels, small_x, plain, &e);
        t = (now() - t) / reps;
        best = t < best ? t : best;
    }
    printf("k=%td n=%td (%zu KiB of packed weights), variant %s\n", k, n, bytes / 1024, kern->name);
    printf("  qrt one-row product: %8.2f us  %6.1f GB/s of weights\n", best * 1e6, (double)bytes / best / 1e9);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni")) {
        const double floor = stream_floor(packed, bytes, reps);
        printf("  streaming floor:     %8.2f us  %6.1f GB/s  (qrt at %.0f%% of it)\n", floor * 1e6,
               (double)bytes / floor / 1e9, 100.0 * floor / best);
        return 0;
    }
#endif
    printf("  streaming floor: needs AVX-512 VNNI\n");
    return 0;
}
