"""Batch-1 whole-model latency: qrt per node, qrt's execution plan, PyTorch and ONNX Runtime, in one run.

    python bench/bench_plan.py [--quick] [--json out.json]

Cases (one thread for every runtime):
- MLP 256-512-512-10 (Linear-ReLU-Linear-ReLU-Linear, dynamic int8), batch 1, the whole call;
- LSTMCell and GRUCell, input 128, hidden 256, batch 1, one step (ONNX Runtime: its quantize_dynamic of
  the same float LSTM run for one step, DynamicQuantizeLSTM; it has no quantized GRU);
- per-call overhead: a model of one small node (ReLU of 16 values) against ONNX Runtime's
  InferenceSession.run on an Identity model of the same input.

"qrt per node" runs each node's Python step in turn (the interpreter, qrt/interpreter.py: what a plan runs
for new input shapes); "qrt run" is Model.run, which runs a compiled plan (qrt/plan.py: one native call), and
"qrt stream" a cell stepped by Model.stream (the state stays inside). Figures are medians of interleaved
samples (bench/harness.py time_calls), so every runtime sees the same machine load; ratios are ORT time /
qrt time (above 1: qrt is faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from bench_cpu import _ort_mlp, ort, quantized_mlp  # noqa: E402
from bench_recurrent import lstm_of_cell, ort_lstm  # noqa: E402
from harness import fmt_time, machine, machine_line, time_calls, write_json  # noqa: E402
from qrt_testing import cell_model_file, quantized_copy  # noqa: E402

import qrt  # noqa: E402
from qrt.builder import GraphBuilder  # noqa: E402

warnings.simplefilter("ignore")


def per_node(model: qrt.Model, inputs):
    """The model without its plan: input binding, then each node's Python step in turn."""
    return lambda: model._plan._per_node(model._bind(inputs))


def mlp(tmp: str):
    sizes = (256, 512, 512, 10)
    linears, ref, g = quantized_mlp(sizes)
    path = os.path.join(tmp, "mlp.qrt")
    g.save(path)
    model = qrt.load(path)
    x = np.random.default_rng(0).standard_normal((1, sizes[0])).astype(np.float32)
    tx = torch.from_numpy(x)
    assert model.run(x).tobytes() == model.run(x).tobytes() == per_node(model, x)()[0].tobytes()
    runs = {"qrt per node": per_node(model, x), "qrt run": lambda: model.run(x), "torch": lambda: ref(tx)}
    if ort is not None:
        sess = _ort_mlp(tmp, "mlp", linears, False, 1)
        runs["onnxruntime"] = lambda: sess.run(None, {"x": x})
    return runs


def cell(tmp: str, kind: str):
    torch.manual_seed(0)
    float_cell = (torch.nn.LSTMCell if kind == "lstm" else torch.nn.GRUCell)(128, 256)
    qcell = quantized_copy(float_cell, torch.qint8, False)
    path = os.path.join(tmp, f"{kind}_cell.qrt")
    cell_model_file(path, kind, qcell)
    model = qrt.load(path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 128)).astype(np.float32)
    h, c = (rng.standard_normal((1, 256)).astype(np.float32) * 0.5 for _ in range(2))
    tx, th, tc = torch.from_numpy(x), torch.from_numpy(h), torch.from_numpy(c)
    feed = {"x": x, "h": h, "c": c} if kind == "lstm" else {"x": x, "h": h}
    stream = model.stream()
    got = model.run(feed)
    for a, b in zip(got if isinstance(got, tuple) else (got,), per_node(model, feed)()):
        assert a.tobytes() == b.tobytes()
    runs = {
        "qrt per node": per_node(model, feed),
        "qrt run": lambda: model.run(feed),
        "qrt stream": lambda: stream.step(x),
        "torch": (lambda: qcell(tx, (th, tc))) if kind == "lstm" else (lambda: qcell(tx, th)),
    }
    if kind == "lstm" and ort is not None:
        session = ort_lstm(path, lstm_of_cell(float_cell), 1, 1)
        runs["onnxruntime"] = lambda: session.run(None, {"X": x[None]})
    return runs


def overhead(tmp: str):
    g = GraphBuilder()
    g.output(g.node("relu", {"x": g.input("x", "float32", [None, 16])}))
    path = os.path.join(tmp, "relu.qrt")
    g.save(path)
    model = qrt.load(path)
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    runs = {"qrt per node": per_node(model, x), "qrt run": lambda: model.run(x)}
    if ort is not None:
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx_model.ir_version = 8
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        runs["onnxruntime"] = lambda: sess.run(None, {"x": x})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    repeats = 7 if args.quick else 21
    info = machine()
    print(machine_line(info, ort and ort.__version__, "1 thread each"))
    names = ["qrt per node", "qrt run", "qrt stream", "torch", "onnxruntime"]
    print(f"{'case':34s}" + "".join(f"{n:>14s}" for n in names) + f"{'ort/run':>10s}{'ort/stream':>11s}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        cases = [("MLP 256-512-512-10, batch 1", lambda: mlp(tmp)),
                 ("LSTMCell 128->256 step, batch 1", lambda: cell(tmp, "lstm")),
                 ("GRUCell 128->256 step, batch 1", lambda: cell(tmp, "gru")),
                 ("one small node (ORT: Identity)", lambda: overhead(tmp))]
        for name, make in cases:
            runs = make()
            times = dict(zip(runs, time_calls(list(runs.values()), repeats=repeats)))
            t_o = times.get("onnxruntime")
            ratio = f"{t_o / times['qrt run']:10.2f}" if t_o else f"{'-':>10s}"
            ratio_s = f"{t_o / times['qrt stream']:11.2f}" if t_o and "qrt stream" in times else f"{'-':>11s}"
            print(f"{name:34s}" + "".join(f"{fmt_time(times[n]) if n in times else '-':>14s}" for n in names)
                  + ratio + ratio_s, flush=True)
            rows.append({"case": name, **{f"{n}_s": times.get(n) for n in names}})
    if args.json:
        write_json(args.json, {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
