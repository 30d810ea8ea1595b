"""qrt's two numerics side by side: engine "x86" (fbgemm's) against "qnnpack" (torch's ARM engine), the same
layer with the same weights and inputs, timed interleaved (harness.time_calls), one row per layer and size.

    PYTHONPATH=. .venv/bin/python bench/bench_qnnpack.py [--quick]

Both run the same exact int8 product; they differ in the epilogue (docs/NUMERICS.md section 9): the dynamic
layers multiply then add where x86's fuse the two into an fma (both from the tile's registers on the VNNI and
dotprod variants), and the static layers add an int32 bias. And in the activations: qnnpack's
dynamic layers quantize over 0..255, so on the avx2 variant they take the exact product, not the faster
7-bit one x86's reduce_range allows (docs/PERFORMANCE.md: on avx2 about 1.5x from 32 rows up, 1.45-1.75x at one
row; on the VNNI variants within the machine's noise). The "product" rows time that product alone, on the
activations each engine's dynamic layers give it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from harness import fmt_time, time_calls  # noqa: E402

from qrt import _kernels as K  # noqa: E402

F32 = np.float32


def _weights(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (rng.integers(-128, 128, (n, k), dtype=np.int8), F32(0.004), np.int32(0),
            rng.standard_normal(n).astype(F32))


def dynamic(m: int, k: int, n: int) -> list[Callable[[], object]]:
    rng = np.random.default_rng(k + n)
    w, s, z, b = _weights(rng, n, k)
    x, y = rng.standard_normal((m, k)).astype(F32), np.empty((m, n), F32)
    layers = [K.DynamicLinear(w, s, z, b, True, qnnpack) for qnnpack in (False, True)]
    return [lambda layer=layer: layer(x, y) for layer in layers]


def static(m: int, k: int, n: int) -> list[Callable[[], object]]:
    rng = np.random.default_rng(k * n)
    w, s, z, b = _weights(rng, n, k)
    x, y = rng.integers(0, 256, (m, k), dtype=np.uint8), np.empty((m, n), np.uint8)
    layers = [K.StaticLinear(w, s, z, b, F32(0.02), 128, F32(0.25), 64, False, qnnpack) for qnnpack in (False, True)]
    return [lambda layer=layer: layer(x, y) for layer in layers]


def lstm_cell(batch: int, n_in: int, hidden: int) -> list[Callable[[], object]]:
    rng = np.random.default_rng(hidden)
    x = rng.standard_normal((batch, n_in)).astype(F32)
    h, c = (rng.uniform(-1, 1, (batch, hidden)).astype(F32) for _ in range(2))
    h_out, c_out = np.empty_like(h), np.empty_like(c)
    cells = []
    for qnnpack in (False, True):
        ih, hh = (K.DynamicLinear(*_weights(np.random.default_rng(size), 4 * hidden, size), True, qnnpack)
                  for size in (n_in, hidden))
        cells.append(K.Recurrent("lstm", ih, hh))
    return [lambda cell=cell: cell.step(x, h, c, h_out, c_out) for cell in cells]


def product(m: int, k: int, n: int) -> list[Callable[[], object]]:
    """The int8 product alone (x packed, then multiplied into int32) on the activations each engine's dynamic
    layers give it: at most 127 (x86, reduce_range) and up to 255 (qnnpack), which on avx2 take the 7-bit and
    the exact flavour."""
    rng = np.random.default_rng(m + k + n)
    p = K.PackedS8(rng.integers(-128, 128, (n, k), dtype=np.int8), np.int32(0))
    acc = np.empty((m, n), np.int32)
    xs = [rng.integers(0, top + 1, (m, k), dtype=np.uint8) for top in (127, 255)]
    return [lambda x=x: p(x, 0, acc) for x in xs]


def cases(quick: bool) -> Iterator[tuple[str, Callable[..., list[Callable[[], object]]], tuple]]:
    shapes = [(256, 256)] if quick else [(256, 256), (1024, 1024)]
    for m in (1, 64) if quick else (1, 8, 64):
        for k, n in shapes:
            yield f"dynamic M={m} K={k} N={n}", dynamic, (m, k, n)
            yield f"static M={m} K={k} N={n}", static, (m, k, n)
            yield f"product M={m} K={k} N={n}", product, (m, k, n)
    for batch in (1, 32):
        yield f"lstm_cell step B={batch} I=64 H=128", lstm_cell, (batch, 64, 128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    args = ap.parse_args()
    K.set_num_threads(1)
    print(f"qrt kernels {K.kernel_variant()}, 1 thread")
    print(f"{'case':34s} {'x86':>10s} {'qnnpack':>10s} {'ratio':>6s}")
    for name, make, params in cases(args.quick):
        x86, qnnpack = time_calls(make(*params))
        print(f"{name:34s} {fmt_time(x86):>10s} {fmt_time(qnnpack):>10s} {qnnpack / x86:6.2f}")


if __name__ == "__main__":
    main()
