/* qrt's thread pool (threadpool.h): pthreads, C11 atomics, a futex on Linux and a condition variable
 * elsewhere.
 *
 * One loop at a time holds the pool (pool.lock). Its tasks are dealt out as shares, near-equal runs of
 * consecutive tasks, one to each thread it may wake (the caller is share 0, worker i share i). Each share is
 * one 64-bit word: the loop's number (epoch), the share's end and its next task. A thread takes the tasks
 * of its own share from the front, then, its share done, other shares' from the back; each take is a
 * compare-and-swap on the share's word, so a thread still on an earlier loop (its epoch not the word's)
 * never takes a task, or reads fn and ctx, of a loop that is not the one it sees. The caller waits for
 * `done` to reach the task count; fn, ctx and tasks stay valid until then.
 *
 * Why shares: callers split rows into consecutive tasks the same way loop after loop (a product's row
 * chunks, a float op's, layer_norm's), so a thread takes the same rows step after step and reads what it
 * wrote from its own cache. Lines another core has just written cost about 3x as much to read and to write
 * over (2 vCPUs of a Xeon VM, 786 KiB: read in 13 against 35 us, written over in 46; bench/cross_core.c,
 * docs/PERFORMANCE.md "Shares"). Taken from one counter, a task went to whichever thread came first. */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__linux__) && !defined(QRT_POOL_CONDVAR) /* QRT_POOL_CONDVAR: the fallback, for its test */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* How long an idle thread spins before it sleeps: longer than the gap between two loops of one model
 * call (a few microseconds of Python between nodes), short enough that an idle process gives its CPUs
 * back at once. */
#define SPIN_NS 50000
#define YIELD_NS 2000

#define NEXT_BITS 20 /* a share word's "next" and "end" fields: QRT_POOL_MAX_TASKS fits either */
#define FIELD_MASK ((UINT64_C(1) << NEXT_BITS) - 1)
#define EPOCH_MASK ((UINT32_C(1) << (64 - 2 * NEXT_BITS)) - 1)
#define SHARE(epoch, next, end) \
    (((uint64_t)((epoch) & EPOCH_MASK) << (2 * NEXT_BITS)) | ((uint64_t)(end) << NEXT_BITS) | (uint64_t)(next))
#define MAX_SHARES 256 /* threads past it have no share of their own: they take from the others' */

typedef struct {
    _Alignas(64) _Atomic uint64_t word; /* epoch << 40 | end << 20 | next task; a cache line each */
    _Atomic int cpu; /* share i's worker: the CPU it joined its last loop on; -1 while it sleeps */
} qrt_share;

typedef struct {
    pthread_mutex_t lock;           /* held by the loop in progress, and by configure */
    int threads;                    /* the team: the caller and nworkers, at most the CPUs */
    int started;                    /* the team for `threads` was started (nworkers of it, if threads ran out) */
    int nworkers;                   /* worker threads running */
    pthread_t* workers;
    qrt_share shares[MAX_SHARES];   /* the loop's shares, nshares of them */
    _Atomic int nshares;
    ptrdiff_t tasks;                /* the loop's task count */
    _Atomic int next_id;            /* the share the next worker to start takes */
    _Atomic uint32_t epoch;         /* the futex the workers sleep on: moves on with every loop */
    _Atomic uint32_t done;          /* tasks of this loop that have returned (the caller's futex) */
    _Atomic int sleepers;           /* workers asleep on epoch, or about to be */
    _Atomic int caller_asleep;      /* the caller sleeps on done */
    _Atomic int stop;               /* workers return */
    _Atomic int caller_cpu;         /* the CPU the loop's caller started it on; -1: unknown */
    qrt_task_fn fn;
    void* ctx;
} qrt_pool;

static qrt_pool pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .threads = 1, .caller_cpu = -1};
static _Thread_local int in_pool; /* this thread is a worker, or runs a loop: nested loops run inline */

/* ------------------------------------------------------------ sleeping and waking */

