/* Where the pool's worker runs after a wake-up (tests/test_threads.py): the caller pins itself to one CPU,
 * sleeps long enough that the worker sleeps too, then runs a loop of two long tasks. A worker woken on the
 * caller's CPU must move off it before it takes a task (threadpool.c, step_off_waker_cpu), and must keep the
 * affinity it had (the move narrows it for an instant only). Prints "ok" and the rounds in which the worker
 * ran a task; "skip" without Linux or two CPUs. Exits 1 on the first worker task on the caller's CPU, or
 * with a narrowed affinity; 2 if the worker ran a task in fewer than 10 of the 40 rounds (nothing checked).
 * Before the move existed, the worker's first task after the first sleep ran on the caller's CPU in each of
 * 3 runs (2-CPU Zen 5 VM). */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static pthread_t caller;
static int caller_cpu, cpus;
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
    /* long enough that a worker woken behind the caller on its CPU gets to run (a scheduler tick) before the
     * caller, done with its own task, takes the worker's */
    spin_us(3000);
}

int main(void) {
#if defined(__linux__)
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || (cpus = CPU_COUNT(&mask)) < 2) {
        printf("skip: fewer than 2 CPUs\n");
        return 0;
    }
    caller = pthread_self();
    qrt_pool_configure(2, 2);
    qrt_parallel_for(2, 1, task, NULL); /* the worker starts with the process's whole mask */
    for (caller_cpu = 0; !CPU_ISSET(caller_cpu, &mask); caller_cpu++)
        ;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(caller_cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        return 1;
    int ran = 0;
    for (int round = 0; round < 40; round++) {
        usleep(2000); /* the worker spins 50 us (SPIN_NS), then sleeps */
        atomic_store(&worker_cpu, -1);
        qrt_parallel_for(2, 1, task, NULL);
        const int cpu = atomic_load(&worker_cpu), n = atomic_load(&worker_mask);
        if (cpu < 0)
            continue;
        ran++;
        if (cpu == caller_cpu || n != cpus) {
            fprintf(stderr, "round %d: the worker ran on CPU %d (the caller's: %d) with %d of %d CPUs\n", round,
                    cpu, caller_cpu, n, cpus);
            return 1;
        }
    }
    printf("%s: the worker ran a task in %d of 40 rounds\n", ran >= 10 ? "ok" : "too few", ran);
    return ran >= 10 ? 0 : 2;
#else
    printf("skip: not Linux\n");
    return 0;
#endif
}
