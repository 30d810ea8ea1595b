/* The dynamic linear's range pass (the variant table's min_max: order keys, or the ISA's float compares of
 * isa/range_body.h) on n floats, every kernel variant this CPU runs; one thread, the best of 300 calls.
 *
 *   cc -O3 -ffp-contract=off -std=c11 -pthread -I qrt/kernels bench/range_pass.c qrt/kernels/*.c \
 *       -o /tmp/range_pass -lm
 *   taskset -c 1 /tmp/range_pass 49152 196608   # MiniLM's Linear inputs at 128 tokens: 128 x 384, 128 x 1536
 */
#define _GNU_SOURCE
#include "clock.h"
#include "qrt_kernels.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
    if (argc < 2)
        return fprintf(stderr, "usage: %s n [n ...]\n", argv[0]), 2;
    int count;
    const qrt_kernels* const* all = qrt_kernels_compiled(&count);
    for (int a = 1; a < argc; a++) {
        const ptrdiff_t n = atol(argv[a]);
        float* x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
        for (ptrdiff_t i = 0; i < n; i++)
            x[i] = (float)rand() / (float)RAND_MAX - 0.3f;
        for (int v = 0; v < count; v++) {
            if (!qrt_kernels_runnable(all[v]) || n < 1)
                continue;
            float lo, hi;
            double best = 1e9;
            for (int r = 0; r < 300; r++) {
                const double t0 = now();
                all[v]->min_max(x, n, &lo, &hi);
                const double t = now() - t0;
                best = t < best ? t : best;
            }
            printf("%-12s n=%-8ld %9.2f us  [%g, %g]\n", all[v]->name, (long)n, best * 1e6, lo, hi);
        }
        free(x);
    }
    return 0;
}