#if defined(__linux__) && !defined(QRT_POOL_CONDVAR)
static void wait_while(_Atomic uint32_t* word, uint32_t value) {
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

static void wake(_Atomic uint32_t* word, int count) {
    syscall(SYS_futex, (uint32_t*)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#else
/* One condition variable for every word: a waker takes the lock after changing the word, so a waiter
 * that saw the old value under the lock is already waiting when the broadcast comes. */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;

static void wait_while(_Atomic uint32_t* word, uint32_t value) {
    pthread_mutex_lock(&sleep_lock);
    while (atomic_load(word) == value)
        pthread_cond_wait(&sleep_cond, &sleep_lock);
    pthread_mutex_unlock(&sleep_lock);
}

static void wake(_Atomic uint32_t* word, int count) {
    (void)word;
    (void)count;
    pthread_mutex_lock(&sleep_lock);
    pthread_mutex_unlock(&sleep_lock);
    pthread_cond_broadcast(&sleep_cond);
}
#endif

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Spins up to SPIN_NS until (*word == value) == equal; returns whether that came. After the first
 * YIELD_NS it yields now and then: the thread it waits for may be queued on this very CPU (the
 * scheduler often wakes a worker on its waker's CPU), and a pure spin would keep it off for the whole
 * SPIN_NS. */
static int spin_until(_Atomic uint32_t* word, uint32_t value, int equal) {
    int64_t start = 0;
    for (unsigned i = 1;; i++) {
        if ((atomic_load_explicit(word, memory_order_acquire) == value) == equal)
            return 1;
        relax();
        if (i % 64 == 0) { /* the clock is read now and then: it costs more than a pause */
            int64_t t = now_ns();
            if (start == 0)
                start = t;
            else if (t - start > SPIN_NS)
                return 0;
            else if (t - start > YIELD_NS)
                sched_yield();
        }
    }
}

/* ------------------------------------------------------------ running tasks */

/* A task of share s of loop `epoch`, taken from the front (the share's own thread) or the back (another);
 * -1 when the share has none left or belongs to another loop. */
static ptrdiff_t take(qrt_share* s, uint32_t epoch, int front) {
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        const uint64_t next = w & FIELD_MASK, end = (w >> NEXT_BITS) & FIELD_MASK;
        if ((w >> (2 * NEXT_BITS)) != (epoch & EPOCH_MASK) || next >= end)
            return -1;
        const uint64_t taken = front ? w + 1 : w - (UINT64_C(1) << NEXT_BITS);
        if (atomic_compare_exchange_weak_explicit(&s->word, &w, taken, memory_order_acquire, memory_order_acquire))
            return (ptrdiff_t)(front ? next : end - 1);
    }
}

static void run_task(ptrdiff_t t) {
    const uint32_t tasks = (uint32_t)pool.tasks; /* read while the loop is sure to be this one: t is not done */
    pool.fn(pool.ctx, t);
    /* seq_cst with the caller's caller_asleep: either it sees this count or this sees its flag */
    if (atomic_fetch_add(&pool.done, 1) + 1 == tasks && atomic_load(&pool.caller_asleep))
        wake(&pool.done, 1);
}

/* Runs tasks of loop `epoch` until none is left: share `me`'s first, then the others' from the back. */
static void run_tasks(int me, uint32_t epoch) {
    const int n = atomic_load_explicit(&pool.nshares, memory_order_relaxed);
    ptrdiff_t t;
    if (me < n)
        while ((t = take(&pool.shares[me], epoch, 1)) >= 0)
            run_task(t);
    for (int i = 1; i <= n; i++) {
        qrt_share* s = &pool.shares[(me + i) % n];
        while ((t = take(s, epoch, 0)) >= 0)
            run_task(t);
    }
}

/* A worker that starts a loop on its caller's CPU moves to another of its CPUs, at most once per MOVE_GAP_NS.
 * Linux often wakes a thread on its waker's CPU, and the caller, waking from a sleep of its own, can land on the
 * worker's; on a VM the two were then left together for whole series of loops, taking turns on one CPU at the
 * 1-thread time (2-CPU Zen 5, a static product M=64 K=N=1024 at 2 threads after 50 ms idle: 10 of 20 samples of
 * 60 calls at 143-146 us, the others 76-81; docs/PERFORMANCE.md, "Where Linux puts the worker"). Narrowing the
 * affinity migrates the thread at once; the old mask, restored at once, leaves it where it now runs. The gap
 * bounds the cost where the scheduler keeps putting it back (another process holding the other CPUs): a move per
 * millisecond at most. */
#define MOVE_GAP_NS 1000000

#if defined(__linux__)
/* Where a worker on the caller's CPU may go: the CPUs of `allowed` but the caller's and those that n other
 * workers of the team hold (held[i]: the CPU one joined its last loop on, -1 asleep). Linux migrates a thread
 * whose mask loses its CPU to the next CPU of the new mask in turn, not an idle one, so with all the other CPUs
 * allowed a team as large as the CPUs would mostly land the worker on another worker's CPU. Where the team
 * holds them all, any CPU but the caller's. */
static void cpus_to_move_to(const cpu_set_t* allowed, int caller, const int* held, int n, cpu_set_t* out) {
    *out = *allowed;
    CPU_CLR(caller, out);
    cpu_set_t untaken = *out;
    for (int i = 0; i < n; i++)
        if (held[i] >= 0 && held[i] < CPU_SETSIZE)
            CPU_CLR(held[i], &untaken);
    if (CPU_COUNT(&untaken) > 0)
        *out = untaken;
}
#endif

/* Worker `me` joins a loop: it records its CPU, and steps off the caller's. */
static void step_off_caller_cpu(int me, int64_t* last_move) {
#if defined(__linux__)
    const int cpu = sched_getcpu();
    if (me < MAX_SHARES)
        atomic_store_explicit(&pool.shares[me].cpu, cpu, memory_order_relaxed);
    if (cpu < 0 || cpu != atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed))
        return;
    const int64_t t = now_ns();
    if (t - *last_move < MOVE_GAP_NS)
        return;
    *last_move = t;
    cpu_set_t mask, dest;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0)
        return;
    int held[MAX_SHARES], n = 0;
    for (int i = 1; i <= pool.nworkers && i < MAX_SHARES; i++) /* nworkers is set before any loop starts */
        if (i != me)
            held[n++] = atomic_load_explicit(&pool.shares[i].cpu, memory_order_relaxed);
    cpus_to_move_to(&mask, cpu, held, n, &dest);
    if (CPU_COUNT(&dest) > 0 && sched_setaffinity(0, sizeof dest, &dest) == 0)
        sched_setaffinity(0, sizeof mask, &mask);
#else
    (void)me;
    (void)last_move;
#endif
}

static void* worker_main(void* arg) {
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    const int me = atomic_fetch_add(&pool.next_id, 1);
    int64_t last_move = INT64_MIN / 2;
    in_pool = 1;
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "qrt-worker"); /* what top -H, perf and /proc/<pid>/task/<tid>/comm show */
#endif
    for (;;) {
        if (!spin_until(&pool.epoch, seen, 0)) {
            /* seq_cst with the caller's epoch store and sleepers load (see qrt_parallel_for) */
            if (me < MAX_SHARES) /* a sleeper holds no CPU: others may move to its last one */
                atomic_store_explicit(&pool.shares[me].cpu, -1, memory_order_relaxed);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.epoch) == seen)
                wait_while(&pool.epoch, seen);
            atomic_fetch_sub(&pool.sleepers, 1);
        }
        seen = atomic_load_explicit(&pool.epoch, memory_order_acquire);
        if (atomic_load(&pool.stop))
            return NULL;
        step_off_caller_cpu(me, &last_move);
        run_tasks(me, seen);
    }
}

