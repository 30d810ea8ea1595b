"""qrt's CUDA kernels against PyTorch on the same GPU, in one run (issue 4).

    python bench/bench_gpu.py [--quick] [--graph-only] [--peak-gbs 3350] [--markdown out.md]

Dynamic int8 linear at batch 1 and 512 for 1024x1024 and 4096x4096 (qrt,
input quantization included) against torch float16 and float32 nn.Linear and
torch._int_mm (int8 x int8 -> int32) alone and plus qrt's input quantization;
the 100-step RNN cell loop (input 128, hidden 256 and 1024, batch 1 and 32)
against torch's float16 nn.RNNCell stepped in a loop and nn.RNN (cuDNN);
100-step LSTM and GRU sequences (qrt's lstm/gru_dynamic time loop, same
sizes) against torch's float16 nn.LSTM / nn.GRU (cuDNN).

Every figure is the median over 21 samples, each timed with CUDA events
around enough calls to last >= 2 ms, after warm-up. Ratios are torch time /
qrt time (above 1: qrt faster). Batch-1 GEMV bandwidth is the int8 weight
bytes over the GEMV kernel's time, as a fraction of the card's peak.

Kernel time without launch overhead (issue 34): each path's calls captured in
one CUDA graph (40 calls on a non-default stream), replayed between CUDA
events, the time divided by the calls; median of 11 replays. The GEMV rows
(4096x4096 and 8192x8192, batch 1, 4, 8) cycle through enough copies of the
weights to exceed twice the L2 cache, so that the weights come from HBM as in
a model; GB/s is weight bytes over time. Paths: the dynamic linear as chosen
(auto), fused (quantization and GEMV in one kernel, gemv_dq), old
(quantize_dynamic then gemm_s8.cu's gemv), and the GEMV kernels alone over a
quantized x (gemv_q, old gemv). Every path's output is compared bit for bit
with the others'. Batch 512 (4096x4096, quantization included) is set
against torch._int_mm in a torch CUDA graph. --graph-only runs just these.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402
import torch  # noqa: E402

from qrt import gpu  # noqa: E402

# Peak memory bandwidth in GB/s by device name, when the driver does not report it.
PEAK_GBS = {"H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H100 NVL": 3900, "H200": 4800, "A100-SXM4-80GB": 2039,
            "A100-SXM4-40GB": 1555, "A100 80GB PCIe": 1935, "L40S": 864, "A10": 600}


def peak_gbs(override: float | None) -> tuple[float, str]:
    if override:
        return override, "given"
    props = cp.cuda.runtime.getDeviceProperties(0)
    clock, bus = props.get("memoryClockRate", 0), props.get("memoryBusWidth", 0)
    if clock and bus:
        return 2 * clock * 1e3 * bus / 8 / 1e9, "driver"
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    for key, value in PEAK_GBS.items():
        if key in name:
            return float(value), "datasheet"
    return float("nan"), "unknown"


def median_ms(fn: Callable[[], object], samples: int = 21) -> float:
    """Median time per call in ms, CUDA events around batches of calls (both libraries' default streams)."""

    def batch_ms(reps: int) -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        torch.cuda.synchronize()
        return cp.cuda.get_elapsed_time(start, end)

    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    reps = 1
    while batch_ms(reps) < 2.0 and reps < 1 << 14:  # size a batch to last >= 2 ms
        reps *= 2
    return statistics.median(batch_ms(reps) / reps for _ in range(samples))


def quantized_weight(n: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float weights and their per-channel symmetric qint8 form (NUMERICS.md, quantize_dynamic)."""
    w = rng.normal(0, 0.05, (n, k)).astype(np.float32)
    s = (np.maximum(np.abs(w).max(axis=1), 1e-8) / np.float32(127.5)).astype(np.float32)
    q = np.clip(np.rint(w * (np.float32(1) / s)[:, None]), -128, 127).astype(np.int8)
    return w, q, s


def _linear_row(size: int, batch: int, layer, lin16, lin32, w_int, rng: np.random.Generator, peak: float) -> dict:
    x = cp.asarray(rng.normal(0, 1, (batch, size)).astype(np.float32))
    xt = torch.as_tensor(x, device="cuda")
    xq, params = gpu.quantize.quantize_dynamic(x, layer.w.kp, layer.qmax)
    y = cp.empty((batch, size), cp.float32)
    epi = layer.w.float_epilogue(layer.w.xsum(xq), params)
    row = {"size": size, "batch": batch}
    row["qrt"] = median_ms(lambda: layer(x))
    row["qrt_quant"] = median_ms(lambda: gpu.quantize.quantize_dynamic(x, layer.w.kp, layer.qmax))
    row["qrt_gemm"] = median_ms(lambda: gpu.linear.gemm(xq, batch, layer.w, y, epi, requant=False))
    with torch.no_grad():
        x16 = xt.half()
        row["torch_fp16"] = median_ms(lambda: lin16(x16))
        row["torch_fp32"] = median_ms(lambda: lin32(xt))
        a = torch.randint(-128, 128, (max(batch, 32), size), dtype=torch.int8, device="cuda")
        try:  # cuBLASLt's int8 path wants m > 16: batch 1 is timed padded to 32 rows
            row["int_mm"] = median_ms(lambda: torch._int_mm(a, w_int))
        except RuntimeError as e:
            row["int_mm"], row["int_mm_error"] = float("nan"), str(e).splitlines()[0]
    row["int_mm_plus_quant"] = row["int_mm"] + row["qrt_quant"]
    if batch == 1:
        row["gemv_bw_gbs"] = size * layer.w.kp / (row["qrt_gemm"] * 1e-3) / 1e9
        row["gemv_bw_frac"] = row["gemv_bw_gbs"] / peak
    return row


def bench_linear(quick: bool, peak: float) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for size in (1024, 4096):
        w, q, s = quantized_weight(size, size, rng)
        bias = rng.normal(0, 0.1, size).astype(np.float32)
        layer = gpu.linear.DynamicLinearInt8(q, s, np.zeros(size, np.int32), bias, True)
        lin16 = torch.nn.Linear(size, size).cuda().half()
        lin32 = torch.nn.Linear(size, size).cuda()
        w_int = torch.from_numpy(q).cuda().t()  # [k, n] column-major view: what _int_mm wants for b
        for batch in (1, 512):
            rows.append(_linear_row(size, batch, layer, lin16, lin32, w_int, rng, peak))
    return rows


def _rnn_row(hidden: int, batch: int, cell, tcell, trnn, n_in: int, steps: int, samples: int,
             rng: np.random.Generator) -> dict:
    xs = cp.asarray(rng.normal(0, 1, (steps, batch, n_in)).astype(np.float32))
    h0 = cp.zeros((batch, hidden), cp.float32)
    xs16 = torch.as_tensor(xs, device="cuda").half()
    h16 = torch.zeros(batch, hidden, device="cuda", dtype=torch.half)

    def qrt_loop():
        h = h0
        for t in range(steps):
            h = cell(xs[t], h)
        return h

    def torch_loop():
        h = h16
        for t in range(steps):
            h = tcell(xs16[t], h)
        return h

    row = {"hidden": hidden, "batch": batch}
    with torch.no_grad():
        row["qrt"] = median_ms(qrt_loop, samples)
        row["torch_cell_fp16"] = median_ms(torch_loop, samples)
        row["torch_rnn_cudnn"] = median_ms(lambda: trnn(xs16, h16[None]), samples)
    return row


def bench_rnn(quick: bool) -> list[dict]:
    rng = np.random.default_rng(1)
    steps, n_in = 100, 128
    rows = []
    for hidden in (256, 1024):
        _, q_ih, s_ih = quantized_weight(hidden, n_in, rng)
        _, q_hh, s_hh = quantized_weight(hidden, hidden, rng)
        b_ih, b_hh = (rng.normal(0, 0.1, hidden).astype(np.float32) for _ in range(2))
        z = np.zeros(hidden, np.int32)
        cell = gpu.recurrent.RNNCell(gpu.linear.DynamicLinearInt8(q_ih, s_ih, z, b_ih, True),
                           gpu.linear.DynamicLinearInt8(q_hh, s_hh, z, b_hh, True), relu=False)
        tcell = torch.nn.RNNCell(n_in, hidden).cuda().half()
        trnn = torch.nn.RNN(n_in, hidden).cuda().half()
        for batch in (1, 32):
            rows.append(_rnn_row(hidden, batch, cell, tcell, trnn, n_in, steps, 7 if quick else 21, rng))
    return rows


def _sequence_row(kind: str, hidden: int, batch: int, run, tl, steps: int, n_in: int, samples: int,
                  rng: np.random.Generator) -> dict:
    xs = cp.asarray(rng.normal(0, 1, (steps, batch, n_in)).astype(np.float32))
    xs16 = torch.as_tensor(xs, device="cuda").half()

    def qrt_seq():  # as the op does per call: fresh states and output
        h = cp.zeros((batch, hidden), cp.float32)
        c = cp.zeros((batch, hidden), cp.float32) if kind == "lstm" else h
        y = cp.empty((steps, batch, hidden), cp.float32)
        run.sequence(xs, y, 0, False, h, c)
        return y

    row = {"kind": kind, "hidden": hidden, "batch": batch}
    with torch.no_grad():
        row["qrt"] = median_ms(qrt_seq, samples)
        row["torch_cudnn_fp16"] = median_ms(lambda: tl(xs16), samples)
    return row


def bench_sequence(quick: bool) -> list[dict]:
    """qrt's whole-sequence LSTM/GRU loop (input projection once, then per step) against cuDNN fp16."""
    rng = np.random.default_rng(2)
    steps, n_in, samples = 100, 128, 7 if quick else 21
    rows = []
    for kind, tlayer in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
        gates = gpu.recurrent.GATES[kind]
        for hidden in (256, 1024):
            _, q_ih, s_ih = quantized_weight(gates * hidden, n_in, rng)
            _, q_hh, s_hh = quantized_weight(gates * hidden, hidden, rng)
            b_ih, b_hh = (rng.normal(0, 0.1, gates * hidden).astype(np.float32) for _ in range(2))
            z = np.zeros(gates * hidden, np.int32)
            run = gpu.recurrent.Recurrent(kind, gpu.linear.DynamicLinearInt8(q_ih, s_ih, z, b_ih, True),
                                gpu.linear.DynamicLinearInt8(q_hh, s_hh, z, b_hh, True))
            tl = tlayer(n_in, hidden).cuda().half()
            for batch in (1, 32):
                rows.append(_sequence_row(kind, hidden, batch, run, tl, steps, n_in, samples, rng))
    return rows


GRAPH_CALLS = 40  # calls captured per graph
_RELAXED = 2  # cudaStreamCaptureModeRelaxed, as qrt/gpu/plan.py captures


def graph_us(calls: Sequence[Callable[[], object]], samples: int = 11) -> float:
    """Median time per call in us of ``calls`` (taken in turn) captured in one CUDA graph: kernel time,
    no launch overhead. Warm-up (compiling, allocating) runs before the capture."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for fn in calls:
            fn()
        stream.synchronize()
        stream.begin_capture(_RELAXED)
        for i in range(GRAPH_CALLS):
            calls[i % len(calls)]()
        graph = stream.end_capture()
        graph.upload(stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for i in range(samples + 2):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            if i >= 2:  # two warm-up replays
                times.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def torch_graph_us(fn: Callable[[], object], samples: int = 11) -> float:
    """graph_us for torch calls, captured with torch.cuda.graph (its allocator's capture pool)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    times = []
    for i in range(samples + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def _weight_copies(layer, copies: int) -> list:
    """The layer and copies of it with their own weight buffers (same values), to cycle through."""
    out = [layer]
    for _ in range(copies - 1):
        c = copy.copy(layer)
        c.w = copy.copy(layer.w)
        c.w.w = layer.w.w.copy()
        out.append(c)
    return out


def _with_path(path: str | None, fn: Callable[[], object]) -> Callable[[], object]:
    def call():
        before, gpu.linear.GEMM_PATH = gpu.linear.GEMM_PATH, path
        try:
            return fn()
        finally:
            gpu.linear.GEMM_PATH = before

    return call


def _gemv_rows(size: int, batch: int, layers: list, peak: float, rng: np.random.Generator) -> list[dict]:
    """Every path of one GEMV shape, timed in a graph, outputs compared bit for bit."""
    first = layers[0]
    x = cp.asarray(rng.normal(0, 1, (batch, size)).astype(np.float32))
    xq, params = gpu.quantize.quantize_dynamic(x, first.w.kp, first.qmax)
    ys = {}

    def layer_calls(name, path):
        y = ys[name] = cp.empty((batch, size), cp.float32)
        wss = [_with_path(path, lambda lay=lay: lay.workspace(batch))() for lay in layers]
        return [_with_path(path, lambda lay=lay, ws=ws: lay(x, y, ws)) for lay, ws in zip(layers, wss)]

    def kernel_calls(name, path):
        y = ys[name] = cp.empty((batch, size), cp.float32)
        epi = first.w.float_epilogue(first.w.xsum(xq), params)
        return [_with_path(path, lambda lay=lay: gpu.linear.gemm(xq, batch, lay.w, y, epi, requant=False))
                for lay in layers]

    paths = {
        "auto (layer)": layer_calls("auto (layer)", None),
        "fused gemv_dq (layer)": layer_calls("fused gemv_dq (layer)", "fused"),
        "old: quantize + gemv (layer)": layer_calls("old: quantize + gemv (layer)", "gemv"),
        "gemv_q alone": kernel_calls("gemv_q alone", "gemv_q"),
        "old gemv alone": kernel_calls("old gemv alone", "gemv"),
    }
    rows = []
    for name, calls in paths.items():
        us = graph_us(calls)
        gbs = size * first.w.kp / (us * 1e-6) / 1e9
        rows.append({"size": size, "batch": batch, "path": name, "us": us, "gbs": gbs, "frac": gbs / peak})
    # the copies hold the same weights: every path's last output must have the same bits
    ref = ys["old: quantize + gemv (layer)"]
    for r in rows:
        r["bits"] = "same" if bool(cp.array_equal(ys[r["path"]], ref)) else "DIFFERENT"
    return rows


def _or_nan(measure: Callable[[], float]) -> float:
    try:
        return measure()
    except RuntimeError as e:  # a torch build without the kernel or its capture: report, go on
        print(f"torch: {str(e).splitlines()[0]}", file=sys.stderr)
        return float("nan")


def _copy_gbs(nbytes: int = 1 << 28) -> float:
    """A device-to-device copy's GB/s (bytes read plus written), for scale."""
    src, dst = cp.ones(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    run = cp.cuda.runtime
    us = graph_us([lambda: run.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, run.memcpyDeviceToDevice,
                                           cp.cuda.get_current_stream().ptr)])
    return 2 * nbytes / (us * 1e-6) / 1e9


def bench_graph(peak: float) -> tuple[list[dict], dict]:
    """Kernel times in CUDA graphs: GEMV paths at 4096 and 8192, batch 512 against torch._int_mm."""
    rng = np.random.default_rng(3)
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    rows = []
    for size in (4096, 8192):
        q = rng.integers(-127, 128, (size, size), dtype=np.int8)
        s = rng.uniform(0.001, 0.01, size).astype(np.float32)
        bias = rng.normal(0, 0.1, size).astype(np.float32)
        layer = gpu.linear.DynamicLinearInt8(q, s, np.zeros(size, np.int32), bias, True)
        layers = _weight_copies(layer, max(2, math.ceil(2 * l2 / (size * layer.w.kp))))
        for batch in (1, 4, 8):
            rows += _gemv_rows(size, batch, layers, peak, rng)
        del layers, layer
    # batch 512, 4096x4096, quantization included, against torch._int_mm (the weights stay in L2 for both)
    size, batch = 4096, 512
    q = rng.integers(-127, 128, (size, size), dtype=np.int8)
    layer = gpu.linear.DynamicLinearInt8(q, np.full(size, 0.01, np.float32), np.zeros(size, np.int32), None, True)
    x = cp.asarray(rng.normal(0, 1, (batch, size)).astype(np.float32))
    y = cp.empty((batch, size), cp.float32)
    ws = layer.workspace(batch)
    xq, params = gpu.quantize.quantize_dynamic(x, layer.w.kp, layer.qmax)
    epi = layer.w.float_epilogue(layer.w.xsum(xq), params)
    a = torch.randint(-128, 128, (batch, size), dtype=torch.int8, device="cuda")
    b = torch.from_numpy(q).cuda().t()
    big = {
        "qrt": graph_us([lambda: layer(x, y, ws)]),
        "qrt_quant": graph_us([lambda: gpu.quantize.quantize_dynamic(x, layer.w.kp, layer.qmax, ws[0])]),
        "qrt_gemm": graph_us([lambda: gpu.linear.gemm(xq, batch, layer.w, y, epi, requant=False)]),
        "int_mm": _or_nan(lambda: torch_graph_us(lambda: torch._int_mm(a, b))),
        "copy_gbs": _copy_gbs(),
    }
    return rows, big


def report_graph(rows: list[dict], big: dict, peak: float) -> str:
    out = ["| GEMV in a CUDA graph | batch | path | us per call | weight GB/s | of peak | bits |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['size']}x{r['size']} | {r['batch']} | {r['path']} | {r['us']:.2f} | {r['gbs']:.0f} "
                   f"| {r['frac']:.0%} | {r['bits']} |")
    out += ["", "| 512x4096x4096 in a CUDA graph | us per call |", "|---|---|",
            f"| qrt dynamic linear (quantize + MMA GEMM) | {big['qrt']:.1f} |",
            f"| qrt quantize_dynamic | {big['qrt_quant']:.1f} |",
            f"| qrt MMA GEMM alone | {big['qrt_gemm']:.1f} |",
            f"| torch._int_mm | {big['int_mm']:.1f} |"]

    def pick(size, batch, path):
        return next(r for r in rows if r["size"] == size and r["batch"] == batch and r["path"] == path)

    gemv = ", ".join(f"{s}/b{b} {pick(s, b, 'gemv_q alone')['frac']:.0%}" for s in (4096, 8192) for b in (1, 4, 8))
    extra = ", ".join(
        f"{s}/b{b} fused +{pick(s, b, 'fused gemv_dq (layer)')['us'] - pick(s, b, 'gemv_q alone')['us']:.1f} us, "
        f"auto +{pick(s, b, 'auto (layer)')['us'] - pick(s, b, 'gemv_q alone')['us']:.1f} us"
        for s in (4096, 8192) for b in (1, 4, 8))
    out += ["", f"Targets (issue 34, peak {peak:.0f} GB/s; a device-to-device copy moves {big['copy_gbs']:.0f} GB/s):",
            f"- item 2, GEMV >= 75% of peak: {gemv}",
            f"- item 1, dynamic linear = GEMV + a few us: {extra}",
            f"- item 3, batch 512 incl. quantization >= 0.8x _int_mm: {big['int_mm'] / big['qrt']:.2f}x "
            f"(GEMM alone {big['int_mm'] / big['qrt_gemm']:.2f}x)",
            f"- bits identical across paths: {all(r['bits'] == 'same' for r in rows)}"]
    return "\n".join(out)


def report(lin: list[dict], rnn: list[dict], peak: float, peak_src: str, seqs: list[dict]) -> str:
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    out = [
        f"Device: {name}, peak memory bandwidth {peak:.0f} GB/s ({peak_src}); "
        f"torch {torch.__version__}, CuPy {cp.__version__}. Medians of 21 CUDA-event samples, ms per call.",
        "",
        "| linear | batch | qrt (incl. quant) | qrt quant | qrt GEMM | torch fp16 | torch fp32 | _int_mm "
        "| _int_mm + quant | fp16/qrt | _int_mm/qrt | GEMV GB/s (of peak) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in lin:
        bw = f"{r['gemv_bw_gbs']:.0f} ({r['gemv_bw_frac']:.0%})" if "gemv_bw_gbs" in r else ""
        out.append(
            f"| {r['size']}x{r['size']} | {r['batch']} | {r['qrt']:.4f} | {r['qrt_quant']:.4f} | {r['qrt_gemm']:.4f} "
            f"| {r['torch_fp16']:.4f} | {r['torch_fp32']:.4f} | {r['int_mm']:.4f} | {r['int_mm_plus_quant']:.4f} "
            f"| {r['torch_fp16'] / r['qrt']:.2f} | {r['int_mm'] / r['qrt']:.2f} | {bw} |"
        )
    out += ["", "| RNN 100 steps | batch | qrt | torch fp16 RNNCell loop | torch nn.RNN (cuDNN) | cell loop/qrt "
            "| cuDNN/qrt |", "|---|---|---|---|---|---|---|"]
    for r in rnn:
        out.append(
            f"| hidden {r['hidden']} | {r['batch']} | {r['qrt']:.3f} | {r['torch_cell_fp16']:.3f} "
            f"| {r['torch_rnn_cudnn']:.3f} | {r['torch_cell_fp16'] / r['qrt']:.2f} "
            f"| {r['torch_rnn_cudnn'] / r['qrt']:.2f} |"
        )
    out += ["", "| 100 steps, input 128 | batch | qrt ms | qrt us/step | torch fp16 cuDNN ms | cuDNN/qrt |",
            "|---|---|---|---|---|---|"]
    for r in seqs:
        out.append(
            f"| {r['kind'].upper()} hidden {r['hidden']} | {r['batch']} | {r['qrt']:.3f} | {r['qrt'] * 10:.1f} "
            f"| {r['torch_cudnn_fp16']:.3f} | {r['torch_cudnn_fp16'] / r['qrt']:.2f} |"
        )
    big1 = next(r for r in lin if r["size"] == 4096 and r["batch"] == 1)
    big512 = next(r for r in lin if r["size"] == 4096 and r["batch"] == 512)
    out += [
        "",
        "Targets:",
        f"- batch-1 GEMV 4096x4096 weight bandwidth >= 60% of peak: {big1['gemv_bw_frac']:.0%}",
        f"- batch-512 4096x4096 dynamic int8 (incl. quant) >= 0.7x _int_mm alone: "
        f"{big512['int_mm'] / big512['qrt']:.2f}x",
        "- 100-step RNN loop faster than torch fp16 RNNCell loop: "
        + ", ".join(f"h{r['hidden']}/b{r['batch']} {r['torch_cell_fp16'] / r['qrt']:.2f}x" for r in rnn),
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples for the RNN loops")
    ap.add_argument("--peak-gbs", type=float, default=None, help="peak memory bandwidth, GB/s")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    ap.add_argument("--graph-only", action="store_true", help="only the kernel times in CUDA graphs")
    args = ap.parse_args()
    gpu.require_cuda()
    peak, src = peak_gbs(args.peak_gbs)
    text = report_graph(*bench_graph(peak), peak)
    if not args.graph_only:
        text = report(bench_linear(args.quick, peak), bench_rnn(args.quick), peak, src,
                      bench_sequence(args.quick)) + "\n\n" + text
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
