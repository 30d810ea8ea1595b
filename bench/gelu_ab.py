"""gelu (erf form, torch's bits) in two or more builds of qrt, on each float-op build this CPU runs (avx512, fma,
portable), against torch's F.gelu timed in the same processes, at 1 and 2 threads: each build runs in its own
process, the builds alternating round by round so that all see the same machine load; within a process the
samples of every case interleave (torch's with qrt's).

    python bench/gelu_ab.py --build before=/tmp/qrt-before --build after=. --rounds 3

A build is a checkout with its extension built in place (make build). Figures: medians over the rounds of each
round's median time per call, in nanoseconds an element; torch's over every build's rounds.
"""

from __future__ import annotations

import json
import os
import sys

from harness import ab_builds, round_median

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(1, 16, 1536), (1, 128, 1536), (32, 128, 1536)]
VARIANTS = ["avx512-vnni", "avx2", "portable"]  # a kernel variant of each float-op build on x86-64


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: seconds}}, cases 'gelu SHAPE BUILD' and 'gelu SHAPE torch'."""
    sys.path.insert(0, HERE)
    import numpy as np
    import torch
    from harness import time_by_threads

    import qrt
    from qrt import _kernels as K

    ops = {}
    for variant in VARIANTS:
        if K.kernel_variants().get(variant):
            before = K._use_variant(variant)
            try:
                ops.setdefault(K.FloatOps().name, K.FloatOps())
            finally:
                K._use_variant(before)
    rng = np.random.default_rng(0)
    entries = []
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        y, tx = np.empty_like(x), torch.from_numpy(x)
        flat_x, flat_y = x.reshape(-1), y.reshape(-1)
        for t in threads:
            entries += [(f"gelu {s} {build}", t, lambda op=op, fx=flat_x, fy=flat_y: op.unary("gelu", fx, fy),
                         lambda t=t: qrt.set_num_threads(t)) for build, op in ops.items()]
            entries.append((f"gelu {s} torch", t, lambda tx=tx: torch.nn.functional.gelu(tx),
                            lambda t=t: torch.set_num_threads(t)))
    return time_by_threads(entries, min_time=0.01, repeats=7)


def main() -> None:
    parsed = ab_builds(__file__, __doc__, [1, 2], one_round)
    if parsed is None:  # the child process: it printed its round
        return
    args, runs = parsed
    builds = args.build
    ts = [str(t) for t in args.threads]
    cases = list(runs[next(iter(builds))][0])
    print(f"{'case (ns an element)':34s}" + "".join(f"{f'{n} {t}thr':>14s}" for t in ts for n in [*builds, "torch"]))
    summary: dict = {}
    for shape in SHAPES:
        size = shape[0] * shape[1] * shape[2]
        s = "x".join(map(str, shape))
        for case in [c for c in cases if c.startswith(f"gelu {s} ") and not c.endswith(" torch")]:
            med = {(n, t): round_median(runs[n], case, t) for t in ts for n in builds}
            for t in ts:
                med["torch", t] = round_median([run for n in builds for run in runs[n]], f"gelu {s} torch", t)
            summary[case] = {n: {t: med[n, t] * 1e9 / size for t in ts} for n in [*builds, "torch"]}
            print(f"{case:34s}" + "".join(f"{med[n, t] * 1e9 / size:14.3f}" for t in ts for n in [*builds, "torch"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "builds": builds, "ns_per_element": summary},
                      f, indent=1)


if __name__ == "__main__":
    main()