/* ------------------------------------------------------------ the team (pool.lock held) */

static void stop_workers(void) {
    pool.started = 0;
    if (pool.nworkers == 0)
        return;
    atomic_store(&pool.stop, 1);
    atomic_fetch_add(&pool.epoch, 1);
    wake(&pool.epoch, INT32_MAX);
    for (int i = 0; i < pool.nworkers; i++)
        pthread_join(pool.workers[i], NULL);
    atomic_store(&pool.stop, 0);
    free(pool.workers);
    pool.workers = NULL;
    pool.nworkers = 0;
}

/* Starts threads - 1 workers; fewer if the system refuses threads (the loops then use fewer). */
static void start_workers(void) {
    int want = pool.threads - 1;
    pool.started = 1;
    pool.workers = (pthread_t*)malloc((size_t)want * sizeof(pthread_t));
    if (pool.workers == NULL)
        return;
    uint32_t epoch = atomic_load(&pool.epoch);
    atomic_store(&pool.next_id, 1);
    while (pool.nworkers < want &&
           pthread_create(&pool.workers[pool.nworkers], NULL, worker_main, (void*)(uintptr_t)epoch) == 0)
        pool.nworkers++;
}

/* In a child process after fork() the workers are gone: forget them (their memory is the parent's; the
 * next loop starts a team of the child's own). The forking thread holds the lock (before_fork). */
