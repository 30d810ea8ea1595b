"""qrt's attention kernel (qrt._kernels.AttentionOps.attention) at all-MiniLM-L6-v2's heads, in two builds of qrt (say,
before and after a kernel change) at 1 and 2 threads: each build runs in its own process, the builds alternating round
by round so that both see the same machine load; within a process the samples of every case interleave.

    python bench/attention_ab.py --build before=/tmp/qrt-before --build after=. --rounds 5

A case is one layer's attention: 12 heads of E = 32 over L = S tokens, batch 1, without a mask, with a bool padding
mask (every key kept, as the model runs a full window), with a float one, and causal; and the scores of the same
heads as the matmul op computes them where attention is not fused (AttentionOps.matmul, q [L, E] by k^T [E, S]).
A build is a checkout with its extension built in place (make build). Figures: medians over the rounds of each
round's median time per call, in microseconds.
"""

from __future__ import annotations

import os
import sys

from harness import ab_table

HERE = os.path.dirname(os.path.abspath(__file__))
HEADS, E = 12, 32
TOKENS = [16, 57, 100, 108, 128]
KINDS = ["no mask", "bool mask", "float mask", "causal", "matmul q k^T"]


def cases() -> list[str]:
    return [f"L=S={n} {kind}" for n in TOKENS for kind in KINDS]


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}."""
    sys.path.insert(0, HERE)
    import numpy as np
    from harness import time_cases

    from qrt import _kernels as K

    ops, rng = K.AttentionOps(), np.random.default_rng(0)
    mask_off, scale = np.zeros(HEADS, np.int64), 1 / np.sqrt(np.float32(E))  # one mask row for every head and row
    fns: list = []
    for n in TOKENS:
        q, k, v = (rng.standard_normal(HEADS * n * E).astype(np.float32) for _ in range(3))
        off = np.arange(HEADS, dtype=np.int64) * n * E
        y = np.empty((HEADS, n, E), np.float32)
        masks = {"bool mask": np.ones((1, n), np.bool_), "float mask": rng.standard_normal((1, n)).astype(np.float32)}
        kt = np.ascontiguousarray(k.reshape(HEADS, n, E).transpose(0, 2, 1)).reshape(-1)
        scores = np.empty((HEADS, n, n), np.float32)
        for kind in KINDS[:-1]:
            mask = masks.get(kind)
            fns.append(lambda q=q, k=k, v=v, off=off, y=y, n=n, mask=mask, causal=kind == "causal":
                       ops.attention(q, off, k, off, v, off, mask, mask_off, 0, scale, causal, y, n, E))
        fns.append(lambda q=q, kt=kt, off=off, scores=scores: ops.matmul(q, off, kt, off, scores, E))
    return time_cases(cases(), fns, threads, repeats=7)


def main() -> None:
    ab_table(__file__, __doc__, one_round, cases(), "case (us per call)")


if __name__ == "__main__":
    main()
