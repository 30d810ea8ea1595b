"""qrt against PyTorch's quantized CPU engine (and ONNX Runtime, when installed) on the same shapes, in one run.

    python bench/bench_cpu.py [--quick] [--threads 1 2 4 8 16 all] [--only SUBSTRING] [--rows 16 64] [--json out.json]

Each figure is the median over the samples of the time per call (each sample
repeats the call for >= 20 ms, after warm-up; the samples of qrt, PyTorch and
ONNX Runtime, at every thread count, are interleaved so that all see the same machine load);
--quick takes fewer and shorter (10 ms) samples and a subset of the shapes. The ratios are
PyTorch time / qrt time and ONNX Runtime time / qrt time: above 1 means qrt is faster. The thread-scaling table
at the end shows each case's time at every thread count side by side. qrt and PyTorch get the
same inputs and produce the same results (the tests prove bit-exactness);
ONNX Runtime runs the same float layer quantized by its own quantize_dynamic
(its own rounding), for speed only. Every run is timed with the thread count
of its section given to all three (qrt.set_num_threads, torch.set_num_threads,
ORT intra_op_num_threads).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from harness import fmt_time, machine, time_calls, write_json  # noqa: E402
from qrt_testing import dynamic_weight, qparams, quantized_copy  # noqa: E402

import qrt  # noqa: E402
from qrt import _kernels  # noqa: E402
from qrt.builder import GraphBuilder  # noqa: E402

warnings.simplefilter("ignore")
logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on pre-processing

try:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
except ImportError:  # ONNX Runtime is optional
    ort = None

SHAPES = [(256, 256), (1024, 1024), (4096, 4096), (1024, 4096)]
ROWS = [1, 8, 64, 512]
CELLS = [(64, 128), (128, 256), (512, 1024)]


def _load(g: GraphBuilder, tmp: str, name: str) -> qrt.Model:
    path = os.path.join(tmp, name + ".qrt")
    g.save(path)
    return qrt.load(path)


def _rows(m: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


# ------------------------------------------------------------------ ONNX Runtime side


def _ort_session(tmp: str, name: str, graph, per_channel: bool, threads: int):
    """quantize_dynamic (QInt8 weights) of a float ONNX graph, as an InferenceSession."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, dst = os.path.join(tmp, name + ".onnx"), os.path.join(tmp, name + ".q.onnx")
    onnx.save(model, src)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=per_channel)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # ORT's workers spin after each run by default: interleaved with qrt and torch samples, they
    # would hold the cores that the next contender's threads need
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(dst, opts, providers=["CPUExecutionProvider"])


def _ort_mlp(tmp: str, name: str, linears: list[torch.nn.Linear], per_channel: bool, threads: int):
    """x -> Linear (ReLU Linear)* as MatMul + Add nodes."""
    nodes, inits, value = [], [], "x"
    for i, lin in enumerate(linears):
        w = numpy_helper.from_array(lin.weight.detach().numpy().T.copy(), f"w{i}")
        b = numpy_helper.from_array(lin.bias.detach().numpy(), f"b{i}")
        inits += [w, b]
        nodes.append(helper.make_node("MatMul", [value, f"w{i}"], [f"mm{i}"]))
        out = "y" if i == len(linears) - 1 else f"a{i}"
        nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out]))
        if i < len(linears) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            value = f"r{i}"
    k, n = linears[0].in_features, linears[-1].out_features
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        inits,
    )
    return _ort_session(tmp, name, graph, per_channel, threads)


# ------------------------------------------------------------------ cases: (qrt, torch, ort or None)


def dynamic_linear_case(tmp: str, threads: int, m: int, k: int, n: int, kind: str):
    float_linear = torch.nn.Linear(k, n)
    dtype = torch.float16 if kind == "float16" else torch.qint8
    ref = quantized_copy(float_linear, dtype, kind == "per_channel")
    g = GraphBuilder()
    x = g.input("x", "float32", [None, k])
    g.output(g.node("linear_dynamic", {"x": x, **dynamic_weight(ref.weight(), ref.bias())}))
    model = _load(g, tmp, f"lin_{kind}_{k}_{n}")
    xs = _rows(m, k)
    tx = torch.from_numpy(xs)
    run_ort = None
    if ort is not None and kind != "float16":
        sess = _ort_mlp(tmp, f"lin_{kind}_{k}_{n}", [float_linear], kind == "per_channel", threads)
        feed = {"x": xs}
        run_ort = lambda: sess.run(None, feed)  # noqa: E731
    return (lambda: model.run(xs)), (lambda: ref(tx)), run_ort


