/* The amx-int8 product against the AMX unit's own ceiling, one thread: qrt's product (the variant's table entry,
 * a dynamic linear's float epilogue) of M x K x N in tasks of T rows, as the pool hands them out, on one copy of
 * the weights called again and again (warm) or on L copies in turn (past L2, as in a model); then tdpbusd on the
 * product's 2 x 2 block of tiles with x and the weights in L1 (the unit's rate with loads), and on registers alone.
 *
 *     cc -O3 -ffp-contract=off -std=c11 -pthread -I qrt/kernels bench/amx_product.c qrt/kernels/*.c \
 *         -o /tmp/amx_product -lm
 *     taskset -c 1 /tmp/amx_product 128 384 1152 32 8
 *
 * Arguments: M K N T L. Figures: the best of 7 rounds, microseconds a call and multiply-adds a nanosecond. */
#define _GNU_SOURCE
#include "clock.h"
#include "layout.h"
#include "qrt_kernels.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* ns per tdpbusd over `steps` blocks of the 2 x 2 tile block: loading x and weight tiles from 8 KiB in L1
 * (loads) or reusing the registers (no loads) */
__attribute__((target("amx-tile,amx-int8"))) static double tdpbusd_ns(const uint8_t* data, int loads) {
    tile_config cfg = {1, 0, {0}, {0}, {0}};
    for (int t = 0; t < 8; t++)
        cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_loadd(4, data, 64); /* tile numbers are immediates */
    _tile_loadd(5, data, 64);
    _tile_loadd(6, data, 64);
    _tile_loadd(7, data, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const long steps = 2000000;
    double t0 = now();
    for (long s = 0; s < steps; s++) {
        const uint8_t* b = data + (s % 2) * 4096;
        if (loads) {
            _tile_loadd(4, b, 64);
            _tile_loadd(6, b + 1024, 64);
            _tile_loadd(7, b + 2048, 64);
        }
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        if (loads)
            _tile_loadd(5, b + 3072, 64);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    const double ns = (now() - t0) / (double)steps / 4 * 1e9;
    _tile_release();
    return ns;
}

int main(int argc, char** argv) {
    if (argc != 6)
        return fprintf(stderr, "usage: %s M K N T L\n", argv[0]), 2;
    const int m = atoi(argv[1]), k = atoi(argv[2]), n = atoi(argv[3]), task = atoi(argv[4]), copies = atoi(argv[5]);
    const qrt_kernels* kern = qrt_kernels_named("amx-int8");
    if (kern == NULL || !qrt_kernels_runnable(kern))
        return fprintf(stderr, "amx-int8 does not run here\n"), 1;
    int8_t* w = malloc((size_t)n * k);
    int32_t* rowsum = calloc((size_t)qrt_round_up(n, QRT_I8_NPAD), sizeof(int32_t));
    for (long i = 0; i < (long)n * k; i++)
        w[i] = (int8_t)(rand() % 255 - 127), rowsum[i / k] += w[i];
    int8_t** packed = malloc(sizeof(int8_t*) * copies);
    for (int c = 0; c < copies; c++)
        qrt_i8_pack(w, n, k, packed[c] = aligned_alloc(64, (size_t)qrt_round_up(qrt_i8_packed_size(n, k), 64)));
    float* x = malloc(sizeof(float) * m * k);
    float *y = aligned_alloc(64, sizeof(float) * (size_t)qrt_round_up((ptrdiff_t)m * n, 16)), *ws = malloc(4 * n);
    for (long i = 0; i < (long)m * k; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int j = 0; j < n; j++)
        ws[j] = 1e-3f;
    uint8_t* xp = malloc((size_t)kern->i8_packed_x_size(m, k));
    kern->i8_quantize_pack_x(x, m, k, 200.0f, 128.0f, 0, xp);
    qrt_epilogue e;
    memset(&e, 0, sizeof e);
    e.y = y, e.x_scale = 0.01f, e.w_scale = ws, e.bias = ws;
    double best = 1e9;
    for (int round = 0; round < 7; round++) {
        const int calls = 400;
        double t0 = now();
        for (int r = 0; r < calls; r++)
            for (int i = 0; i < m; i += task)
                kern->gemm_u8s8(xp, 128, rowsum, packed[r % copies], NULL, NULL, n, k, i, i + task < m ? i + task : m, 0,
                                (n + kern->i8_nr - 1) / kern->i8_nr, 1, 0, &e);
        const double t = (now() - t0) / calls;
        best = t < best ? t : best;
    }
    printf("qrt %d x %d x %d, tasks of %d rows, %d weight copies: %.2f us, %.0f multiply-adds a ns\n", m, k, n, task,
           copies, best * 1e6, (double)m * k * n / best * 1e-9);
    uint8_t* data = aligned_alloc(64, 8192);
    for (int i = 0; i < 8192; i++)
        data[i] = (uint8_t)rand();
    for (int loads = 1; loads >= 0; loads--) {
        const double ns = tdpbusd_ns(data, loads);
        printf("tdpbusd, 2 x 2 tiles, %s: %.2f ns each, %.0f multiply-adds a ns\n", loads ? "loads from L1" : "registers",
               ns, 16 * 16 * 64 / ns);
    }
    return 0;
}
