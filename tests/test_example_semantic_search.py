"""examples/semantic_search.py and examples/embed_corpus_dask.py (issue 38 item 5): all-MiniLM-L6-v2,
quantized by torch's quantize_dynamic and converted, answers queries as torch's quantized model does,
and embeds a corpus on Dask workers that load the model from its pickled path.

What the example shows is held here: qrt's top hits are torch's, and each query finds its sentence. How close
the embeddings are is tests/test_convert_transformer.py's to hold (its docstring gives the bounds and why): the
Linears are bit-exact and the attention, layer_norm and gelu give torch's bits, so only the pooling's last bits
differ (6e-8 here; the example prints the figures).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import embed_corpus_dask  # noqa: E402
import semantic_search  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One conversion for the module: the first test converts, the next finds the cached file."""
    return str(tmp_path_factory.mktemp("minilm"))


def test_semantic_search_top_hits_are_torchs(cache):
    figures = semantic_search.run_example(cache, quiet=True)
    assert figures["same_top_hits"]
    assert list(figures["hits"][:, 0]) == list(semantic_search.QUERIES.values())  # each query finds its sentence
    assert os.path.exists(os.path.join(cache, semantic_search.QRT_NAME))  # cached for the next run


def test_workers_tokenize_as_the_models_own_tokenizer():
    """The Dask workers' tokenizer (tokenizers, tokenizer.json) gives the ids and mask transformers' does,
    padding included, and cuts at MAX_TOKENS as it does."""
    texts = ["Short one.", "A somewhat longer sentence, with punctuation; and CAPITALS!", "word " * 300]
    tok = embed_corpus_dask.load_tokenizer(semantic_search.model_dir())
    enc = tok.encode_batch(texts)
    want_ids, want_mask = semantic_search.tokenize(semantic_search.tokenizer(), texts)
    assert want_ids.shape == (3, semantic_search.MAX_TOKENS)
    np.testing.assert_array_equal(np.array([e.ids for e in enc]), want_ids)
    np.testing.assert_array_equal(np.array([e.attention_mask for e in enc]), want_mask)


def test_dask_workers_embed_with_the_same_bits(cache):
    """Two worker processes, the Model scattered to them pickled as its path: every row is the bits this
    process computes for the same chunk (the same kernels on the same CPU), in corpus order."""
    figures = embed_corpus_dask.run_example(cache, sentences=96, workers=2, chunk=32, quiet=True)
    assert figures["embeddings"].shape == (96, 384)
    assert figures["same_bits"]
    # unit rows: F.normalize's float32 result, each of 384 values within 2^-24 of its own size, so the
    # norm within about 1e-7 of 1; 1e-6 leaves room for numpy's float32 sum of squares
    assert figures["norm_max_error"] <= 1e-6