def static_linear_case(tmp: str, threads: int, m: int, k: int, n: int, relu: bool):
    g_ = torch.Generator().manual_seed(k + n)
    qw = torch.quantize_per_tensor(torch.randn(n, k, generator=g_) * 0.05, float(np.float32(0.002)), 0, torch.qint8)
    b = torch.randn(n, generator=g_)
    ref = (nniq.LinearReLU if relu else nnq.Linear)(k, n)
    ref.set_weight_bias(qw, b)
    ref.scale, ref.zero_point = 0.25, 64
    # 7-bit activations, as torch's x86 qconfigs produce (reduce_range): exact in fbgemm's AVX2 kernel
    # too, so both sides compute the same integers on every CPU (docs/NUMERICS.md)
    x_scale, x_zp = float(np.float32(0.02)), 64
    g = GraphBuilder()
    x = g.input("x", "uint8", [None, k])
    inputs = {
        "x": x,
        "x_scale": np.asarray(x_scale, np.float32),
        "x_zero_point": np.asarray(x_zp, np.int32),
        "weight": qw.int_repr().numpy(),
        **qparams(qw, "weight_"),
        "bias": b.numpy(),
        "y_scale": np.asarray(ref.scale, np.float32),
        "y_zero_point": np.asarray(ref.zero_point, np.int32),
    }
    g.output(g.node("linear", inputs, {"relu": relu}))
    model = _load(g, tmp, f"static_{relu}_{k}_{n}")
    xq = np.random.default_rng(0).integers(0, 128, (m, k), dtype=np.uint8)
    tx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), x_scale, x_zp)
    return (lambda: model.run(xq)), (lambda: ref(tx)), None


def rnn_cell_case(tmp: str, threads: int, batch: int, input_size: int, hidden: int, steps: int = 1):
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
    model = _load(g, tmp, f"cell_{input_size}_{hidden}")
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, batch, input_size)).astype(np.float32)
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32) * 0.5
    tx, th = torch.from_numpy(xs), torch.from_numpy(h0)

    def run_qrt():
        h = h0
        for t in range(steps):
            h = model.run((xs[t], h))
        return h

    def run_torch():
        h = th
        for t in range(steps):
            h = qcell(tx[t], h)
        return h

    return run_qrt, run_torch, None


def quantized_mlp(sizes: tuple[int, ...]) -> tuple[list[torch.nn.Linear], torch.nn.Module, GraphBuilder]:
    """Linear-ReLU-...-Linear of these sizes: its float Linears, torch's quantize_dynamic of it, and the same
    model as a qrt graph (linear_dynamic and relu nodes)."""
    torch.manual_seed(0)
    linears = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    layers: list[torch.nn.Module] = []
    for lin in linears:
        layers += [lin, torch.nn.ReLU()]
    float_model = torch.nn.Sequential(*layers[:-1])
    ref = torch.ao.quantization.quantize_dynamic(float_model, {torch.nn.Linear}, dtype=torch.qint8)
    g = GraphBuilder()
    v = g.input("x", "float32", [None, sizes[0]])
    for q in ref:
        if isinstance(q, torch.nn.ReLU):
            v = g.node("relu", {"x": v})
        else:
            v = g.node("linear_dynamic", {"x": v, **dynamic_weight(q.weight(), q.bias())})
    g.output(v)
    return linears, ref, g


def mlp_case(tmp: str, threads: int, m: int, sizes: tuple[int, ...]):
    """Whole model: Linear-ReLU-Linear-ReLU-Linear, dynamic qint8, through Model.run."""
    linears, ref, g = quantized_mlp(sizes)
    model = _load(g, tmp, "mlp_" + "_".join(map(str, sizes)))
    xs = _rows(m, sizes[0])
    tx = torch.from_numpy(xs)
    run_ort = None
    if ort is not None:
        sess = _ort_mlp(tmp, "mlp", linears, False, threads)
        feed = {"x": xs}
        run_ort = lambda: sess.run(None, feed)  # noqa: E731
    return (lambda: model.run(xs)), (lambda: ref(tx)), run_ort


