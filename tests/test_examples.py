"""Each example in examples/ converts, runs and agrees with PyTorch's own quantized model (issue 14).

The examples return the figures they print; these tests hold them to the bounds of docs/NUMERICS.md:
- a recurrent state after free-running steps is within DRIFT_BOUND = 2e-2 of torch's (about one
  quantization step of values in (-1, 1): torch's tanh and sigmoid differ from qrt's in the last bit,
  and on some CPUs from their own, and a last-bit difference in h can flip a rounding at the next
  step's requantization; tests/test_convert_recurrent.py);
- a Linear head after such a state is within DRIFT_BOUND * (1 + its largest absolute row sum): the
  state's change times the weights, plus one requantization step of its own input;
- a log_softmax after that head within twice the head's bound (it moves by the logit's own change
  plus the log-sum-exp's, which is at most the largest change);
- one cell step from torch's own state is within STEP_ATOL = 3e-7 per state value (torch's tanh and
  sigmoid are not correctly rounded), and a head after it within STEP_ATOL * (1 + row sum).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import g2p_phonemes  # noqa: E402
import keyword_spotting  # noqa: E402
import sequence_autoencoder  # noqa: E402
import streaming_lstm  # noqa: E402
import word_language_model  # noqa: E402

DRIFT_BOUND = 2e-2
STEP_ATOL = 3e-7


def head_bound(figures: dict, bound: float = DRIFT_BOUND) -> float:
    return bound * (1 + figures["head_row_sum"])


def test_keyword_spotting_any_batch_and_clip_length(tmp_path):
    figures = keyword_spotting.run_example(str(tmp_path), quiet=True)
    runs = {k: v for k, v in figures.items() if k != "head_row_sum"}
    assert set(runs) == {(1, 49), (32, 49), (8, 31)}  # batch and clip length are both free in the file
    for f in runs.values():
        assert f["max_abs_diff"] <= 2 * head_bound(figures)
        assert f["same_keyword"] >= 0.9  # a flip needs two keywords within the bound above: rare, not impossible


def test_streaming_lstm_cell(tmp_path):
    figures = streaming_lstm.run_example(str(tmp_path), quiet=True, frames=60)
    assert figures["step_max_abs_diff"] <= head_bound(figures, STEP_ATOL)
    assert figures["drift_max_abs_diff"] <= head_bound(figures)
    assert figures["stream_same_bits"]  # Model.stream() keeps the state inside: the same bits as carrying it


def test_sequence_autoencoder_any_length(tmp_path):
    figures = sequence_autoencoder.run_example(str(tmp_path), quiet=True)
    for steps in (50, 7, 120):  # converted at 50 steps
        assert figures[(steps, "clean")] <= head_bound(figures)
        assert figures[(steps, "anomalous")] <= head_bound(figures)
        assert figures[(steps, "separated")] >= 0.9


def test_word_language_model(tmp_path):
    figures = word_language_model.run_example(str(tmp_path), quiet=True, generate=12)
    for key in ((35, 1), (20, 4), (1, 1)):  # sequence length and batch are both free
        assert figures[key] <= 2 * head_bound(figures)
    assert figures["same_words"] >= 0.9


def test_g2p_trained_model_from_pypi(tmp_path):
    figures = g2p_phonemes.run_example(str(tmp_path), quiet=True)
    for word, f in figures.items():
        assert f["same_phonemes"], word
        assert f["encoder_max_abs_diff"] <= DRIFT_BOUND, word
