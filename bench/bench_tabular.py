"""A tabular MLP with BatchNorm1d: qrt, PyTorch and ONNX Runtime, one thread, in one run.

    python bench/bench_tabular.py [--quick] [--json out.json]

The model is the common tabular classifier: Linear(64, 256), ReLU, BatchNorm1d(256), Dropout, Linear(256, 128),
ReLU, BatchNorm1d(128), Linear(128, 10), with running statistics far from their defaults. Each runtime runs its
own quantization of it (Linear weights int8, activations quantized per call):
- qrt: torch's quantize_dynamic model, saved whole and converted (batch_norm, format version 11);
- torch: that quantize_dynamic model;
- onnxruntime: the float model exported by torch.onnx.export, quantized by onnxruntime.quantization.quantize_dynamic,
  one-thread InferenceSession (bench_models.ort_session).

qrt's outputs are checked bit for bit against torch's first (where torch runs its AVX2 or AVX512 kernels), ONNX
Runtime's max |diff| printed. Figures are medians of interleaved samples (harness.time_calls); ratios are torch / qrt
and ORT / qrt (above 1: qrt is faster). Batch 1 (one request) and 256 (a scoring batch).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from bench_models import ort_session  # noqa: E402
from harness import fmt_time, machine, machine_line, time_calls, write_json  # noqa: E402

import qrt  # noqa: E402
from tools.convert import convert  # noqa: E402

warnings.simplefilter("ignore")
FEATURES = 64


def tabular_mlp() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.BatchNorm1d(256), nn.Dropout(0.2),
                          nn.Linear(256, 128), nn.ReLU(), nn.BatchNorm1d(128), nn.Linear(128, 10)).eval()
    with torch.no_grad():
        for bn in (model[2], model[6]):
            bn.running_mean.uniform_(0, 2)
            bn.running_var.uniform_(0.5, 3)
            bn.weight.normal_(1, 0.2)
            bn.bias.normal_(0, 0.2)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    float_model = tabular_mlp()
    q = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear}, dtype=torch.qint8)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(q, os.path.join(tmp, "q.pt"))
        convert(os.path.join(tmp, "q.pt"), os.path.join(tmp, "q.qrt"), input_shapes=[f"2,{FEATURES}"],
                trust_checkpoint=True)
        model = qrt.load(os.path.join(tmp, "q.qrt"))
        session, _ = ort_session(tmp, "tabular", float_model, (torch.randn(2, FEATURES),),
                                 {"input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}})
    import onnxruntime

    info = machine()
    print(machine_line(info, onnxruntime.__version__, "1 thread"))
    rows = []
    for batch in (1, 256):
        x = np.random.default_rng(batch).standard_normal((batch, FEATURES)).astype(np.float32)
        xt = torch.from_numpy(x)
        with torch.no_grad():
            want = q(xt).numpy()
        got, ort_out = model.run(x), session.run(None, {"x": x})[0]
        exact = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
        if exact and not np.array_equal(got, want):
            raise SystemExit(f"qrt differs from torch at batch {batch}: {np.abs(got - want).max()}")

        def torch_call(xt=xt) -> None:
            with torch.no_grad():
                q(xt)

        qrt_t, torch_t, ort_t = time_calls([lambda x=x: model.run(x), torch_call,
                                            lambda x=x: session.run(None, {"x": x})],
                                           repeats=7 if args.quick else 25)
        rows.append({"batch": batch, "qrt_s": qrt_t, "torch_s": torch_t, "ort_s": ort_t,
                     "torch_over_qrt": torch_t / qrt_t, "ort_over_qrt": ort_t / qrt_t,
                     "qrt_equals_torch": bool(np.array_equal(got, want)),
                     "ort_max_diff": float(np.abs(ort_out - want).max())})
        print(f"batch {batch:3d}: qrt {fmt_time(qrt_t)}  torch {fmt_time(torch_t)}  ort {fmt_time(ort_t)}  "
              f"torch/qrt {torch_t / qrt_t:5.2f}  ort/qrt {ort_t / qrt_t:5.2f}  qrt == torch: "
              f"{np.array_equal(got, want)}  ort max |diff| {rows[-1]['ort_max_diff']:.1e}")
    if args.json:
        write_json(args.json, {"machine": info, "results": rows})


if __name__ == "__main__":
    main()
