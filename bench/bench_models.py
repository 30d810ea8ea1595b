"""The two real models of issue 20's targets, batch 1: qrt, PyTorch and ONNX Runtime, in one run.

    python bench/bench_models.py [--quick] [--json out.json]

Models, built, trained and quantized as the examples do (their classes and helpers are imported):
- the word-level LSTM language model (examples/word_language_model.py, RNNModel: 8-bit embedding,
  2-layer LSTM 64->64, Linear decoder, log_softmax): one word per call with (h, c) carried from call
  to call (seq 1, batch 1), and a 35-word sequence from the zero state (seq 35, batch 1);
- the keyword-spotting GRU (examples/keyword_spotting.py: 2-layer GRU 40->64 over 49 MFCC frames,
  Linear head, log_softmax): one clip, batch 1.

Each runtime runs its own quantization of the same trained float model, one thread:
- qrt: the file the example converts (word LM: torch's quantize_dynamic saved whole, converted with
  --trust-checkpoint; keyword spotter: its state_dict through examples/common.convert);
- torch: torch.ao.quantization.quantize_dynamic of the float model, as the examples build it;
- onnxruntime: the float model exported by torch.onnx.export (the TorchScript exporter, dynamo=False),
  quantized by onnxruntime.quantization.quantize_dynamic (QInt8 weights), run by an InferenceSession
  with intra_op_num_threads=1. Its quantize_dynamic makes the LSTM a DynamicQuantizeLSTM; it has no
  quantized GRU, so the keyword spotter's GRUs run in float there (only its head is int8).

Each side's outputs are checked against the float model first (max |log-prob diff| and the share of
rows whose argmax agrees), so the timings compare working models. Figures are medians of interleaved
samples (bench/harness.py time_calls); ratios are torch time / qrt time and ORT time / qrt time
(above 1: qrt is faster). Issue 20's target for these models is ORT / qrt >= 2.
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
import common  # noqa: E402  (puts the checkout root on sys.path, for tools/)
import keyword_spotting as kws  # noqa: E402
import word_language_model as wlm  # noqa: E402  (the module name the whole-model pickle records)
from bench_cpu import ort  # noqa: E402
from harness import fmt_time, machine, machine_line, time_calls, write_json  # noqa: E402

import qrt  # noqa: E402

warnings.simplefilter("ignore")
logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's advice on pre-processing

SEQ = 35


# ------------------------------------------------------------------ ONNX Runtime side


def ort_session(tmp: str, name: str, model: torch.nn.Module, args: tuple, export: dict):
    """Float model -> ONNX (TorchScript exporter) -> quantize_dynamic (QInt8) -> 1-thread InferenceSession.

    Returns (session, op counts of the quantized graph)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = os.path.join(tmp, name + ".onnx"), os.path.join(tmp, name + ".q.onnx")
    torch.onnx.export(model, args, src, dynamo=False, opset_version=17, **export)
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    ops = collections.Counter(n.op_type for n in onnx.load(dst).graph.node)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as bench_cpu's sessions
    return ort.InferenceSession(dst, opts, providers=["CPUExecutionProvider"]), ops


def _check(got: np.ndarray, want: np.ndarray) -> dict:
    """got and want: log-probs [rows, classes]."""
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    return {"max_abs_diff": float(np.abs(got - want).max()), "argmax_agree": agree}


# ------------------------------------------------------------------ word-level LSTM language model


def word_lm(tmp: str) -> list[dict]:
    # trained, quantized by PyTorch, saved whole and converted as the example does
    with torch.enable_grad(), contextlib.redirect_stdout(io.StringIO()):  # main runs the rest without autograd
        model, reference, path, ids, _ = wlm.build(tmp)
    qmodel = qrt.load(path)

    x = ids[7 : 7 + SEQ].reshape(SEQ, 1)  # [seq, batch]
    h0 = model.init_hidden(1)
    xn, h0n = x.numpy(), tuple(h.numpy() for h in h0)
    with torch.no_grad():
        want = model(x, h0)[0].numpy()  # the float model's log-probs, [SEQ, ntoken]
    sess = None
    if ort is not None:
        sess, ops = ort_session(tmp, "word_lm", model, (x[:1], h0),
                                {"input_names": ["input", "h0", "c0"], "output_names": ["logp", "h1", "c1"],
                                 "dynamic_axes": {"input": {0: "seq"}, "logp": {0: "rows"}}})

    # every side's "one step" and "whole sequence" calls, and a check of each: the sequence at once, and
    # the same words one per call with the state carried, against the float model's log-probs
    def qrt_seq():
        return qmodel.run((xn, h0n))[0]

    def torch_seq():
        return reference(x, h0)[0]

    def ort_seq():
        return sess.run(["logp"], {"input": xn, "h0": h0n[0], "c0": h0n[1]})[0]

    def steps(step, state):
        rows = []
        for t in range(SEQ):
            out, state = step(t, state)
            rows.append(np.asarray(out).reshape(-1))
        return np.stack(rows)

    def qrt_step(t, state):
        return qmodel.run((xn[t : t + 1], state))

    def torch_step(t, state):
        return reference(x[t : t + 1], state)

    def ort_step(t, state):
        out, h, c = sess.run(None, {"input": xn[t : t + 1], "h0": state[0], "c0": state[1]})
        return out, (h, c)

    sides = {"qrt": (qrt_seq, qrt_step, h0n), "torch": (torch_seq, torch_step, h0)}
    if sess is not None:
        sides["onnxruntime"] = (ort_seq, ort_step, h0n)
    checks = {}
    for side, (seq, step, state) in sides.items():
        checks[side] = {"seq": _check(np.asarray(seq()), want), "step": _check(steps(step, state), want)}

    # timing: the first word again and again, each call fed the state the call before returned
    carried = {side: state for side, (_, _, state) in sides.items()}

    def stepper(side, step):
        def run():
            carried[side] = step(0, carried[side])[1]

        return run

    note = "ORT: " + _ops(ops) if sess is not None else ""
    return [
        {"case": "word LM, one word, (h, c) carried", "runs": {s: stepper(s, v[1]) for s, v in sides.items()},
         "check": {s: c["step"] for s, c in checks.items()}, "note": note},
        {"case": f"word LM, {SEQ}-word sequence", "runs": {s: v[0] for s, v in sides.items()},
         "check": {s: c["seq"] for s, c in checks.items()}, "note": ""},
    ]


