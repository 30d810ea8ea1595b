"""A dynamic int8 Linear at all-MiniLM-L6-v2's shapes (128 tokens) with its weights warm in the cache and cold: one
layer called again and again, against 8 layers of the same shape called in turn (their weights, 3.5-4.7 MiB, past
a core's L2, as in the model), at 1 and 2 threads. Where a second thread gains less on cold weights, it is the
weights' stream: split by rows, each thread reads all of them.

    PYTHONPATH=. python bench/cold_weights.py

Figures: per layer call, medians of samples interleaved across the layer counts and thread counts of a shape
(bench/harness.py time_calls), microseconds."""

from __future__ import annotations

import os
import sys

import numpy as np

import qrt
from qrt import _kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import time_calls  # noqa: E402

SHAPES = [(128, 384, 1152), (128, 384, 1536), (128, 1536, 384)]
COUNTS = (1, 8)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'M x K x N':16s}{'layers':>8s}{'1 thread':>10s}{'2 threads':>11s}{'ratio':>7s}  (us per layer call)")
    for m, k, n in SHAPES:
        x, y = rng.standard_normal((m, k)).astype(np.float32), np.empty((m, n), np.float32)
        fns, setups = [], []
        for count in COUNTS:
            layers = [K.DynamicLinear(rng.integers(-127, 128, (n, k), dtype=np.int8),
                                      (rng.random(n) * 0.01 + 1e-3).astype(np.float32), np.zeros(n, np.int32),
                                      rng.standard_normal(n).astype(np.float32)) for _ in range(count)]

            def calls(layers: list = layers, x: np.ndarray = x, y: np.ndarray = y) -> None:
                for layer in layers:
                    layer(x, y)

            for threads in (1, 2):
                fns.append(calls)
                setups.append(lambda threads=threads: qrt.set_num_threads(threads))
        times = iter(time_calls(fns, min_time=0.01, repeats=31, setups=setups))
        for count in COUNTS:
            one, two = (next(times) / count for _ in range(2))
            print(f"{f'{m}x{k}x{n}':16s}{count:8d}{one * 1e6:10.1f}{two * 1e6:11.1f}{one / two:7.2f}")


if __name__ == "__main__":
    main()
