/* What a line another core has just written costs: one thread (CPU 0) reads a buffer it wrote itself, reads
 * one the other (CPU 1) has just written, and writes over one the other has just written; the best of 200
 * rounds each. The figures behind the thread pool's shares (qrt/kernels/threadpool.c).
 *
 *     cc -O2 -mavx2 -pthread bench/cross_core.c -o /tmp/cross_core && /tmp/cross_core 48 196 786
 *
 * Arguments: buffer sizes in KiB. Needs 2 CPUs (0 and 1). */
#define _GNU_SOURCE
#include "clock.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int turn; /* 1: the other thread writes; 2: it has; -1: it returns */
static float* buf;
static size_t n;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void write_all(float v) {
    for (size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_set1_ps(v));
}

static float read_all(void) {
    __m256 s = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8)
        s = _mm256_add_ps(s, _mm256_loadu_ps(buf + i));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

static void* other(void* arg) {
    (void)arg;
    pin(1);
    for (;;) {
        int t;
        while ((t = atomic_load(&turn)) != 1 && t != -1)
            ;
        if (t == -1)
            return NULL;
        write_all(1.0f);
        atomic_store(&turn, 2);
    }
}

static void other_writes(void) {
    atomic_store(&turn, 1);
    while (atomic_load(&turn) != 2)
        ;
}

int main(int argc, char** argv) {
    for (int a = 1; a < argc; a++) {
        const size_t kib = (size_t)atoi(argv[a]);
        n = kib * 1024 / sizeof(float) / 8 * 8;
        buf = aligned_alloc(64, n * sizeof(float) + 64);
        memset(buf, 0, n * sizeof(float));
        pthread_t th;
        atomic_store(&turn, 0);
        pthread_create(&th, NULL, other, NULL);
        pin(0);
        double own = 1e9, theirs = 1e9, over = 1e9, t, d;
        volatile float sink = 0;
        for (int r = 0; r < 200; r++) {
            write_all(2.0f);
            t = now();
            sink += read_all();
            d = now() - t;
            own = d < own ? d : own;
            other_writes();
            t = now();
            sink += read_all();
            d = now() - t;
            theirs = d < theirs ? d : theirs;
            other_writes();
            t = now();
            write_all(3.0f);
            d = now() - t;
            over = d < over ? d : over;
        }
        atomic_store(&turn, -1);
        pthread_join(th, NULL);
        free(buf);
        printf("%6zu KiB: read own %6.1f us, read the other core's %6.1f us, write over the other core's %6.1f us\n",
               kib, own * 1e6, theirs * 1e6, over * 1e6);
    }
    return 0;
}
