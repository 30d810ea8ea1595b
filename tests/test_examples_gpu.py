"""The examples on the GPU (QRT_DEVICE=cuda, examples/common.py load), every call checked against the CPU's bits.

Each example loads its converted models through common.load. Here that returns a pair of models, one
loaded for the CPU and one for the GPU, whose run (and stream steps) run both and require the same
bytes from each, then hand the CPU's result to the example: the example runs once (one training), and
every call it makes, at every batch, sequence length and carried state it uses, is held to the CPU's
bits. The sequence autoencoder is left out for time (it trains for a minute); its LSTM and Linear
layers run in the other examples and in tests/test_gpu.py. Skips, with the reason, without CuPy or a GPU.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from test_gpu import _MISSING

import qrt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import common  # noqa: E402
import keyword_spotting  # noqa: E402
import semantic_search  # noqa: E402
import streaming_lstm  # noqa: E402
import word_language_model  # noqa: E402

pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")

RUNS = {
    "keyword_spotting": lambda d: keyword_spotting.run_example(d, quiet=True),
    "semantic_search": lambda d: semantic_search.run_example(d, quiet=True),
    "streaming_lstm": lambda d: streaming_lstm.run_example(d, quiet=True, frames=60),
    "word_language_model": lambda d: word_language_model.run_example(d, quiet=True, generate=12),
}


def _leaves(value) -> list[np.ndarray]:
    return [a for v in value for a in _leaves(v)] if isinstance(value, tuple) else [np.asarray(value)]


def _same(cpu_out, gpu_out, where: str) -> None:
    got, want = _leaves(gpu_out), _leaves(cpu_out)
    assert [a.shape for a in got] == [a.shape for a in want], where
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want)), f"{where}: the GPU's bits differ from the CPU's"


class _BothStreams:
    def __init__(self, cpu: qrt.plan.Stream, gpu: qrt.plan.Stream) -> None:
        self.cpu, self.gpu = cpu, gpu

    def step(self, inputs):
        want = self.cpu.step(inputs)
        _same(want, self.gpu.step(inputs), "stream step")
        return want

    def __getattr__(self, name):
        return getattr(self.cpu, name)


class _BothDevices:
    """A model loaded for the CPU and for the GPU, run on both and compared on every call."""

    def __init__(self, path: str) -> None:
        self.cpu, self.gpu = qrt.load(path), qrt.load(path, device="cuda")

    def run(self, inputs):
        want = self.cpu.run(inputs)
        _same(want, self.gpu.run(inputs), f"{self.cpu.path} run")
        return want

    def stream(self, *args, **kwargs) -> _BothStreams:
        return _BothStreams(self.cpu.stream(*args, **kwargs), self.gpu.stream(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self.cpu, name)


@pytest.mark.parametrize("example", sorted(RUNS))
def test_example_on_gpu_gives_the_cpu_bits(tmp_path, monkeypatch, example):
    calls = []

    def load(path: str) -> _BothDevices:
        calls.append(path)
        return _BothDevices(path)

    monkeypatch.setattr(common, "load", load)
    RUNS[example](str(tmp_path))
    assert calls, f"{example} loaded no model through common.load"
