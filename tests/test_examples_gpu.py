"""The examples on the GPU (QRT_DEVICE=cuda, examples/common.py load): the same figures as on the CPU.

Each example compares its qrt model's outputs with PyTorch's and returns the differences it measured.
Run once with its models on the CPU and once on the GPU, from the same trained weights (training is
seeded and deterministic on the CPU), it must return the same figures exactly: the GPU gives the CPU's
bits, so every difference from torch is the same float. Skips, with the reason, without CuPy or a GPU.
"""

from __future__ import annotations

import os
import sys

import pytest
from test_gpu import _MISSING

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import common  # noqa: E402
import keyword_spotting  # noqa: E402
import sequence_autoencoder  # noqa: E402
import streaming_lstm  # noqa: E402
import word_language_model  # noqa: E402

pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")

RUNS = {
    "keyword_spotting": lambda d: keyword_spotting.run_example(d, quiet=True),
    "streaming_lstm": lambda d: streaming_lstm.run_example(d, quiet=True, frames=60),
    "sequence_autoencoder": lambda d: sequence_autoencoder.run_example(d, quiet=True),
    "word_language_model": lambda d: word_language_model.run_example(d, quiet=True, generate=12),
}


@pytest.mark.parametrize("example", sorted(RUNS))
def test_example_same_figures_on_gpu(tmp_path, monkeypatch, example):
    figures = {}
    for device in ("cpu", "cuda"):
        monkeypatch.setattr(common, "DEVICE", device)
        (tmp_path / device).mkdir()
        figures[device] = RUNS[example](str(tmp_path / device))
    assert figures["cuda"] == figures["cpu"]
