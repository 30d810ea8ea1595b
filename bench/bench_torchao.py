"""torchao quantize_ Linears on the CPU: qrt's linear_dynamic (activation per_row_symmetric) against torchao's own
forward (Int8DynamicActivationInt8WeightConfig), and qrt's weight-only lowering against Int8WeightOnlyConfig, the
same weights and inputs, timed interleaved (harness.time_calls), one thread each.

    PYTHONPATH=. .venv/bin/python bench/bench_torchao.py [--shapes 4096x1024,1024x4096] [--batches 1,64]

A shape KxN is in_features x out_features. The outputs are checked first: bit for bit for the dynamic scheme,
within the weight-only reordering bound otherwise (docs/NUMERICS.md section 11). Measured once on a shared 2-core
Xeon (AMX; qrt's amx-int8 variant, torch capability AVX512), other jobs running: dynamic 4.0x torchao at M=1 and
3.8x at M=64 for K=4096 N=1024 (146 against 584 us, 332 us against 1.24 ms); weight-only 4.5x and 1.45x.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from torch import nn
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import fmt_time, machine, machine_line, time_calls  # noqa: E402

import qrt  # noqa: E402
from qrt.builder import GraphBuilder  # noqa: E402
from tools.torchao_frontend import DYNAMIC, describe_linear  # noqa: E402


def qrt_file(path: str, m: nn.Linear) -> None:
    """The node(s) the converter writes for a torchao Linear (tools/torchao_frontend.py)."""
    layer = describe_linear(m)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, m.in_features])
    if layer.mode == DYNAMIC:
        y = g.node("linear_dynamic", {"x": x, **layer.weight.ports(), "bias": layer.bias},
                   {"reduce_range": False, "activation": DYNAMIC})
    else:
        y = g.node("linear_dynamic", {"x": x, "weight": layer.weight.values.astype(np.float16)})
        y = g.node("add", {"a": g.node("mul", {"a": y, "b": layer.weight.scale}), "b": layer.bias})
    g.output(y)
    g.save(path)


def contenders(lin: nn.Linear, model: qrt.Model, x: np.ndarray) -> list:
    """torchao's forward and qrt's run on the same input."""
    xt = torch.from_numpy(x)

    def torchao_call() -> object:
        with torch.no_grad():
            return lin(xt)

    return [torchao_call, lambda: model.run({"x": x})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x1024,1024x4096", help="KxN (in x out) list")
    ap.add_argument("--batches", default="1,64")
    args = ap.parse_args()
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    print(machine_line(machine(), None, "one thread each"))
    folder = tempfile.mkdtemp()
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for config in (Int8DynamicActivationInt8WeightConfig(), Int8WeightOnlyConfig()):
            torch.manual_seed(0)
            lin = nn.Linear(k, n).eval()
            quantize_(lin, config)
            path = os.path.join(folder, "l.qrt")
            qrt_file(path, lin)
            model = qrt.load(path)
            for m in (int(b) for b in args.batches.split(",")):
                x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
                with torch.no_grad():
                    ref = lin(torch.from_numpy(x)).numpy()
                got = model.run({"x": x})
                diff = float(np.max(np.abs(got - ref)))
                if isinstance(config, Int8DynamicActivationInt8WeightConfig) and diff != 0:
                    raise SystemExit(f"qrt differs from torchao by {diff} at M={m} K={k} N={n}")
                t_ao, t_qrt = time_calls(contenders(lin, model, x))
                print(f"{type(config).__name__:38s} M={m:3d} K={k:5d} N={n:5d}  torchao {fmt_time(t_ao)}  "
                      f"qrt {fmt_time(t_qrt)}  {t_ao / t_qrt:5.2f}x  (max |diff| {diff:.2g})")


if __name__ == "__main__":
    main()
