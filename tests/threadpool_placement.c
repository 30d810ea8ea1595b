/* Where the pool's worker runs (tests/test_threads.py). A worker that starts a loop on its caller's CPU must
 * move off it before it takes a task (threadpool.c, step_off_caller_cpu), and must keep the affinity it had
 * (the move narrows it for an instant only). Two ways they meet, 20 rounds each, loops of two 3 ms tasks:
 * - the worker asleep and woken by a caller pinned to one CPU (Linux often wakes a thread on its waker's CPU);
 * - the worker just done with a loop and the caller moved onto the worker's CPU (as when the caller wakes
 *   from a sleep of its own there).
 * Prints "ok" and the rounds in which the worker ran a task; "skip" without Linux or two CPUs. Exits 1 on the
 * first worker task on the caller's CPU, or with a narrowed affinity; 2 if the worker ran a task in fewer than
 * 10 rounds of either kind (nothing checked). The pool before the move failed the first round of the first
 * kind in each of 3 runs (2-CPU Zen 5 VM). */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
static pthread_t caller;
static _Atomic int worker_cpu, worker_mask; /* -1: no worker task this round */

static void spin_us(long us) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do
        clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

static void task(void* ctx, ptrdiff_t t) {
    (void)ctx, (void)t;
    if (!pthread_equal(pthread_self(), caller)) {
        cpu_set_t mask;
        atomic_store(&worker_cpu, sched_getcpu());
        atomic_store(&worker_mask, sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : -1);
    }
    /* long enough that a worker queued behind the caller on its CPU gets to run (a scheduler tick) before the
     * caller, done with its own task, takes the worker's; and over the pool's 1 ms between two moves */
    spin_us(3000);
}

static int pin_caller(int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof one, &one);
}

/* 20 loops; before each the caller sleeps (the worker too: it spins 50 us, then sleeps) or moves onto the CPU
 * the worker last ran on. Returns the rounds the worker ran a task in, or -1 on a fault. */
static int rounds(int cpus, int first_cpu, int onto_worker) {
    int ran = 0, last = first_cpu;
    if (!onto_worker && pin_caller(first_cpu) != 0)
        return -1;
    for (int round = 0; round < 20; round++) {
        if (onto_worker) {
            if (pin_caller(last) != 0)
                return -1;
        } else {
            usleep(2000);
        }
        const int here = sched_getcpu();
        atomic_store(&worker_cpu, -1);
        qrt_parallel_for(2, 1, task, NULL);
        const int cpu = atomic_load(&worker_cpu), n = atomic_load(&worker_mask);
        if (cpu < 0)
            continue;
        ran++;
        if (cpu == here || n != cpus) {
            fprintf(stderr, "%s, round %d: the worker ran on CPU %d (the caller's: %d) with %d of %d CPUs\n",
                    onto_worker ? "caller moved onto the worker" : "worker woken", round, cpu, here, n, cpus);
            return -1;
        }
        last = cpu;
    }
    return ran;
}
#endif

int main(void) {
#if defined(__linux__)
    cpu_set_t mask;
    int cpus, first = 0;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || (cpus = CPU_COUNT(&mask)) < 2) {
        printf("skip: fewer than 2 CPUs\n");
        return 0;
    }
    while (!CPU_ISSET(first, &mask))
        first++;
    caller = pthread_self();
    qrt_pool_configure(2, 2);
    qrt_parallel_for(2, 1, task, NULL); /* the worker starts with the process's whole mask */
    const int woken = rounds(cpus, first, 0), moved = rounds(cpus, first, 1);
    if (woken < 0 || moved < 0)
        return 1;
    const int enough = woken >= 10 && moved >= 10;
    printf("%s: the worker ran a task in %d of 20 rounds woken, %d of 20 with the caller moved onto it\n",
           enough ? "ok" : "too few", woken, moved);
    return enough ? 0 : 2;
#else
    printf("skip: not Linux\n");
    return 0;
#endif
}
