"""Where the pool's worker runs, and what it costs when it shares its caller's CPU (docs/PERFORMANCE.md, "Where
Linux puts the worker"): a static int8 product M=64 K=N=1024 at 2 threads, samples of 60 calls with something
in between (a sleep, or another runtime's calls), each sample's median time per call printed with the CPU its
caller and the qrt-worker thread were on after it.

    python bench/worker_placement.py [--between sleep|torch] [--gap 0.05] [--samples 20]

--between sleep: a sleep of --gap seconds (the worker sleeps too, and is woken by the next call);
--between torch: 50 calls of torch's dynamic linear on 2 threads, then a sleep of --gap (its OpenMP workers
spin for milliseconds after the last). A sample at the 1-thread time with both CPUs equal is the worker on
its caller's CPU; at the 1-thread time with the CPUs apart, another thread holds the worker's CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import bench_cpu  # noqa: E402
import torch  # noqa: E402
from harness import machine, machine_line  # noqa: E402

import qrt  # noqa: E402


def thread_cpus() -> tuple[int, int | None]:
    """The CPU the caller (the main thread) and the pool's worker last ran on (None: no worker)."""
    def cpu(stat: str) -> int:
        return int(stat.rsplit(")", 1)[1].split()[36])  # field 39 of proc(5)'s stat: processor

    worker = None
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        if "(qrt-worker)" in stat:
            worker = cpu(stat)
    with open(f"/proc/self/task/{os.getpid()}/stat") as f:
        return cpu(f.read()), worker


def timed(fn, calls: int) -> list[float]:
    """Seconds of each of `calls` calls of fn."""
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--between", choices=["sleep", "torch"], default="sleep")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds of sleep before each sample")
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    print(machine_line(machine(), None, f"--between {args.between} --gap {args.gap}"))
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        run = bench_cpu.static_linear_case(tmp, 2, 64, 1024, 1024, False)[0]
        run_torch = bench_cpu.dynamic_linear_case(tmp, 2, 64, 1024, 1024, "per_tensor")[1]
        qrt.set_num_threads(1)
        one = statistics.median(timed(run, 200)) * 1e6
        qrt.set_num_threads(2)
        torch.set_num_threads(2)
        timed(run, 50)
        medians = []
        for s in range(args.samples):
            if args.between == "torch":
                for _ in range(50):
                    run_torch()
            time.sleep(args.gap)
            medians.append(statistics.median(timed(run, 60)) * 1e6)
            caller, worker = thread_cpus()
            print(f"sample {s:3d}: {medians[-1]:7.1f} us a call, caller on CPU {caller}, worker on CPU {worker}")
    print(f"1 thread: {one:.1f} us; 2 threads, median of the samples {statistics.median(medians):.1f} us, "
          f"samples above 1.5x the best: {sum(m > 1.5 * min(medians) for m in medians)} of {len(medians)}")


if __name__ == "__main__":
    main()
