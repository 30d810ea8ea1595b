"""Two builds of qrt (say, before and after a threading change) at several thread counts, with PyTorch beside
them, on the cases of issue 35: each build runs in its own process, the builds alternating round by round
so that both see the same machine load; within a process the samples of every thread count interleave.

    python bench/threads_ab.py --build before=/tmp/qrt-before --build after=. --threads 1 2 4 16 --rounds 3

A build is a checkout with its extension built in place (make build). Figures: medians over the rounds of
each round's median time per call.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from harness import ab_builds, round_median

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [
    ("dynamic int8 M=64 K=N=1024", "dynamic_linear_case", (64, 1024, 1024, "per_tensor")),
    ("dynamic int8 M=512 K=N=1024", "dynamic_linear_case", (512, 1024, 1024, "per_tensor")),
    ("dynamic int8 M=1 K=N=4096", "dynamic_linear_case", (1, 4096, 4096, "per_tensor")),
    ("dynamic int8 M=64 K=N=256", "dynamic_linear_case", (64, 256, 256, "per_tensor")),
    ("rnn_cell step B=32 I=128 H=256", "rnn_cell_case", (32, 128, 256)),
    ("MLP 256-512-512-10 M=1", "mlp_case", (1, (256, 512, 512, 10))),
]


def one_round(threads: list[int]) -> dict:
    """In the build on sys.path: {case: {threads: {"qrt": s, "torch": s}}}."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import bench_cpu
    import torch
    from harness import time_calls

    import qrt

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name, make, params in CASES:
            run_qrt, run_torch, _ = getattr(bench_cpu, make)(tmp, 1, *params)
            fns, setups, keys = [], [], []
            for t in threads:
                fns += [run_qrt, run_torch]
                setups += [lambda t=t: qrt.set_num_threads(t), lambda t=t: torch.set_num_threads(t)]
                keys += [(t, "qrt"), (t, "torch")]
            # after torch on several threads, libgomp's spinning workers hold the CPUs for milliseconds: the
            # next sample starts once they sleep, as in bench_cpu.py
            for i in range(len(keys)):
                if keys[i - 1][1] == "torch" and keys[i - 1][0] > 1:
                    setups[i] = lambda setup=setups[i]: (time.sleep(0.03), setup())
            for (t, who), v in zip(keys, time_calls(fns, repeats=7, setups=setups)):
                out.setdefault(name, {}).setdefault(str(t), {})[who] = v
    return out


def main() -> None:
    parsed = ab_builds(__file__, __doc__, [1, 2, 4, 16], one_round)
    if parsed is None:  # the child process: it printed its round
        return
    args, runs = parsed
    builds = args.build
    ts = [str(t) for t in args.threads]
    head = "".join(f"{t + ' thr':>10s}" for t in ts)
    print(f"{'case':32s} {'build':8s}{head}   torch{head}")
    summary: dict = {}
    for case, _, _ in CASES:
        for name in builds:
            med = {who: [round_median(runs[name], case, t, who) for t in ts]
                   for who in ("qrt", "torch")}
            summary.setdefault(case, {})[name] = {who: dict(zip(ts, v)) for who, v in med.items()}
            print(f"{case:32s} {name:8s}" + "".join(f"{v * 1e6:10.1f}" for v in med["qrt"]) + "     "
                  + "".join(f"{v * 1e6:10.1f}" for v in med["torch"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "builds": builds, "seconds": summary}, f,
                      indent=1)


if __name__ == "__main__":
    main()
