"""What an output array's alignment costs the step that writes it: a dynamic int8 Linear called into y on a 64-byte
boundary and 16 bytes past one (where numpy's allocator mostly puts a large array), and the same layer as a model
through Model.run, whose output the call allocates: as numpy does, and on a cache line (the plan's default from
64 KiB up, qrt/_plan.pxi LINE_ALIGNED_BYTES).

    PYTHONPATH=. python bench/output_alignment.py [--threads 1 2]

Figures: medians of samples interleaved across the four ways (bench/harness.py time_calls), microseconds."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import time_calls  # noqa: E402

SHAPES = [(1, 1024, 1024), (64, 256, 256), (64, 1024, 1024), (512, 256, 256), (128, 384, 1152), (128, 1536, 384)]


def floats_at(shape: tuple[int, int], offset: int) -> np.ndarray:
    """An uninitialised float32 array starting `offset` bytes past a 64-byte boundary."""
    n = shape[0] * shape[1]
    buf = np.empty(n + 32, np.float32)
    start = ((-buf.ctypes.data) % 64 + offset) // 4
    return buf[start:start + n].reshape(shape)


def one_layer(tmp: str, m: int, k: int, n: int, rng: np.random.Generator) -> tuple:
    """A dynamic Linear [m, k] -> [m, n]: the kernel object and the same layer as a loaded one-node model."""
    w = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scale, bias = np.float32(0.004), rng.standard_normal(n).astype(np.float32)
    b = GraphBuilder()
    y = b.node("linear_dynamic", {"x": b.input("x", "float32", [m, k]), "weight": w, "weight_scale": scale,
                                  "weight_zero_point": np.int32(0), "bias": bias})
    b.output(y)
    path = os.path.join(tmp, f"{m}_{k}_{n}.qrt")
    b.save(path)
    return K.DynamicLinear(w, np.full(n, scale, np.float32), np.zeros(n, np.int32), bias), qrt.load(path)


def time_shape(layer: K.DynamicLinear, model: qrt.Model, x: np.ndarray, n: int, threads: int) -> list[float]:
    """Seconds a call: the kernel into y on a line and 16 bytes past one; Model.run with numpy's output and with one
    on a line."""
    on_line, past = floats_at((len(x), n), 0), floats_at((len(x), n), 16)
    last = [None]  # the latest output only: keeping them all would time the allocator's page faults

    def run() -> None:
        last[0] = model.run(x)

    def run_with(line_bytes: int) -> None:
        qrt.set_num_threads(threads)
        K._set_line_aligned_bytes(line_bytes)

    default = K._set_line_aligned_bytes(0)
    K._set_line_aligned_bytes(default)
    fns = [lambda: layer(x, on_line), lambda: layer(x, past), run, run]
    setups = [lambda: run_with(default)] * 2 + [lambda: run_with(1 << 62), lambda: run_with(1)]
    times = time_calls(fns, min_time=0.01, repeats=21, setups=setups)
    K._set_line_aligned_bytes(default)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'threads':>7s} {'M x K x N':>14s} {'y on a line':>12s} {'16 past':>9s} {'ratio':>6s} "
          f"{'run: numpy':>11s} {'on a line':>10s} {'ratio':>6s}  (us)")
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in SHAPES:
            layer, model = one_layer(tmp, m, k, n, rng)
            x = rng.standard_normal((m, k)).astype(np.float32)
            for threads in args.threads:
                a, p, numpy_run, line_run = time_shape(layer, model, x, n, threads)
                print(f"{threads:7d} {f'{m}x{k}x{n}':>14s} {a * 1e6:12.1f} {p * 1e6:9.1f} {p / a:6.2f} "
                      f"{numpy_run * 1e6:11.1f} {line_run * 1e6:10.1f} {numpy_run / line_run:6.2f}")


if __name__ == "__main__":
    main()
