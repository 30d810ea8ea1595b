"""Dynamic quantized LSTM and GRU sequences: qrt against PyTorch (and ONNX Runtime for LSTM).

    python bench/bench_recurrent.py [--quick] [--threads N] [--json out.json]

100-step sequences, input 128, hidden 256 and 1024, batch 1 and 32, then
single LSTMCell / GRUCell steps (hidden 256, batch 1 and 32; ONNX Runtime
runs its LSTM for one step), one thread for every runtime unless --threads
says otherwise. Each figure is the median time per whole-sequence call (15 samples
of >= 20 ms each after warm-up), also shown per step. Ratios are
other / qrt: above 1 means qrt is faster. ONNX Runtime runs its own
`quantize_dynamic` of the same float LSTM (`DynamicQuantizeLSTM`); it has no
quantized GRU, so GRU rows compare with PyTorch only.
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
from harness import fmt_time, machine, time_call, write_json  # noqa: E402
from qrt_testing import cell_model_file, dynamic_weight, quantized_copy  # noqa: E402

import qrt  # noqa: E402
from qrt.builder import GraphBuilder  # noqa: E402
from qrt.ops import layer_prefix  # noqa: E402

warnings.simplefilter("ignore")
STEPS, INPUT = 100, 128


def qrt_model(path: str, kind: str, qlayer, hidden: int) -> qrt.Model:
    wb = qlayer._weight_bias()
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [STEPS, None, INPUT])}
    for side in ("ih", "hh"):
        prefix = layer_prefix(0, False) + f"{side}_"
        ports.update(dynamic_weight(wb["weight"][f"weight_{side}_l0"], wb["bias"][f"bias_{side}_l0"], prefix))
    g.output(*g.node(f"{kind}_dynamic", ports, name="seq"))
    g.save(path)
    return qrt.load(path)


def lstm_of_cell(cell: torch.nn.LSTMCell) -> torch.nn.LSTM:
    """A one-layer float LSTM with the cell's weights (what ONNX Runtime runs for one step)."""
    layer = torch.nn.LSTM(cell.input_size, cell.hidden_size)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(layer, f"{name}_l0").data.copy_(getattr(cell, name).data)
    return layer


def ort_lstm(path: str, float_lstm: torch.nn.LSTM, threads: int, steps: int = STEPS):
    """ONNX Runtime's dynamic quantization of the same float LSTM, or None if not installed."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        return None
    hidden = float_lstm.hidden_size
    order = [0, 3, 1, 2]  # torch gates i, f, g, o -> ONNX i, o, f, c

    def gates(t):
        chunks = t.detach().numpy().reshape(4, hidden, -1)
        return chunks[order].reshape(4 * hidden, -1)

    w = gates(float_lstm.weight_ih_l0)[None]
    r = gates(float_lstm.weight_hh_l0)[None]
    b = np.concatenate([gates(float_lstm.bias_ih_l0[:, None])[:, 0], gates(float_lstm.bias_hh_l0[:, None])[:, 0]])[None]
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=hidden)
    graph = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, "batch", INPUT])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a.astype(np.float32), n) for a, n in ((w, "W"), (r, "R"), (b, "B"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what released onnxruntime builds read
    float_path, quant_path = path + ".float.onnx", path + ".quant.onnx"
    onnx.save(model, float_path)
    quantize_dynamic(float_path, quant_path, weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(quant_path, options, providers=["CPUExecutionProvider"])


def measure(model, qlayer, session, batch: int, repeats: int) -> tuple:
    """Median seconds per sequence for qrt, torch and (if any) onnxruntime on the same input."""
    x = np.random.default_rng(0).standard_normal((STEPS, batch, INPUT)).astype(np.float32)
    tx = torch.from_numpy(x)
    t_q = time_call(lambda: model.run(x), repeats=repeats)
    t_t = time_call(lambda: qlayer(tx), repeats=repeats)
    t_o = time_call(lambda: session.run(None, {"X": x}), repeats=repeats) if session else None
    return t_q, t_t, t_o


def measure_cell(kind: str, model, qcell, session, batch: int, repeats: int) -> tuple:
    """Median seconds per cell step for qrt, torch and (if any) onnxruntime's one-step LSTM."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, INPUT)).astype(np.float32)
    h, c = (rng.standard_normal((batch, qcell.hidden_size)).astype(np.float32) * 0.5 for _ in range(2))
    tx, th, tc = torch.from_numpy(x), torch.from_numpy(h), torch.from_numpy(c)
    if kind == "lstm":
        t_q = time_call(lambda: model.run({"x": x, "h": h, "c": c}), repeats=repeats)
        t_t = time_call(lambda: qcell(tx, (th, tc)), repeats=repeats)
    else:
        t_q = time_call(lambda: model.run({"x": x, "h": h}), repeats=repeats)
        t_t = time_call(lambda: qcell(tx, th), repeats=repeats)
    t_o = time_call(lambda: session.run(None, {"X": x[None]}), repeats=repeats) if session else None
    return t_q, t_t, t_o


