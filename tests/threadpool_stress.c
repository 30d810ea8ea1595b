/* qrt's thread pool under stress (tests/test_threads.py builds it twice: futex, and the condition
 * variable fallback): loops of 1 to 300 tasks, from several caller threads at once, nested loops, team
 * sizes changed in between; every task must run exactly once per loop. Exits 1 on the first miss. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    _Atomic int* hits;
    int nested;
} job;

static void inner(void* ctx, ptrdiff_t t) {
    atomic_fetch_add(&((job*)ctx)->hits[t], 1);
}

static void task(void* ctx, ptrdiff_t t) {
    job* j = (job*)ctx;
    atomic_fetch_add(&j->hits[t], 1);
    if (j->nested && t == 0) { /* a loop inside a task runs inline */
        _Atomic int hits[8] = {0};
        job k = {hits, 0};
        qrt_parallel_for(8, 7, inner, &k);
        for (int i = 0; i < 8; i++)
            if (hits[i] != 1)
                abort();
    }
}

static int run_loops(int seed, int loops) {
    unsigned r = (unsigned)seed * 2654435761u + 1;
    _Atomic int hits[300];
    for (int l = 0; l < loops; l++) {
        r = r * 1103515245u + 12345u;
        int tasks = 1 + (int)(r >> 8) % 300, helpers = (int)(r >> 20) % 20 - 2;
        for (int i = 0; i < tasks; i++)
            atomic_store(&hits[i], 0);
        job j = {hits, (int)(r >> 4) % 7 == 0};
        qrt_parallel_for(tasks, helpers, task, &j);
        for (int i = 0; i < tasks; i++)
            if (atomic_load(&hits[i]) != 1) {
                fprintf(stderr, "loop %d: task %d of %d ran %d times\n", l, i, tasks, atomic_load(&hits[i]));
                return 1;
            }
    }
    return 0;
}

static void* caller(void* arg) {
    return (void*)(intptr_t)run_loops((int)(intptr_t)arg, 3000);
}

int main(void) {
    static const int teams[][2] = {{4, 4}, {16, 2}, {3, 8}, {1, 1}, {8, 8}};
    for (int s = 0; s < 5; s++) {
        qrt_pool_configure(teams[s][0], teams[s][1]);
        if (run_loops(s, 3000))
            return 1;
        pthread_t callers[3];
        for (int c = 0; c < 3; c++)
            pthread_create(&callers[c], NULL, caller, (void*)(intptr_t)(10 * s + c));
        int failed = 0;
        for (int c = 0; c < 3; c++) {
            void* rc;
            pthread_join(callers[c], &rc);
            failed |= rc != NULL;
        }
        if (failed)
            return 1;
    }
    printf("ok %d workers\n", qrt_pool_workers());
    return 0;
}
