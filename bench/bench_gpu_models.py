"""Whole models on the GPU at batch 1: qrt's CUDA graph per call against torch float16, eager and as a CUDA graph.

    python bench/bench_gpu_models.py [--json out.json]

Models (issue 33's targets), each qrt's quantized file against the same trained float model in float16:
- the MLP 256-512-512-10 (dynamic int8 Linear-ReLU-...; bench/bench_cpu.py quantized_mlp);
- the word-level LSTM language model (examples/word_language_model.py): one word with (h, c), and
  35 words from the zero state;
- the keyword-spotting GRU (examples/keyword_spotting.py): one clip of 49 frames.

qrt is called with CuPy inputs already on the GPU (outputs are new CuPy arrays), torch with CUDA
tensors; "torch graph" replays the float16 model captured with torch.cuda.graph after copying the
input into the graph's static input. Device time: the median of 21 samples, CUDA events around batches
of calls lasting >= 2 ms (bench/bench_gpu.py median_ms). Host time: the median wall time of one qrt
call without waiting for the GPU (what the call costs the CPU). Before timing, qrt's GPU outputs are
checked bit for bit against qrt's CPU outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import common  # noqa: E402  (puts the checkout root on sys.path, for tools/)
import cupy as cp  # noqa: E402
import keyword_spotting as kws  # noqa: E402
import word_language_model as wlm  # noqa: E402  (the module name the whole-model pickle records)
from bench_cpu import quantized_mlp  # noqa: E402
from bench_gpu import median_ms  # noqa: E402

import qrt  # noqa: E402


def host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Median host time of one call, the GPU drained every 20 calls so its queue never fills."""
    times = []
    for i in range(calls):
        if i % 20 == 0:
            cp.cuda.Device().synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    cp.cuda.Device().synchronize()
    return statistics.median(times) * 1e6


def torch_graph(fn: Callable[..., object], *static: torch.Tensor) -> Callable[..., object]:
    """fn over the static inputs captured as a CUDA graph; the returned call copies new inputs in and replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*static)

    def replay(*inputs: torch.Tensor) -> None:
        for s, a in zip(static, inputs):
            s.copy_(a)
        graph.replay()

    return replay


def same_bits(cpu: qrt.Model, cuda: qrt.Model, inputs) -> None:
    want, got = cpu.run(inputs), cuda.run(inputs)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    flat = [a for w in want for a in (w if isinstance(w, tuple) else (w,))]
    flat_got = [a for g in got for a in (g if isinstance(g, tuple) else (g,))]
    assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in zip(flat, flat_got)), "GPU != CPU bits"


def row(case: str, qrt_call, eager, graph) -> dict:
    with torch.no_grad():
        t = {"qrt": median_ms(qrt_call), "torch fp16": median_ms(eager), "torch fp16 graph": median_ms(graph)}
    t = {k: v * 1e3 for k, v in t.items()}  # us
    return {"case": case, **t, "qrt host": host_us(qrt_call),
            "vs eager": t["torch fp16"] / t["qrt"], "vs graph": t["torch fp16 graph"] / t["qrt"]}


def mlp(tmp: str) -> dict:
    sizes = (256, 512, 512, 10)
    linears, _, g = quantized_mlp(sizes)
    path = os.path.join(tmp, "mlp.qrt")
    g.save(path)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    x = np.random.default_rng(0).normal(0, 1, (1, sizes[0])).astype(np.float32)
    same_bits(cpu, cuda, x)
    layers: list[torch.nn.Module] = []
    for lin in linears:
        layers += [lin, torch.nn.ReLU()]
    f16 = torch.nn.Sequential(*layers[:-1]).half().cuda().eval()
    xc, xt = cp.asarray(x), torch.from_numpy(x).half().cuda()
    return row("MLP 256-512-512-10", lambda: cuda.run(xc), lambda: f16(xt), torch_graph(f16, xt.clone()))


def word_lm(tmp: str) -> list[dict]:
    with torch.enable_grad(), contextlib.redirect_stdout(io.StringIO()):
        model, _, path, ids, _ = wlm.build(tmp)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    h0 = tuple(h.numpy() for h in model.init_hidden(1))  # zeros, before the model moves to the GPU
    f16 = model.half().cuda().eval()
    rows = []
    for seq in (35, 1):
        x = ids[7 : 7 + seq].reshape(seq, 1)
        same_bits(cpu, cuda, (x.numpy(), h0))
        xc, hc = cp.asarray(x.numpy()), tuple(cp.asarray(h) for h in h0)
        xt, ht = x.cuda(), tuple(torch.from_numpy(h).half().cuda() for h in h0)
        graph = torch_graph(lambda a, h, c: f16(a, (h, c)), xt.clone(), *(h.clone() for h in ht))
        rows.append(row(f"word LM, {seq} word{'s' if seq > 1 else ''}", lambda xc=xc, hc=hc: cuda.run((xc, hc)),
                        lambda xt=xt, ht=ht: f16(xt, ht), lambda g=graph, xt=xt, ht=ht: g(xt, *ht)))
    return rows


def keyword_gru(tmp: str) -> dict:
    torch.manual_seed(0)
    model = kws.make_model()
    with torch.enable_grad():
        kws.train(model)
    with contextlib.redirect_stdout(io.StringIO()):
        path = common.convert(model, "keyword_spotting:make_model", tmp, "--input-shape",
                              f"1,{kws.FRAMES},{kws.N_MFCC}")
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    one = kws.clips(1, kws.FRAMES, seed=7)[0].numpy()
    same_bits(cpu, cuda, one)
    f16 = model.half().cuda().eval()
    xc, xt = cp.asarray(one), torch.from_numpy(one).half().cuda()
    return row(f"keyword GRU, {kws.FRAMES} frames", lambda: cuda.run(xc), lambda: f16(xt), torch_graph(f16, xt.clone()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    versions = (f"{name}, driver {cp.cuda.runtime.driverGetVersion()}, CUDA runtime "
                f"{cp.cuda.runtime.runtimeGetVersion()}, CuPy {cp.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [mlp(tmp), *word_lm(tmp), keyword_gru(tmp)]
    print(versions)
    print("| case | qrt us | torch fp16 us | torch fp16 graph us | qrt host us | vs eager | vs graph |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['qrt']:.1f} | {r['torch fp16']:.1f} | {r['torch fp16 graph']:.1f} | "
              f"{r['qrt host']:.1f} | {r['vs eager']:.2f} | {r['vs graph']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": versions, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
