/* qrt's thread pool: one persistent team of workers that runs every parallel loop of the kernels.
 *
 * qrt_parallel_for(tasks, fn, ctx) calls fn(ctx, t) once for each t in [0, tasks), on the calling thread
 * and the pool's workers, and returns when all calls have returned. The tasks are dealt out in shares of
 * consecutive tasks, the first to the caller and one to each of the first `helpers` workers; a thread done
 * with its own share takes the others' last tasks one at a time, so a worker that the OS does not schedule
 * (or that sleeps through the loop) holds up at most the task it took, never its share. A caller that
 * splits rows into consecutive tasks the same way loop after loop so gives each thread the same rows every
 * time, mostly. Which thread runs which task still varies: callers make every task write its own outputs,
 * so results never depend on it.
 *
 * The team is created on first use with qrt_pool_configure's thread count, capped at the CPUs the
 * process may use, and kept (no per-call resizing). More threads than CPUs would only take turns on
 * them, each loop waiting for whichever thread the OS runs last; so a team never outnumbers the CPUs,
 * and its idle workers may spin: after a loop a worker spins for a short while for the next one
 * (waking a sleeping thread costs several microseconds, tens on a VM), yielding its CPU now and then,
 * then sleeps on a futex (Linux) or a condition variable. The caller's task split need not follow the
 * team: any number of tasks runs on any team.
 *
 * A loop started while the pool runs another (another caller thread, or a task that starts a loop of
 * its own) runs on its caller's thread alone. */
#ifndef QRT_THREADPOOL_H
#define QRT_THREADPOOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*qrt_task_fn)(void* ctx, ptrdiff_t task);

/* Tasks one loop may have (the job word's field); a larger loop runs on its caller alone. */
#define QRT_POOL_MAX_TASKS (((ptrdiff_t)1 << 20) - 1)

/* The threads asked for (the caller included) and the CPUs the process may use: the team is the smaller.
 * Takes effect at the next loop; waits for a loop in progress. */
void qrt_pool_configure(int threads, int cpus);

/* Runs fn(ctx, t) for t in [0, tasks) and returns when all have run.
 * helpers: the most sleeping workers worth waking for it (the caller's cost model: a wake-up costs
 * microseconds); workers still spinning from an earlier loop may join too. helpers <= 0 runs the loop
 * on the caller alone: a worker that joins a loop too small to pay for it only adds a wait for it. */
void qrt_parallel_for(ptrdiff_t tasks, int helpers, qrt_task_fn fn, void* ctx);

/* Worker threads running now (0 before the first parallel loop), for tests. */
int qrt_pool_workers(void);

#ifdef __cplusplus
}
#endif

#endif
