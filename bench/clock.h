/* A monotonic clock in seconds, for the C probes in bench/ (each builds as one file and includes it). */
#ifndef QRT_BENCH_CLOCK_H
#define QRT_BENCH_CLOCK_H

#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif /* QRT_BENCH_CLOCK_H */
