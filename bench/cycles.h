/* Timing for the instruction-bound probes (avx2_bound.c, vnni_peak.c): clock.h's clock, the best of 3 timings
 * of ITERS runs of a loop, and a chain of dependent adds (one cycle each) to count core cycles against, since
 * the clock varies. Each probe includes it and builds as one file. */
#ifndef QRT_BENCH_CYCLES_H
#define QRT_BENCH_CYCLES_H

#include "clock.h"

#define ITERS 50000000L

/* best of 3 timings of ITERS runs of f, in seconds per run */
static double best_of_3(void (*f)(void)) {
    double best = 1e30;
    for (int trial = 0; trial < 3; trial++) {
        const double t = now();
        f();
        const double s = (now() - t) / ITERS;
        best = s < best ? s : best;
    }
    return best;
}

#if defined(__x86_64__)
static void add_chain(void) { /* 4 dependent adds */
    long a = 0;
    for (long i = 0; i < ITERS; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(a));
}
#endif

#endif /* QRT_BENCH_CYCLES_H */
