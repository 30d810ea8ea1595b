"""qrt's dynamic int8 Linear (qrt._kernels.DynamicLinear: x's range, its quantization and packing, the product and
the epilogue) at the shapes of all-MiniLM-L6-v2 at 128 tokens, in two builds of qrt at 1 and 2 threads: each build
runs in its own process, the builds alternating round by round so that both see the same machine load; within a
process the samples of every case interleave.

    python bench/dynamic_linear_ab.py --build main=/work/main --build branch=. --rounds 5

A build is a checkout with its extension built in place (make build). Figures: medians over the rounds of each
round's median time per call, in microseconds.
"""

from __future__ import annotations

import os
import sys

from harness import ab_table

HERE = os.path.dirname(os.path.abspath(__file__))
# (M, K, N): attention's q, k, v and output projections, q, k and v as one, the MLP's two
SHAPES = [(128, 384, 384), (128, 384, 1152), (128, 384, 1536), (128, 1536, 384)]


def cases() -> list[str]:
    return ["x".join(map(str, shape)) for shape in SHAPES]


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}."""
    sys.path.insert(0, HERE)
    import numpy as np
    from harness import time_cases

    from qrt import _kernels as K

    rng = np.random.default_rng(0)
    fns: list = []
    for m, k, n in SHAPES:
        w = rng.integers(-127, 128, (n, k), dtype=np.int8)  # torch's dynamic weights: symmetric, zero point 0
        scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
        layer = K.DynamicLinear(w, scale, np.zeros(n, np.int32), rng.standard_normal(n).astype(np.float32))
        x, y = rng.standard_normal((m, k)).astype(np.float32), np.empty((m, n), np.float32)
        fns.append(lambda layer=layer, x=x, y=y: layer(x, y))
    return time_cases(cases(), fns, threads, repeats=9)


def main() -> None:
    ab_table(__file__, __doc__, one_round, cases(), "M x K x N (us per call)", 26, 18)


if __name__ == "__main__":
    main()
