"""Long-run checks that do not belong in the test suite's time budget.

    python bench/soak.py [--runs 100000]

1. Memory: resident memory after --runs calls of one model equals that after
   1,000 (prints both).
2. The GIL is released inside the kernels: two threads finish a fixed amount
   of work faster than one thread does it alone (prints both times).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time

import numpy as np

import qrt
from qrt.builder import GraphBuilder


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(path: str, k: int, n: int) -> None:
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, k])
    weights = {
        "weight": rng.integers(-128, 128, (n, k), dtype=np.int8),
        "weight_scale": np.asarray(0.01, np.float32),
        "weight_zero_point": np.asarray(0, np.int32),
        "bias": rng.standard_normal(n).astype(np.float32),
    }
    g.output(g.node("linear_dynamic", {"x": x, **weights}))
    g.save(path)


def memory(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.qrt")
        build(path, 64, 64)
        model = qrt.load(path)
        x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
        for _ in range(1000):
            model.run(x)
        gc.collect()
        after_1k = rss_mb()
        start = time.perf_counter()
        for _ in range(runs):
            model.run(x)
        gc.collect()
        print(
            f"memory: {after_1k:.2f} MB after 1,000 runs, {rss_mb():.2f} MB after {runs:,} more "
            f"({(time.perf_counter() - start) / runs * 1e6:.1f} us per run)"
        )


def threads(calls: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.qrt")
        build(path, 1024, 1024)
        model = qrt.load(path)
        x = np.random.default_rng(2).standard_normal((64, 1024)).astype(np.float32)
        model.run(x)

        def work(n: int) -> None:
            for _ in range(n):
                model.run(x)

        start = time.perf_counter()
        work(calls)
        one = time.perf_counter() - start
        pair = [threading.Thread(target=work, args=(calls // 2,)) for _ in range(2)]
        start = time.perf_counter()
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        two = time.perf_counter() - start
        print(f"GIL: {calls} calls of a 1024x1024 dynamic linear at M=64: one thread {one:.2f} s, "
              f"two threads {two:.2f} s ({one / two:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    if hasattr(qrt, "set_num_threads"):
        qrt.set_num_threads(1)  # one kernel thread per caller, so the comparison is about the GIL
    memory(args.runs)
    threads()


if __name__ == "__main__":
    main()