def cases(quick: bool, rows: list[int] | None = None):
    rows = rows or ([1, 64] if quick else ROWS)
    shapes = [(256, 256), (1024, 1024)] if quick else SHAPES
    for kind in ("per_tensor", "per_channel", "float16"):
        if quick and kind == "per_channel":
            continue
        for k, n in shapes:
            for m in rows:
                yield f"dynamic {kind} M={m} K={k} N={n}", dynamic_linear_case, (m, k, n, kind)
    for relu in (False, True):
        for k, n in shapes:
            for m in rows:
                name = "LinearReLU" if relu else "Linear"
                yield f"static {name} M={m} K={k} N={n}", static_linear_case, (m, k, n, relu)
    for batch in (1, 32):
        for i, h in CELLS[:2] if quick else CELLS:
            yield f"rnn_cell step B={batch} I={i} H={h}", rnn_cell_case, (batch, i, h)
    yield "rnn_cell 100 steps B=1 I=64 H=128", rnn_cell_case, (1, 64, 128, 100)
    yield "model MLP 256-512-512-10 M=1", mlp_case, (1, (256, 512, 512, 10))
    if not quick:
        yield "model MLP 256-512-512-10 M=64", mlp_case, (64, (256, 512, 512, 10))


def thread_scaling(quick: bool, only: str, all_cores: int) -> list[dict]:
    """qrt alone, 1 thread against all cores, samples interleaved: the scaling target of issue 5.

    Without PyTorch's and ONNX Runtime's idle workers between the samples: both keep spinning
    after each call and take the cores that qrt's second thread needs.
    """
    rows = []
    print(f"\nqrt alone, {all_cores} threads over 1 (M >= 64, K and N >= 1024)")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name, make, params in cases(quick):
            if only not in name or not name.startswith(("dynamic", "static")):
                continue
            if not any(f"M={m} " in name for m in (64, 512)) or "K=256" in name:
                continue
            run_qrt = make(tmp, 1, *params)[0]

            def with_threads(n, run=run_qrt):
                qrt.set_num_threads(n)
                run()

            one, many = time_calls([lambda: with_threads(1), lambda: with_threads(all_cores)], repeats=9)
            rows.append({"case": name, "threads": all_cores, "qrt_1_s": one, "qrt_s": many, "speedup": one / many})
            print(f"  {name:44s} {fmt_time(one)} {fmt_time(many)} {one / many:6.2f}x", flush=True)
    qrt.set_num_threads(all_cores)
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _thread_counts(words: list[str] | None, cpus: int) -> list[int]:
    """--threads: counts, "all" for the CPUs qrt found (affinity mask and cgroup quota); default 1, 2, 4,
    8, 16 and all."""
    words = words or ["1", "2", "4", "8", "16", "all"]
    return sorted({cpus if w == "all" else int(w) for w in words})


def time_case(tmp: str, name: str, make, params, thread_counts: list[int], min_time: float,
              repeats: int) -> list[dict]:
    """One case at every thread count, its qrt, torch and ORT samples all interleaved (each sample run
    at its own thread count): rows of medians, one per thread count."""
    run_qrt, run_torch, run_o = make(tmp, thread_counts[0], *params)
    fns, setups, keys = [], [], []
    for threads in thread_counts:
        # ORT fixes its thread count when the session is made: one per count (the case made again for
        # it); qrt's and torch's are set before each sample
        if run_o and threads != thread_counts[0]:
            run_o = make(tmp, threads, *params)[2]
        contenders = [("qrt", run_qrt, qrt.set_num_threads), ("torch", run_torch, torch.set_num_threads)]
        if run_o:
            contenders.append(("ort", run_o, None))
        for who, fn, setter in contenders:
            fns.append(fn)
            setups.append((lambda s=setter, t=threads: s(t)) if setter else (lambda: None))
            keys.append((threads, who))
    # torch's OpenMP workers spin for milliseconds after a call on several threads (libgomp's default),
    # holding the CPUs the next sample's threads need: that sample starts after they have gone to sleep
    for i in range(len(keys)):
        if keys[i - 1][1] == "torch" and keys[i - 1][0] > 1:
            setups[i] = lambda setup=setups[i]: (time.sleep(0.03), setup())
    times = dict(zip(keys, time_calls(fns, min_time=min_time, repeats=repeats, setups=setups)))
    rows = []
    for threads in thread_counts:
        t_q, t_t, t_o = times[threads, "qrt"], times[threads, "torch"], times.get((threads, "ort"))
        rows.append({"case": name, "threads": threads, "qrt_s": t_q, "torch_s": t_t, "ort_s": t_o,
                     "torch_ratio": t_t / t_q, "ort_ratio": t_o / t_q if t_o else None})
    return rows