# ------------------------------------------------------------------ keyword-spotting GRU


def keyword_spotter(tmp: str) -> list[dict]:
    torch.manual_seed(0)
    model = kws.make_model()
    with torch.enable_grad():
        kws.train(model)
    with contextlib.redirect_stdout(io.StringIO()):  # the converter's "wrote ..." line
        path = common.convert(model, "keyword_spotting:make_model", tmp, "--input-shape",
                              f"1,{kws.FRAMES},{kws.N_MFCC}")
    qmodel, reference = qrt.load(path), common.quantize_dynamic(model)
    one = kws.clips(1, kws.FRAMES, seed=7)[0]
    one_n = one.numpy()
    runs = {"qrt": lambda: qmodel.run(one_n), "torch": lambda: reference(one)}
    sess = None
    if ort is not None:
        sess, ops = ort_session(tmp, "kws", model, (one,), {"input_names": ["mfcc"], "output_names": ["logp"]})
        runs["onnxruntime"] = lambda: sess.run(None, {"mfcc": one_n})
    # check: 32 clips, one per call (batch 1, the shape each side is timed at)
    clips, labels = kws.clips(32, kws.FRAMES, seed=1032)
    with torch.no_grad():
        want = model(clips).numpy()
    got = {"qrt": [qmodel.run(c[None].numpy()) for c in clips], "torch": [reference(c[None]).numpy() for c in clips]}
    if sess is not None:
        got["onnxruntime"] = [sess.run(None, {"mfcc": c[None].numpy()})[0] for c in clips]
    check = {}
    for side, rows in got.items():
        out = np.concatenate(rows)
        check[side] = {**_check(out, want), "accuracy": float((out.argmax(1) == labels.numpy()).mean())}
    note = "ORT: " + _ops(ops) if sess is not None else ""
    return [{"case": f"keyword GRU, one clip of {kws.FRAMES} frames", "runs": runs, "check": check, "note": note}]


def _ops(ops: collections.Counter) -> str:
    wanted = ("DynamicQuantizeLSTM", "LSTM", "GRU", "MatMulInteger", "Gemm", "MatMul", "Gather")
    return ", ".join(f"{n} x{ops[n]}" for n in wanted if ops.get(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    repeats = 7 if args.quick else 15
    info = machine()
    print(machine_line(info, ort and ort.__version__, "1 thread each, batch 1"))
    names = ["qrt", "torch", "onnxruntime"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        cases = word_lm(tmp) + keyword_spotter(tmp)
        print("\ncheck against the float model: max |log-prob diff|, argmax agreement")
        for c in cases:
            print(f"  {c['case']:40s}" + "".join(
                f"  {s} {v['max_abs_diff']:.3f} {v['argmax_agree']:.0%}" for s, v in c["check"].items()))
            if c["note"]:
                print(f"  {'':40s}  {c['note']}")
        print(f"\n{'case':40s}" + "".join(f"{n:>13s}" for n in names) + f"{'torch/qrt':>11s}{'ORT/qrt':>9s}")
        for c in cases:
            runs = c["runs"]
            times = dict(zip(runs, time_calls(list(runs.values()), repeats=repeats)))
            t_q, t_t, t_o = times["qrt"], times["torch"], times.get("onnxruntime")
            r_o = f"{t_o / t_q:8.2f}x" if t_o else f"{'-':>9s}"
            print(f"{c['case']:40s}" + "".join(f"{fmt_time(times[n]) if n in times else '-':>13s}" for n in names)
                  + f"{t_t / t_q:10.2f}x" + r_o, flush=True)
            rows.append({"case": c["case"], **{f"{n}_s": times.get(n) for n in names},
                         "torch_ratio": t_t / t_q, "ort_ratio": t_o / t_q if t_o else None,
                         "check": c["check"], "ort_ops": c["note"]})
    if args.json:
        write_json(args.json, {"machine": {**info,
                                           "torch_capability": torch.backends.cpu.get_cpu_capability(),
                                           "onnxruntime": ort.__version__ if ort else None}, "rows": rows})


if __name__ == "__main__":
    main()
