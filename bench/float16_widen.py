"""The float16 dynamic Linear with its weights widened to float32 once per slice for the row tiles that share them,
against the same layer reading them as they lie, and against torch's float16 dynamic Linear (fbgemm), in one
process: every case's samples interleave, at each thread count, per kernel variant.

    PYTHONPATH=. python bench/float16_widen.py [--variants avx512-vnni avx2] [--threads 1 2] [--json out.json]

qrt._kernels._set_fp_widen picks the slice of the layers loaded next (0: never widen; 128: what
qrt_fp_widen_default gives on Intel x86 and in the portable variant); the bits are the same (the tests prove it).
Figures: medians of the interleaved samples, microseconds a call; "gain" is as-stored time over widened time,
"torch" torch's time over widened time (above 1: qrt is faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_cpu import dynamic_linear_case  # noqa: E402
from harness import machine, machine_line, time_calls, write_json  # noqa: E402

import qrt  # noqa: E402
from qrt import _kernels as K  # noqa: E402

# (M, K, N): a row tile alone (no widening), the fewest tiles that widen, and bench_cpu's and the encoders' shapes
SHAPES = [(8, 1024, 1024), (32, 1024, 1024), (64, 1024, 1024), (512, 1024, 1024), (64, 4096, 4096),
          (128, 384, 1536), (128, 1536, 384), (512, 256, 256)]


def _threads_setup(t: int):
    """Before each sample: t threads for qrt and torch."""
    return lambda: (qrt.set_num_threads(t), torch.set_num_threads(t))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=[K.kernel_variant()])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    info = machine()
    default = K.PackedFloat(np.zeros((1, 1), np.float32)).widen
    print(machine_line(info, None, f"float16 widening slice by default here: {default}"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            before = K._use_variant(variant)
            entries = []  # (case, threads, contender, fn)
            for m, k, n in SHAPES:
                case = f"M={m} K={k} N={n}"
                fns = {}
                for name, widen in (("as stored", 0), ("widened", K.F16_WIDEN_MAX)):
                    old = K._set_fp_widen(widen)
                    run_qrt, run_torch, _ = dynamic_linear_case(tmp, 1, m, k, n, "float16")
                    K._set_fp_widen(old)
                    fns[name] = run_qrt
                fns["torch"] = run_torch
                for t in args.threads:
                    entries += [(case, t, name, fn) for name, fn in fns.items()]
            K._use_variant(before)
            times = time_calls([fn for *_, fn in entries], repeats=args.repeats,
                               setups=[_threads_setup(t) for _, t, _, _ in entries])
            got: dict = {}
            for (case, t, name, _), s in zip(entries, times):
                got.setdefault((case, t), {})[name] = s
            print(f"\n{variant}\n{'case':24s}{'thr':>4s}{'as stored':>11s}{'widened':>10s}{'gain':>7s}"
                  f"{'torch us':>10s}{'torch':>7s}")
            for (case, t), r in got.items():
                gain, vs_torch = r["as stored"] / r["widened"], r["torch"] / r["widened"]
                print(f"{case:24s}{t:4d}{r['as stored'] * 1e6:11.1f}{r['widened'] * 1e6:10.1f}{gain:7.3f}"
                      f"{r['torch'] * 1e6:10.1f}{vs_torch:7.3f}")
                rows.append({"variant": variant, "case": case, "threads": t, "as_stored_s": r["as stored"],
                             "widened_s": r["widened"], "torch_s": r["torch"]})
    if args.json:
        write_json(args.json, {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
