"""Whether qrt's float steps gain from splitting across threads at BERT's sizes, per float build: each op on 1
thread, on 2 threads as one task, and on 2 threads split by rows (qrt._kernels._set_min_float_work(1)); and each
step's time per element over an add's at 1 thread (_float_ops.pxi's FLOAT_COSTS). Each kernel variant runs in its
own process (QRT_KERNELS picks the float build: amx-int8 / avx512-vnni avx512, avx2 fma, portable); within a
process the samples of every case interleave.

    PYTHONPATH=. python bench/float_split.py --variants avx512-vnni avx2 portable

Figures: the fastest sample's microseconds per call (samples of 2 ms, interleaved: on a machine other jobs share,
a sample's time only grows with their load, and a 2-thread sample needs both CPUs free at once). The add is
FloatOps.binary's (both operands of one shape), "add+ln" the layer_norm step that forms the residual add itself
(plan.py's fusion).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(32, 384), (64, 384), (128, 384), (128, 1536)]  # BERT at batch 1: 32 to 128 tokens
UNARY = ["gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "sqrt", "rsqrt", "log", "sin", "cos"]
MODES = {"1": (1, None), "2 one": (2, 1 << 40), "2 split": (2, 1)}  # threads, work per task (None: as built)


def one_variant(min_time: float, repeats: int) -> dict:
    """{case: {mode: seconds}} in this process's build."""
    sys.path.insert(0, HERE)
    import numpy as np
    from harness import time_calls

    import qrt
    from qrt import _kernels as K

    ops, rng = K.FloatOps(), np.random.default_rng(0)
    cases: list[tuple[str, object]] = []
    for shape in SHAPES:
        s = "x".join(map(str, shape))
        x, r = (rng.standard_normal((2, *shape)) * 3).astype(np.float32)
        w, b = rng.standard_normal((2, shape[-1])).astype(np.float32)
        y = np.empty_like(x)
        fx, fy, fa = x.reshape(-1), y.reshape(-1), np.abs(x).reshape(-1)  # sqrt's negatives: libm's errno path
        positive = ("sqrt", "rsqrt", "log")
        cases += [(f"{op} {s}", lambda op=op, fx=fa if op in positive else fx, fy=fy: ops.unary(op, fx, fy))
                  for op in UNARY]
        cases.append((f"add {s}", lambda x=x, r=r, y=y: ops.binary("add", x, r, y)))
        cases.append((f"layer_norm {s}", lambda x=x, w=w, b=b, y=y: ops.layer_norm(x, w, b, 1e-12, y)))
        cases.append((f"add+ln {s}", lambda x=x, r=r, w=w, b=b, y=y: ops.layer_norm(x, w, b, 1e-12, y, add=r)))
    built = K._set_min_float_work(1)
    K._set_min_float_work(built)

    def setup(threads: int, work: int | None):
        def set_mode():
            qrt.set_num_threads(threads)
            K._set_min_float_work(built if work is None else work)
        return set_mode

    entries = [(name, mode, fn, setup(*MODES[mode])) for mode in MODES for name, fn in cases]
    times = time_calls([e[2] for e in entries], min_time=min_time, repeats=repeats, setups=[e[3] for e in entries],
                       statistic=min)
    out: dict = {"build": ops.name}
    for (name, mode, *_), t in zip(entries, times):
        out.setdefault(name, {})[mode] = t
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["avx512-vnni", "avx2", "portable"])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_variant(0.002, args.repeats)))
        return
    results = {}
    for variant in args.variants:
        env = {**os.environ, "QRT_KERNELS": variant}
        cmd = [sys.executable, __file__, "--one", "--repeats", str(args.repeats)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        res = results[variant] = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"\n{variant} (float build {res.pop('build')}), us per call; cost: per element over add's, 1 thread")
        print(f"{'case':22s}" + "".join(f"{m:>10s}" for m in MODES) + f"{'split gain':>12s}{'cost':>8s}")
        for name, t in res.items():
            op, shape = name.split(" ")
            cost = t["1"] / res[f"add {shape}"]["1"]
            print(f"{name:22s}" + "".join(f"{t[m] * 1e6:10.1f}" for m in MODES)
                  + f"{t['2 one'] / t['2 split']:11.2f}x{cost:8.1f}")
    print(f"\nload average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
