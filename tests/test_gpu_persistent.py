"""The persistent recurrent kernels (qrt/cuda/rnn_persistent.cu) against the CPU and the launch loop, bit for bit.

Every sequence runs three ways: on the CPU, on the GPU with the persistent kernel demanded
(recurrent.PERSISTENT = True: ValueError if it did not apply) and with the loop of launches
(PERSISTENT = False). Each model is run three times with new inputs, so that the second and third
calls replay its CUDA graph (the barrier's counter must be zeroed by the graph itself).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import RECURRENT_WEIGHTS, _sequence_inputs, _sequence_model, needs_gpu

import qrt
from qrt.gpu import recurrent

KINDS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None)]
KIND_IDS = ["rnn_tanh", "rnn_relu", "lstm", "gru"]


@pytest.fixture(autouse=True)
def _restore_settings(monkeypatch):
    monkeypatch.setattr(recurrent, "PERSISTENT", None)
    monkeypatch.setattr(recurrent, "PERSISTENT_BLOCKS", None)
    monkeypatch.setitem(RECURRENT_WEIGHTS, "qint8_per_channel", (False, True, False))


def _runs(path, setting, calls):
    """Outputs of each call of one GPU model loaded under a PERSISTENT setting (its graph captured then)."""
    recurrent.PERSISTENT = setting
    model = qrt.load(path, device="cuda")
    return [model.run(inputs) for inputs in calls]


def _check(tmp_path, kind, act, hidden, batch, steps, *, layers=1, bidirectional=False, n_in=20,
           weights="qint8_per_channel", states=True, batch_first=False, persistent=True):
    dirs = 2 if bidirectional else 1
    if act == "relu":  # a ReLU RNN's state grows without bound over long runs of these random weights, and
        steps = min(steps, 20)  # the CPU refuses the infinities it reaches (seen at 100 steps, hidden 256)
    path, names = _sequence_model(tmp_path, kind, n_in, hidden, layers, bidirectional, batch_first, states,
                                  weights, act or "tanh")
    calls = [_sequence_inputs(kind, names, steps, batch, n_in, hidden, layers, dirs, batch_first, states)
             for _ in range(3)]
    cpu = qrt.load(path)
    want = [cpu.run(inputs) for inputs in calls]
    for setting in (persistent, False):
        for got, w in zip(_runs(path, setting, calls), want):
            assert [g.shape for g in got] == [v.shape for v in w]
            for g, v in zip(got, w):
                np.testing.assert_array_equal(g, v, err_msg=f"PERSISTENT={setting}")


SIZES = [(1, 1, 5), (7, 3, 5), (64, 32, 5), (64, 3, 100), (256, 1, 100), (256, 32, 5), (1024, 1, 100),
         (1024, 32, 5), (1024, 3, 2)]


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("hidden,batch,steps", SIZES)
def test_sequence_matches_cpu(tmp_path, kind, act, hidden, batch, steps):
    _check(tmp_path, kind, act, hidden, batch, steps)


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("hidden,batch,steps", [(7, 3, 5), (256, 32, 100)])
def test_long_sequence_matches_cpu(tmp_path, kind, act, hidden, batch, steps):
    _check(tmp_path, kind, act, hidden, batch, steps, n_in=128, weights="qint8")


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("batch_first", [False, True])
def test_two_bidirectional_layers(tmp_path, kind, act, batch_first):
    """Reverse directions, interleaved outputs, a second layer fed the first's: the CPU's bits."""
    _check(tmp_path, kind, act, 64, 3, 7, layers=2, bidirectional=True, batch_first=batch_first)


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
def test_without_initial_states(tmp_path, kind, act):
    _check(tmp_path, kind, act, 33, 2, 9, states=False, bidirectional=True)


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
def test_one_step_takes_the_loop(tmp_path, kind, act):
    """The kernel needs two steps or more; one step runs the launches (and the same bits)."""
    _check(tmp_path, kind, act, 64, 3, 1, persistent=None)
    path, names = _sequence_model(tmp_path, kind, 20, 64, 1, False, False, True, "qint8", act or "tanh")
    with pytest.raises(ValueError, match="one step"):
        _runs(path, True, [_sequence_inputs(kind, names, 1, 3, 20, 64, 1, 1, False, True)])


@needs_gpu
@pytest.mark.parametrize("kind,act", [("lstm", None), ("rnn", "tanh")], ids=["lstm", "rnn_tanh"])
def test_weight_zero_points_take_the_loop(tmp_path, kind, act):
    _check(tmp_path, kind, act, 19, 3, 5, weights="qint8_per_channel_wzp", persistent=None)
    path, names = _sequence_model(tmp_path, kind, 20, 19, 1, False, False, True, "qint8_per_channel_wzp",
                                  act or "tanh")
    with pytest.raises(ValueError, match="zero points"):
        _runs(path, True, [_sequence_inputs(kind, names, 5, 3, 20, 19, 1, 1, False, True)])


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("grid", [1, 2, 3, 5, 16, 1000])
def test_every_grid_gives_the_same_bits(tmp_path, monkeypatch, kind, act, grid):
    """Units split over any number of blocks (a last block with fewer units, one block, one per SM)."""
    monkeypatch.setattr(recurrent, "PERSISTENT_BLOCKS", grid)
    _check(tmp_path, kind, act, 37, 5, 6, bidirectional=True)


@needs_gpu
@pytest.mark.parametrize("kind,act", KINDS, ids=KIND_IDS)
def test_nan_state_as_the_loop(tmp_path, kind, act):
    """A NaN in h0 (the CPU raises): the persistent kernel gives the loop's bits, NaN where it gives NaN."""
    path, names = _sequence_model(tmp_path, kind, 20, 16, 1, False, False, True, "qint8", act or "tanh")
    inputs = _sequence_inputs(kind, names, 4, 2, 20, 16, 1, 1, False, True)
    inputs["h0"][0, 1, 3] = np.nan
    looped, persistent = _runs(path, False, [inputs])[0], _runs(path, True, [inputs])[0]
    for g, w in zip(persistent, looped):
        np.testing.assert_array_equal(g, w)
