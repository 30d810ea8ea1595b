"""qrt's float32 math kernels (qrt._kernels.FloatOps) on BERT-sized tensors, in two builds of qrt (say, before and
after a kernel change) at 1 and 2 threads: each build runs in its own process, the builds alternating round by
round so that both see the same machine load; within a process the samples of every case interleave.

    python bench/float_ops_ab.py --build before=/tmp/qrt-before --build after=. --rounds 3

A build is a checkout with its extension built in place (make build). Figures: medians over the rounds of each
round's median time per call, in microseconds.
"""

from __future__ import annotations

import os
import sys

from harness import ab_table

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(1, 128, 1536), (32, 128, 1536), (1, 128, 384), (32, 128, 384)]
UNARY = ["gelu", "gelu_tanh", "sigmoid", "tanh", "silu"]


def cases() -> list[str]:
    names = []
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        names += [f"{op} {s}" for op in UNARY] + [f"layer_norm {s}", f"softmax {s}", f"add [{s}]+[{shape[-1]}]"]
    return names


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}."""
    sys.path.insert(0, HERE)
    import numpy as np
    from harness import time_cases

    from qrt import _kernels as K

    ops, rng = K.FloatOps(), np.random.default_rng(0)
    fns: list = []
    for shape in SHAPES:
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        rows = x.reshape(-1, shape[-1])
        w, b = rng.standard_normal((2, shape[-1])).astype(np.float32)
        y = np.empty_like(x)
        flat_x, flat_y, y_rows = x.reshape(-1), y.reshape(-1), y.reshape(rows.shape)
        fns += [lambda op=op, fx=flat_x, fy=flat_y: ops.unary(op, fx, fy) for op in UNARY]
        fns.append(lambda r=rows, w=w, b=b, yr=y_rows: ops.layer_norm(r, w, b, 1e-12, yr))
        fns.append(lambda r=rows[..., None], yr=y_rows[..., None]: ops.softmax(False, r, yr))
        fns.append(lambda x=x, b=b, y=y: ops.binary("add", x, b, y))
    return time_cases(cases(), fns, threads, repeats=7)


def main() -> None:
    ab_table(__file__, __doc__, one_round, cases(), "case (us per call)", 34)


if __name__ == "__main__":
    main()