def print_sections(rows: list[dict], thread_counts: list[int]) -> dict:
    """The per-thread-count tables (ratios to torch and ORT) and their geometric means."""
    summary = {}
    for threads in thread_counts:
        mine = [r for r in rows if r["threads"] == threads]
        print(f"\nthreads={threads}")
        print(f"{'case':44s} {'qrt':>11s} {'torch':>11s} {'ort':>11s} {'torch/qrt':>9s} {'ort/qrt':>8s}")
        for r in mine:
            t_o = fmt_time(r["ort_s"]) if r["ort_s"] else f"{'-':>11s}"
            r_o = f"{r['ort_ratio']:.2f}x" if r["ort_ratio"] else "-"
            print(f"{r['case']:44s} {fmt_time(r['qrt_s'])} {fmt_time(r['torch_s'])} {t_o} {r['torch_ratio']:8.2f}x"
                  f" {r_o:>8s}")
        lin = [r["torch_ratio"] for r in mine
               if r["case"].startswith(("dynamic", "static")) and " M=1 " not in r["case"]]
        summary[threads] = {
            "geomean_torch_ratio_all": _geomean([r["torch_ratio"] for r in mine]),
            "geomean_torch_ratio_linear_M>=8": _geomean(lin),
            "geomean_ort_ratio": _geomean([r["ort_ratio"] for r in mine if r["ort_ratio"]]),
        }
    print()
    for threads, values in summary.items():
        print(f"threads={threads}: " + ", ".join(f"{k} {v:.2f}x" for k, v in values.items()))
    return summary


def print_scaling(rows: list[dict], thread_counts: list[int]) -> None:
    """The thread-scaling table: each case's median time at every thread count, qrt, torch and ORT side by
    side, and qrt's speed-up over its own 1-thread time (where 1 is among the counts)."""
    print("\nthread scaling (median time per call; qrt speed-up over 1 thread in brackets)")
    for who in ("qrt", "torch", "ort"):
        if not any(r[f"{who}_s"] for r in rows):
            continue
        print(f"\n{who}")
        print(f"{'case':44s}" + "".join(f"{f'{t} thr':>20s}" for t in thread_counts))
        for case in dict.fromkeys(r["case"] for r in rows):
            mine = {r["threads"]: r for r in rows if r["case"] == case}
            one = mine[1][f"{who}_s"] if 1 in mine else None
            cells = []
            for t in thread_counts:
                v = mine[t][f"{who}_s"]
                speed = f" ({one / v:5.2f}x)" if v and one else " " * 9
                cells.append(f"{fmt_time(v)}{speed}" if v else f"{'-':>20s}")
            print(f"{case:44s}" + "".join(f"{c:>20s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer shapes and samples")
    parser.add_argument("--threads", nargs="+", default=None,
                        help='thread counts, "all" for every CPU qrt may use (default: 1 2 4 8 16 all)')
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--rows", type=int, nargs="+", default=None, help=f"rows of the linear cases (default {ROWS})")
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--scaling", action="store_true", help="only qrt's thread scaling (1 vs all cores)")
    args = parser.parse_args()
    all_cores = qrt.thread_info().cpus
    thread_counts = _thread_counts(args.threads, all_cores)
    info = machine()
    print(f"machine: {info.get('cpu')} | {info['cores']} CPUs, {info.get('physical_cores', '?')} cores"
          f" | flags {' '.join(info.get('flags', []))} | qrt kernels {info['qrt_kernels']}")
    print(
        f"qrt kernels {_kernels.kernel_variant_info()} | torch {torch.__version__} ({torch.backends.quantized.engine},"
        f" capability {torch.backends.cpu.get_cpu_capability()})"
        f" | onnxruntime {ort.__version__ if ort else 'not installed'}"
    )
    print(f"threads: {info['threads_note']}; timed at {', '.join(map(str, thread_counts))}")
    if args.scaling:
        rows = thread_scaling(args.quick, args.only, all_cores)
        if args.json:
            write_json(args.json, {"machine": info, "kernels": _kernels.kernel_variant_info(), "scaling": rows})
        return
    min_time, repeats = (0.01, 5) if args.quick else (0.02, 15)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name, make, params in cases(args.quick, args.rows):
            if args.only not in name:
                continue
            rows += time_case(tmp, name, make, params, thread_counts, min_time, repeats)
            print(f"  {name}: " + ", ".join(f"{r['threads']} thr {fmt_time(r['qrt_s']).strip()}" for r in rows[-len(
                thread_counts):]), flush=True)
    qrt.set_num_threads(all_cores)
    summary = print_sections(rows, thread_counts)
    print_scaling(rows, thread_counts)
    if args.json:
        write_json(
            args.json,
            {
                "machine": info,
                "kernels": _kernels.kernel_variant_info(),
                "torch_capability": torch.backends.cpu.get_cpu_capability(),
                "thread_counts": thread_counts,
                "rows": rows,
                "summary": {str(k): v for k, v in summary.items()},
            },
        )


if __name__ == "__main__":
    main()
