"""qrt against PyTorch's quantized CPU engine on the same shapes, in one run.

    python bench/bench_cpu.py [--quick] [--json out.json]

Each figure is the median over 15 samples of the time per call (each sample
repeats the call for >= 20 ms after warm-up). The ratio is PyTorch time /
qrt time: above 1 means qrt is faster. Both sides get the same float32
inputs and produce the same results (the tests prove bit-exactness).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from harness import fmt_time, machine, time_call, write_json  # noqa: E402
from qrt_testing import dynamic_weight, quantized_copy  # noqa: E402

import qrt  # noqa: E402
from qrt.builder import GraphBuilder  # noqa: E402

warnings.simplefilter("ignore")


def dynamic_linear_case(tmp: str, m: int, k: int, n: int, per_channel: bool):
    ref = quantized_copy(torch.nn.Linear(k, n), torch.qint8, per_channel)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, k])
    g.output(g.node("linear_dynamic", {"x": x, **dynamic_weight(ref.weight(), ref.bias())}))
    path = os.path.join(tmp, f"lin_{m}_{k}_{n}.qrt")
    g.save(path)
    model = qrt.load(path)
    xs = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
    tx = torch.from_numpy(xs)
    return (lambda: model.run(xs)), (lambda: ref(tx))


def rnn_cell_case(tmp: str, batch: int, input_size: int, hidden: int):
    qcell = quantized_copy(torch.nn.RNNCell(input_size, hidden), torch.qint8, False)
    wb = qcell._weight_bias()
    g = GraphBuilder()
    x = g.input("x", "float32", [None, input_size])
    h = g.input("h", "float32", [None, hidden])
    ports = {
        "x": x,
        "h": h,
        **dynamic_weight(wb["weight"]["weight_ih"], wb["bias"]["bias_ih"], "ih_"),
        **dynamic_weight(wb["weight"]["weight_hh"], wb["bias"]["bias_hh"], "hh_"),
    }
    g.output(g.node("rnn_cell_dynamic", ports))
    path = os.path.join(tmp, f"cell_{batch}_{input_size}_{hidden}.qrt")
    g.save(path)
    model = qrt.load(path)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((batch, input_size)).astype(np.float32)
    hs = rng.standard_normal((batch, hidden)).astype(np.float32) * 0.5
    tx, th = torch.from_numpy(xs), torch.from_numpy(hs)
    return (lambda: model.run((xs, hs))), (lambda: qcell(tx, th))


def cases(quick: bool):
    sizes = [256, 1024, 4096]
    for k in sizes:
        for m in (1, 64):
            yield f"linear_dynamic qint8 M={m} K=N={k}", dynamic_linear_case, (m, k, k, False)
    for hidden in (256, 1024):
        yield f"rnn_cell_dynamic B=1 I={hidden} H={hidden}", rnn_cell_case, (1, hidden, hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter measurements")
    parser.add_argument("--threads", type=int, default=1, help="threads for PyTorch (qrt is single-threaded)")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info = machine()
    print(f"machine: {info.get('cpu')} | {info['cores']} cores | flags {' '.join(info.get('flags', []))}")
    print(f"torch {torch.__version__} ({torch.backends.quantized.engine}), threads={args.threads}")
    print(f"{'case':44s} {'qrt':>11s} {'torch':>11s} {'torch/qrt':>9s}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name, make, params in cases(args.quick):
            run_qrt, run_torch = make(tmp, *params)
            t_q = time_call(run_qrt, repeats=7 if args.quick else 15)
            t_t = time_call(run_torch, repeats=7 if args.quick else 15)
            rows.append({"case": name, "qrt_s": t_q, "torch_s": t_t, "ratio": t_t / t_q})
            print(f"{name:44s} {fmt_time(t_q)} {fmt_time(t_t)} {t_t / t_q:8.2f}x", flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(f"geometric mean torch/qrt: {geo:.2f}x")
    if args.json:
        write_json(args.json, {"machine": info, "threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