static void after_fork_child(void) {
    pool.nworkers = 0;
    pool.workers = NULL;
    pool.started = 0;
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_unlock(&pool.lock);
}

static void before_fork(void) {
    pthread_mutex_lock(&pool.lock);
}

static void after_fork_parent(void) {
    pthread_mutex_unlock(&pool.lock);
}

static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void install_fork_handlers(void) {
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ------------------------------------------------------------ public */

void qrt_pool_configure(int threads, int cpus) {
    pthread_once(&fork_handlers, install_fork_handlers);
    pthread_mutex_lock(&pool.lock);
    /* more threads than CPUs only take turns on them: each loop would wait for whichever the OS runs last */
    threads = threads > cpus ? cpus : threads;
    threads = threads < 1 ? 1 : threads;
    if (threads != pool.threads)
        stop_workers(); /* the next loop starts the new team */
    pool.threads = threads;
    pthread_mutex_unlock(&pool.lock);
}

int qrt_pool_workers(void) {
    pthread_mutex_lock(&pool.lock);
    int n = pool.nworkers;
    pthread_mutex_unlock(&pool.lock);
    return n;
}

void qrt_parallel_for(ptrdiff_t tasks, int helpers, qrt_task_fn fn, void* ctx) {
    if (tasks <= 0)
        return;
    if (tasks == 1 || tasks > QRT_POOL_MAX_TASKS || helpers <= 0 || in_pool ||
        pthread_mutex_trylock(&pool.lock) != 0) {
        for (ptrdiff_t t = 0; t < tasks; t++)
            fn(ctx, t);
        return;
    }
    if (pool.threads == 1) {
        pthread_mutex_unlock(&pool.lock);
        for (ptrdiff_t t = 0; t < tasks; t++)
            fn(ctx, t);
        return;
    }
    if (!pool.started)
        start_workers();
    in_pool = 1;
    /* wake no more threads than there are tasks beside the caller's */
    if (helpers > tasks - 1)
        helpers = (int)(tasks - 1);
    if (helpers > pool.nworkers)
        helpers = pool.nworkers;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.tasks = tasks;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    const uint32_t epoch = atomic_load_explicit(&pool.epoch, memory_order_relaxed) + 1;
    const int shares = helpers + 1 < MAX_SHARES ? helpers + 1 : MAX_SHARES;
    atomic_store_explicit(&pool.nshares, shares, memory_order_relaxed);
    for (int i = 0; i < shares; i++)
        atomic_store_explicit(&pool.shares[i].word, SHARE(epoch, tasks * i / shares, tasks * (i + 1) / shares),
                              memory_order_release);
#if defined(__linux__)
    atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
#endif
    atomic_store(&pool.epoch, epoch);
    if (helpers > 0 && atomic_load(&pool.sleepers) > 0)
        wake(&pool.epoch, helpers);
    run_tasks(0, epoch);
    uint32_t n = (uint32_t)tasks, d;
    if (!spin_until(&pool.done, n, 1)) {
        /* seq_cst with the last task's done count and caller_asleep load (run_tasks) */
        atomic_store(&pool.caller_asleep, 1);
        while ((d = atomic_load(&pool.done)) != n)
            wait_while(&pool.done, d);
        atomic_store(&pool.caller_asleep, 0);
    }
    in_pool = 0;
    pthread_mutex_unlock(&pool.lock);
}
