"""Encoder families beyond BERT's: qrt against PyTorch's quantized model, side by side in one run.

    PYTHONPATH=. .venv/bin/python bench/bench_encoders.py [--quick] [--json bench/results_encoders.json]

Each family is built by transformers from its config at all-MiniLM-L6-v2's size where the family has those
knobs (hidden 384, 6 layers, 12 heads, intermediate 1536, vocabulary 1000; MobileBERT its own widths, 6
layers), random weights (torch.manual_seed(0): the timing and the agreement do not depend on training),
wrapped as examples/semantic_search.py's SentenceEmbedder (mean pooling over the mask, L2 normalised),
quantized by `quantize_dynamic` ({nn.Linear}, qint8), saved whole and converted (tools/convert.py, its
checkpoint path, batch and sequence free). They reach qrt through the ops their attention is written in:
BERT's scaled_dot_product_attention (qrt's fused attention), and the eager matmul / softmax / where of
RoBERTa-family position ids (cumsum over the pad mask), DeBERTa-v2's relative positions (gather), T5's
relative bias, RoFormer's rotary halves (stack), MobileBERT's bottlenecks and trigram pads (cat).

For each family: its plan's steps and how many run in Python (none, since the native mask, gather, cat,
matmul and permute steps), the largest |difference| from torch's quantized model over a padded batch, then
batch 1 at 16 and 128 tokens on 1 thread, qrt and torch interleaved (bench/harness.py time_calls); medians,
and torch / qrt (above 1: qrt is faster).
"""

from __future__ import annotations

import argparse
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
logging.getLogger().setLevel(logging.ERROR)

SIZE = {"vocab_size": 1000, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
        "intermediate_size": 1536, "max_position_embeddings": 512}
FAMILIES = {  # name: the config's model type and its arguments
    "bert": ("bert", SIZE),
    "roberta": ("roberta", {**SIZE, "pad_token_id": 1}),
    "deberta-v2": ("deberta-v2", {**SIZE, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                  "position_buckets": 256, "max_relative_positions": -1, "share_att_key": True,
                                  "norm_rel_ebd": "layer_norm", "position_biased_input": False,
                                  "type_vocab_size": 0}),
    "t5": ("t5", {"vocab_size": 1000, "d_model": 384, "d_kv": 32, "d_ff": 1536, "num_layers": 6, "num_heads": 12}),
    "roformer": ("roformer", SIZE),
    "mobilebert": ("mobilebert", {"vocab_size": 1000, "num_hidden_layers": 6}),
}
CASES = [("batch 1 x 16 tokens", 16), ("batch 1 x 128 tokens", 128)]


def encoder(family: str) -> torch.nn.Module:
    """The family's encoder from its config, random weights."""
    from transformers import AutoConfig, AutoModel, T5EncoderModel

    kind, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, **kwargs)
    return T5EncoderModel(config) if kind == "t5" else AutoModel.from_config(config)


def converted(tmp: str, family: str, reference: torch.nn.Module) -> qrt.Model:
    """The quantized model saved whole, converted with batch and sequence free, loaded."""
    from tools.convert import convert

    checkpoint, out = os.path.join(tmp, f"{family}.pt"), os.path.join(tmp, f"{family}.qrt")
    torch.save(reference, checkpoint)
    with contextlib.redirect_stdout(io.StringIO()):
        convert(checkpoint, out, input_shapes=["2,9", "2,9"], trust_checkpoint=True,
                input_dtypes={"input_ids": "int64", "attention_mask": "int64"})
    return qrt.load(out)


def largest_difference(model: qrt.Model, reference: torch.nn.Module) -> float:
    """max |qrt - torch| over a padded batch of 3 x 40 tokens (two rows cut short)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(5, 1000, (3, 40))
    mask = np.ones_like(ids)
    mask[0, 20:], mask[1, 33:] = 0, 0
    want = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    return float(np.abs(model.run([ids, mask]) - want).max())


def time_case(model: qrt.Model, reference: torch.nn.Module, tokens: int, repeats: int) -> dict:
    """Batch 1 at `tokens` tokens: qrt and torch interleaved, and the plan's steps at these shapes."""
    ids = np.random.default_rng(1).integers(5, 1000, (1, tokens))
    mask = np.ones_like(ids)
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    t_qrt, t_torch = time_calls([lambda: model.run([ids, mask]), lambda: reference(ids_t, mask_t)], min_time=0.05,
                                repeats=repeats)
    return {"tokens": tokens, "qrt_s": t_qrt, "torch_s": t_torch, "torch_ratio": t_torch / t_qrt,
            "steps": len(model._plan.profile([ids, mask], 1)),
            "python_steps": len(model._plan._executor.fallback_steps((ids.shape, mask.shape)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="write the figures here (e.g. bench/results_encoders.json)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    args = parser.parse_args()
    repeats = 5 if args.quick else 15
    torch.set_num_threads(1)
    qrt.set_num_threads(1)
    info = machine()
    print(machine_line(info, "not run here", "1 thread"))
    print(f"\n{'family':12s}{'steps':>7s}{'Python':>8s}{'max |diff|':>12s}  " + "".join(
        f"{name:>36s}" for name, _ in CASES))
    print(f"{'':39s}" + "".join(f"{'qrt':>12s}{'torch':>12s}{'torch/qrt':>12s}" for _ in CASES))
    rows = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            reference = ss.quantize(ss.SentenceEmbedder(encoder(family)).eval())
            model = converted(tmp, family, reference)
            row = {"family": family, "max_abs_diff": largest_difference(model, reference), "cases": []}
            line = ""
            for name, tokens in CASES:
                case = time_case(model, reference, tokens, repeats)
                row["steps"], row["python_steps"] = case.pop("steps"), case.pop("python_steps")
                row["cases"].append({"case": name, **case})
                line += f"{fmt_time(case['qrt_s']):>12s}{fmt_time(case['torch_s']):>12s}{case['torch_ratio']:11.2f}x"
            rows.append(row)
            print(f"{family:12s}{row['steps']:7d}{row['python_steps']:8d}{row['max_abs_diff']:12.1e}  {line}",
                  flush=True)
    if args.json:
        write_json(args.json, {"machine": {**info, "torch_capability": torch.backends.cpu.get_cpu_capability(),
                                           "torch": torch.__version__},
                               "families": {f: FAMILIES[f] for f in args.families}, "rows": rows})


if __name__ == "__main__":
    main()
