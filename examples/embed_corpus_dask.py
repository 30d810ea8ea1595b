"""Embedding a large corpus on Dask workers with qrt: all-MiniLM-L6-v2 (examples/semantic_search.py).

    PYTHONPATH=. .venv/bin/python examples/embed_corpus_dask.py [--sentences N] [--workers W] [--out emb.npy]

The corpus: the first lines of the docstrings of Python's standard library (about 6,500 distinct ones,
on every machine that has Python). A `dask.distributed.LocalCluster` starts W worker processes on
this machine; the client scatters the qrt `Model` to them, which pickles as its file's path (no
weights travel), so each worker maps and validates the file once, and sends chunks of sentences
(tokenized on the worker with the model's own tokenizer.json, HuggingFace's `tokenizers`), with
`dask.distributed.progress` showing a progress bar over the chunks. The result, one unit-length
384-d row per sentence in corpus order, is checked against the same chunks embedded in this process.

The workers import numpy, qrt and tokenizers only: not torch (the converted file is made once, by
semantic_search.cached_qrt, in this process).
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import sys
import sysconfig
import time
from collections.abc import Iterator

import numpy as np

import qrt

MAX_TOKENS = 256  # as semantic_search.MAX_TOKENS: sentence-transformers' max_seq_length for this model


def stdlib_sentences(limit: int) -> list[str]:
    """Up to `limit` distinct first lines (4 words or more) of the standard library's docstrings, in file order."""
    seen: dict[str, None] = {}
    for path in _stdlib_files():
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError, ValueError):  # the stdlib's deliberately broken test inputs
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                line = doc.strip().split("\n")[0].strip() if doc else ""
                if len(line.split()) >= 4:
                    seen.setdefault(line)
                    if len(seen) == limit:
                        return list(seen)
    return list(seen)


def _stdlib_files() -> Iterator[str]:
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}
    for root, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))


@functools.lru_cache(maxsize=1)  # once per worker process
def load_tokenizer(model_dir: str):
    """The model's own tokenizer (its tokenizer.json, as transformers' fast tokenizer loads it), padding
    each call's batch to its longest text and cutting texts at MAX_TOKENS, as semantic_search.tokenize."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.enable_truncation(MAX_TOKENS)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")  # no length: the longest
    return tok


def embed_chunk(model: qrt.Model, model_dir: str, texts: list[str]) -> np.ndarray:
    """Embeddings [len(texts), 384] of one chunk, on a worker (or in the client, for the check)."""
    enc = load_tokenizer(model_dir).encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    return model.run((ids, mask))


def embed_on_cluster(path: str, model_dir: str, texts: list[str], workers: int, chunk: int,
                     show_progress: bool = True) -> np.ndarray:
    """Embed texts on a LocalCluster of `workers` processes (one qrt thread each), in chunks of `chunk`."""
    from dask.distributed import Client, LocalCluster, progress

    chunks = [texts[i : i + chunk] for i in range(0, len(texts), chunk)]
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.run(qrt.set_num_threads, 1)  # one process per core: each worker's qrt on one thread
        model = client.scatter(qrt.load(path), broadcast=True)  # pickled as its path, loaded once per worker
        futures = client.map(embed_chunk, [model] * len(chunks), [model_dir] * len(chunks), chunks)
        if show_progress:
            progress(futures)  # a text progress bar on the console, one step per finished chunk
        return np.concatenate(client.gather(futures))


def run_example(cache: str, sentences: int = 2000, workers: int = 2, chunk: int = 64, quiet: bool = False,
                check: int | None = None) -> dict:
    """Embed `sentences` stdlib sentences on the cluster; check the first `check` (all by default)
    against the same chunks embedded in this process."""
    import semantic_search  # torch, for the first conversion only: imported here so that workers need not

    path = semantic_search.cached_qrt(cache)
    model_dir = semantic_search.model_dir()
    texts = stdlib_sentences(sentences)
    start = time.perf_counter()
    emb = embed_on_cluster(path, model_dir, texts, workers, chunk, show_progress=not quiet)
    seconds = time.perf_counter() - start

    # whole chunks, as the workers ran them: a chunk is one padded batch, and its longest text and the
    # scale of each dynamically quantized activation are the chunk's
    n_check = len(texts) if check is None else min(-(-check // chunk) * chunk, len(texts))
    model = qrt.load(path)
    local = np.concatenate([embed_chunk(model, model_dir, texts[i : i + chunk]) for i in range(0, n_check, chunk)])
    figures = {
        "sentences": len(texts),
        "same_bits": bool(np.array_equal(emb[:n_check], local)),
        "norm_max_error": float(np.abs(np.linalg.norm(emb, axis=1) - 1).max()),
        "seconds": seconds,
        "embeddings": emb,
    }
    if not quiet:
        print(f"\n{len(texts)} sentences on {workers} Dask workers in {seconds:.1f} s "
              f"({len(texts) / seconds:.0f} sentences/s, cluster start-up included): embeddings {emb.shape}")
        same = "the same bits as" if figures["same_bits"] else "NOT the same as"
        print(f"the first {n_check} are {same} this process's qrt run on the same chunks")
    return figures


def main() -> None:
    import semantic_search

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000, help="how many stdlib docstring lines to embed")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--chunk", type=int, default=64, help="sentences per task (one padded batch)")
    parser.add_argument("--cache", default=semantic_search.CACHE, help="where the converted .qrt is kept")
    parser.add_argument("--check", type=int, default=256, help="sentences checked against a local run")
    parser.add_argument("--out", help="save the embeddings here (.npy)")
    args = parser.parse_args()
    figures = run_example(args.cache, args.sentences, args.workers, args.chunk, check=args.check)
    if args.out:
        np.save(args.out, figures["embeddings"])
        print(f"saved {args.out}")
    return figures


if __name__ == "__main__":
    sys.exit(0 if main()["same_bits"] else 1)