def report(rows: list, name: str, times: tuple, steps: int) -> None:
    t_q, t_t, t_o = times
    rows.append({"case": name, "steps": steps, "qrt_s": t_q, "torch_s": t_t, "ort_s": t_o})
    ort_cols = f"{fmt_time(t_o)} ({fmt_time(t_o / steps).strip()}) {t_o / t_q:7.2f}x" if t_o else "-"
    print(
        f"{name:28s} {fmt_time(t_q)} ({fmt_time(t_q / steps).strip():>9s}) "
        f"{fmt_time(t_t)} ({fmt_time(t_t / steps).strip():>9s}) {t_t / t_q:8.2f}x {ort_cols}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--threads", type=int, default=1, help="threads for each runtime (default 1)")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    qrt.set_num_threads(args.threads)
    repeats = 5 if args.quick else 15
    info = machine()
    print(f"machine: {info.get('cpu')} | {info['cores']} CPUs | {info['threads_note']}"
          f" | flags {' '.join(info.get('flags', []))} | qrt kernels {info['qrt_kernels']} | torch {torch.__version__}"
          f" (capability {torch.backends.cpu.get_cpu_capability()})")
    print(f"{STEPS}-step sequences, input {INPUT}, {args.threads} thread(s) each; per-step times in brackets")
    print(f"{'case':28s} {'qrt':>22s} {'torch':>22s} {'torch/qrt':>9s} {'onnxruntime':>22s} {'ort/qrt':>8s}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for kind, layer in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
            for hidden in (256, 1024):
                torch.manual_seed(0)
                float_layer = layer(INPUT, hidden)
                qlayer = quantized_copy(float_layer, torch.qint8, False)
                path = os.path.join(tmp, f"{kind}{hidden}.qrt")
                model = qrt_model(path, kind, qlayer, hidden)
                session = ort_lstm(path, float_layer, args.threads) if kind == "lstm" else None
                for batch in (1, 32):
                    report(rows, f"{kind} H={hidden} B={batch}", measure(model, qlayer, session, batch, repeats), STEPS)
        for kind, cell in (("lstm", torch.nn.LSTMCell), ("gru", torch.nn.GRUCell)):
            torch.manual_seed(0)
            float_cell = cell(INPUT, 256)
            qcell = quantized_copy(float_cell, torch.qint8, False)
            path = os.path.join(tmp, f"{kind}_cell.qrt")
            cell_model_file(path, kind, qcell)
            model = qrt.load(path)
            session = ort_lstm(path, lstm_of_cell(float_cell), args.threads, 1) if kind == "lstm" else None
            for batch in (1, 32):
                times = measure_cell(kind, model, qcell, session, batch, repeats)
                report(rows, f"{kind}_cell H=256 B={batch}", times, 1)
    if args.json:
        write_json(args.json, {"machine": info, "steps": STEPS, "input": INPUT, "threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
