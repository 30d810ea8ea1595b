"""Recurrent models through the converter (issue 6): LSTM / GRU / RNN classifiers, streaming
LSTMCell / GRUCell step models, and an already-quantized LSTM, against PyTorch's quantize_dynamic.

Tolerances are those of tests/test_ops_recurrent.py (docs/NUMERICS.md): one cell step from the
same state within 3e-7 (torch's sigmoid and tanh are not correctly rounded); free-running sequences
within DRIFT_BOUND = 2e-2, about one quantization step of values in (-1, 1), since a last-bit
difference in h can flip a rounding at the next requantization. The Linear head is bit-exact when
it is given the same hidden state, and relu RNNs are bit-exact throughout.
"""

from __future__ import annotations

import warnings

import models
import numpy as np
import pytest
import torch
from torch import nn
from torch.ao.quantization import (
    default_dynamic_qconfig,
    float16_dynamic_qconfig,
    per_channel_dynamic_qconfig,
    quantize_dynamic,
)

import qrt
from qrt import format as qformat
from tools.convert import ConvertError, convert

warnings.filterwarnings("ignore", module=r"torch\.ao")

STEP_ATOL = 3e-7
DRIFT_BOUND = 2e-2
SCHEMES = {
    "qint8": ("qint8", "per-tensor", default_dynamic_qconfig, torch.qint8),
    "qint8_per_channel": ("qint8", "per-channel", per_channel_dynamic_qconfig, torch.qint8),
    "float16": ("float16", "per-tensor", float16_dynamic_qconfig, torch.float16),
}


def _convert(tmp_path, factory: str, shapes: list[str], scheme: str = "qint8") -> qrt.Model:
    ckpt, out = tmp_path / "m.pt", tmp_path / "m.qrt"
    torch.save(getattr(models, factory)().state_dict(), ckpt)
    weight_dtype, weights, _, _ = SCHEMES[scheme]
    convert(ckpt, out, model=f"models:{factory}", weight_dtype=weight_dtype, weights=weights, input_shapes=shapes)
    return qrt.load(out)


def _quantize_dynamic(factory: str, scheme: str, classes: set) -> nn.Module:
    _, _, qconfig, dtype = SCHEMES[scheme]
    return quantize_dynamic(getattr(models, factory)().eval(), {c: qconfig for c in classes}, dtype=dtype)


def _stored_weight(model: qrt.Model, op: str, port: str) -> np.ndarray:
    node = next(n for n in model.graph.nodes if n.op == op)
    return qformat.load_file(model.path).tensors[node.inputs[port]]


def _check_classifier(model: qrt.Model, want: nn.Module, x: np.ndarray) -> float:
    logits, h = model.run(x)
    with torch.no_grad():
        want_logits, want_h = want(torch.from_numpy(x))
        # The head given the same hidden state (qrt's own) is bit-exact.
        np.testing.assert_array_equal(logits, want.head(torch.from_numpy(h)).numpy())
    drift = float(np.abs(h - want_h.numpy()).max())
    assert h.shape == want_h.shape and drift <= DRIFT_BOUND
    # The logits move with h: the head's weights times the drift, plus one requantization step.
    bound = DRIFT_BOUND * float(want.head.weight().dequantize().abs().sum(1).max()) + DRIFT_BOUND
    assert np.abs(logits - want_logits.numpy()).max() <= bound
    return drift


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_lstm_classifier_matches_quantize_dynamic(tmp_path, scheme):
    model = _convert(tmp_path, "make_lstm_classifier", ["1,40,12"], scheme)
    assert [n.op for n in model.graph.nodes] == ["lstm_dynamic", "linear_dynamic"]
    want = _quantize_dynamic("make_lstm_classifier", scheme, {nn.LSTM, nn.Linear})
    if scheme != "float16":  # the converter's weights are quantize_dynamic's, integer for integer
        w = want.rnn._weight_bias()["weight"]["weight_hh_l0"]
        np.testing.assert_array_equal(_stored_weight(model, "lstm_dynamic", "l0_hh_weight"), w.int_repr().numpy())
    x = np.random.default_rng(0).standard_normal((4, 40, 12)).astype(np.float32)
    print(f"lstm {scheme}: drift of h_n after 40 steps {_check_classifier(model, want, x):.3g}")


@pytest.mark.parametrize("scheme", ["qint8", "float16"])
def test_gru_classifier_two_layers_bidirectional(tmp_path, scheme):
    model = _convert(tmp_path, "make_gru_classifier", ["30,3,9"], scheme)
    gru = next(n for n in model.graph.nodes if n.op == "gru_dynamic")
    assert gru.attrs["num_layers"] == 2 and gru.attrs["bidirectional"] and not gru.attrs["batch_first"]
    want = _quantize_dynamic("make_gru_classifier", scheme, {nn.GRU, nn.Linear})
    x = np.random.default_rng(1).standard_normal((30, 3, 9)).astype(np.float32)
    print(f"gru {scheme}: drift of h_n after 30 steps {_check_classifier(model, want, x):.3g}")


def test_rnn_classifier_is_a_loop_of_dynamic_rnn_cells(tmp_path):
    """PyTorch quantizes no nn.RNN: the reference is quantize_dynamic's RNNCell, looped (relu: exact)."""
    model = _convert(tmp_path, "make_rnn_classifier", ["1,25,9"])
    net = models.make_rnn_classifier().eval()
    rnn = net.rnn
    x = np.random.default_rng(2).standard_normal((3, 25, 9)).astype(np.float32)
    logits, h_n = model.run(x)
    seq = torch.from_numpy(x).transpose(0, 1)
    finals = []
    for layer in range(2):
        outs = []
        for suffix in ("", "_reverse"):
            cell = nn.RNNCell(seq.shape[2], 16, nonlinearity="relu")
            with torch.no_grad():
                for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(cell, part).copy_(getattr(rnn, f"{part}_l{layer}{suffix}"))
            qcell = quantize_dynamic(nn.Sequential(cell), {nn.RNNCell}, dtype=torch.qint8)[0]
            h, ys = torch.zeros(3, 16), [None] * seq.shape[0]
            with torch.no_grad():
                for t in reversed(range(seq.shape[0])) if suffix else range(seq.shape[0]):
                    h = ys[t] = qcell(seq[t], h)
            outs.append(torch.stack(ys))
            finals.append(h)
        seq = torch.cat(outs, dim=2)
    np.testing.assert_array_equal(h_n, torch.stack(finals).numpy())
    head = quantize_dynamic(nn.Sequential(net.head), {nn.Linear}, dtype=torch.qint8)[0]
    with torch.no_grad():
        np.testing.assert_array_equal(logits, head(torch.stack(finals)).numpy())


def test_last_layer_state_indexed(tmp_path):
    """head(h_n[-1]): the index counts from the end, and sequence length and batch stay free."""
    model = _convert(tmp_path, "make_last_step_classifier", ["20,1,9"])
    assert model.inputs[0].shape == (None, None, 9)
    assert [n.op for n in model.graph.nodes] == ["gru_dynamic", "select", "linear_dynamic"]
    want = _quantize_dynamic("make_last_step_classifier", "qint8", {nn.GRU, nn.Linear})
    rng = np.random.default_rng(7)
    for steps, batch in ((7, 3), (25, 1)):
        x = rng.standard_normal((steps, batch, 9)).astype(np.float32)
        with torch.no_grad():
            expected = want(torch.from_numpy(x)).numpy()
        bound = DRIFT_BOUND * float(want.head.weight().dequantize().abs().sum(1).max()) + DRIFT_BOUND
        assert np.abs(model.run(x) - expected).max() <= bound


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cell_step_model_streamed(tmp_path, kind):
    factory = f"make_step_{kind}"
    states = ["h", "c"] if kind == "lstm" else ["h"]
    model = _convert(tmp_path, factory, ["1,10"] + ["1,20"] * len(states))
    assert [s.name for s in model.inputs] == ["x", *states]
    assert [n.op for n in model.graph.nodes] == [f"{kind}_cell_dynamic", "linear_dynamic"]
    want = _quantize_dynamic(factory, "qint8", {nn.LSTMCell, nn.GRUCell, nn.Linear})
    rng = np.random.default_rng(3)
    torch_state = [np.zeros((2, 20), np.float32) for _ in states]
    free_state = [np.zeros((2, 20), np.float32) for _ in states]
    drift = 0.0
    for _ in range(25):
        x = (rng.standard_normal((2, 10)) * 1.5).astype(np.float32)
        with torch.no_grad():
            y_t, *next_t = (t.numpy() for t in want(torch.from_numpy(x), *map(torch.from_numpy, torch_state)))
        # One step from torch's own state: within a few ulps (c can exceed 1: relative there too).
        y_step, *next_step = model.run([x, *torch_state])
        for got, expected in zip(next_step, next_t):
            np.testing.assert_allclose(got, expected, rtol=STEP_ATOL, atol=STEP_ATOL)
        with torch.no_grad():  # the head given the same hidden state is bit-exact
            np.testing.assert_array_equal(y_step, want.head(torch.from_numpy(next_step[0])).numpy())
        # Free running, carrying qrt's own state as a device does.
        y_free, *free_state = model.run([x, *free_state])
        drift = max(drift, *(float(np.abs(g - w).max()) for g, w in zip(free_state, next_t)))
        torch_state = next_t
    print(f"{kind} cell: max state drift over 25 free-running steps {drift:.3g}")
    assert drift <= DRIFT_BOUND


def test_prequantized_lstm_saved_whole(tmp_path):
    quantized = _quantize_dynamic("make_lstm_classifier", "qint8_per_channel", {nn.LSTM, nn.Linear})
    ckpt, out = tmp_path / "whole.pt", tmp_path / "whole.qrt"
    torch.save(quantized, ckpt)
    with pytest.raises(ConvertError, match="--trust-checkpoint"):
        convert(ckpt, out, input_shapes=["1,15,12"])
    result = convert(ckpt, out, input_shapes=["1,15,12"], trust_checkpoint=True)
    assert result.mode == "prequantized"
    model = qrt.load(out)
    # PyTorch's integers and per-channel scales are kept exactly.
    w = quantized.rnn._weight_bias()["weight"]["weight_ih_l0"]
    np.testing.assert_array_equal(_stored_weight(model, "lstm_dynamic", "l0_ih_weight"), w.int_repr().numpy())
    np.testing.assert_array_equal(
        _stored_weight(model, "lstm_dynamic", "l0_ih_weight_scale"), w.q_per_channel_scales().numpy()
    )
    x = np.random.default_rng(4).standard_normal((5, 15, 12)).astype(np.float32)
    _check_classifier(model, quantized, x)


class Forecaster(nn.Module):
    """The time-series LSTM of many blog posts: its own zero state made in forward at x's batch, with
    requires_grad_() and detach(), device=x.device and dtype=x.dtype; the last step's output to a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 24, 2, batch_first=True)
        self.fc = nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = torch.zeros(2, x.shape[0], 24, device=x.device, dtype=x.dtype).requires_grad_()
        c0 = torch.zeros(2, x.size(0), 24, device=x.device).requires_grad_()
        out, _ = self.lstm(x, (h0.detach(), c0.detach()))
        return self.fc(out[:, -1, :])


@pytest.mark.parametrize("way", ["float", "quantized", "pt2"])
def test_zero_state_made_in_forward(tmp_path, way):
    """The three ways in: the float model quantized by the converter, torch's quantize_dynamic model saved whole,
    and a float .pt2 (where the zeros reach aten.lstm through aten.detach: it had failed inside torch.ao's
    prepare_fx with an AssertionError). Each agrees with torch's quantize_dynamic model within DRIFT_BOUND at
    batch 1 and 4."""
    torch.manual_seed(3)
    model = Forecaster().eval()
    want = quantize_dynamic(model, {nn.LSTM, nn.Linear}, dtype=torch.qint8)
    out = tmp_path / "f.qrt"
    if way == "float":
        torch.save(model.state_dict(), tmp_path / "f.pt")
        convert(tmp_path / "f.pt", out, model="test_convert_recurrent:Forecaster", input_shapes=["2,9,5"])
    elif way == "quantized":
        torch.save(want, tmp_path / "f.pt")
        convert(tmp_path / "f.pt", out, input_shapes=["2,9,5"], trust_checkpoint=True)
    else:
        dims = {"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}}
        torch.export.save(torch.export.export(model, (torch.randn(2, 9, 5),), dynamic_shapes=dims), tmp_path / "f.pt2")
        convert(tmp_path / "f.pt2", out)
    m = qrt.load(out)
    # torch.export fixes the length of an aten.lstm's input in the program (its own ranges), the batch stays free
    for batch, length in ((1, 9), (4, 9)) if way == "pt2" else ((1, 6), (4, 13)):
        x = np.random.default_rng(batch).standard_normal((batch, length, 5)).astype(np.float32)
        with torch.no_grad():
            ref = want(torch.from_numpy(x)).numpy()
        assert np.abs(m.run(x) - ref).max() <= DRIFT_BOUND


def test_unrolled_lstm_refused_by_name(tmp_path):
    """run_decompositions() unrolls aten.lstm into per-step ops (addmm, split_with_sizes, sigmoid, ... per time step):
    the conversion names the module and what to do. Each of those ops has a lowering, so the layer would otherwise
    run as float ops at the exported length, not as the model's quantized LSTM."""
    torch.manual_seed(3)
    program = torch.export.export(Forecaster().eval(), (torch.randn(2, 9, 5),)).run_decompositions()
    torch.export.save(program, tmp_path / "f.pt2")
    with pytest.raises(ConvertError, match=r"module 'lstm' \(torch\.nn\.modules\.rnn\.LSTM\) is unrolled into "
                                           r"per-step ops.*save the program without run_decompositions\(\)"):
        convert(tmp_path / "f.pt2", tmp_path / "f.qrt")


class MaxPooled(nn.Module):
    """Max pooling over time, in the forms text classifiers write it."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 16, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple:
        out, _ = self.lstm(x)
        pooled, _ = out.max(dim=1)
        return (self.fc(torch.max(out, 1)[0]), pooled, out.amax(1), torch.max(out, dim=1).values, torch.max(x),
                torch.amax(x, (0, 2), keepdim=True))


class MaxIndices(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, 1)[1]


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_max_pooling_over_time(tmp_path, frontend):
    """torch.max(x, dim)'s values (indexed, unpacked or .values), .amax and torch.max(x) are amax (format version 10);
    batch and length stay free. The maxima of the input are exact; those of the LSTM's outputs, and the head after
    them, within DRIFT_BOUND of torch's quantize_dynamic model (the sequence's drift). torch.max's indices are refused
    by name."""
    torch.manual_seed(4)
    torch.save(MaxPooled().state_dict(), tmp_path / "p.pt")
    result = convert(tmp_path / "p.pt", tmp_path / "p.qrt", model="test_convert_recurrent:MaxPooled",
                     input_shapes=["2,9,6"], frontend=frontend)
    assert result.shapes == {"x": "float32[?, ?, 6]"}
    m = qrt.load(tmp_path / "p.qrt")
    # six maxima, of which the head's torch.max(out, 1)[0] is pooled's again, kept once (merge_duplicates)
    assert m.metadata["qrt.version"] == "10" and sum(n.op == "amax" for n in m.graph.nodes) == 5
    torch.manual_seed(4)
    want = quantize_dynamic(MaxPooled().eval(), {nn.LSTM, nn.Linear}, dtype=torch.qint8)
    for batch, length in ((1, 5), (4, 12)):
        x = np.random.default_rng(length).standard_normal((batch, length, 6)).astype(np.float32)
        with torch.no_grad():
            ref = [r.numpy() for r in want(torch.from_numpy(x))]
        got = m.run(x)
        for g, r in zip(got[:4], ref[:4]):
            assert g.shape == r.shape and np.abs(g - r).max() <= DRIFT_BOUND
        for g, r in zip(got[4:], ref[4:]):
            assert g.shape == r.shape and np.array_equal(g, r)
    torch.save({}, tmp_path / "i.pt")
    with pytest.raises(ConvertError, match=r"the indices of torch.max\(x, dim\) are not supported"):
        convert(tmp_path / "i.pt", tmp_path / "i.qrt", model="test_convert_recurrent:MaxIndices", input_shapes=["2,9"],
                frontend=frontend)


class MixedZeroForms(nn.Module):
    """h0 as torch.zeros, c0 as x.new_zeros: both zeros (new_zeros had not counted as a zero state, and the
    export's leaf call raised a raw LoweringError out of convert)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 5, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0, c0 = torch.zeros((1, x.size(0), 5)), x.new_zeros((1, x.size(0), 5))
        return self.lstm(x, (h0, c0))[0]


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_zero_states_of_two_forms(tmp_path, frontend):
    torch.manual_seed(5)
    torch.save(MixedZeroForms().state_dict(), tmp_path / "z.pt")
    convert(tmp_path / "z.pt", tmp_path / "z.qrt", model="test_convert_recurrent:MixedZeroForms",
            input_shapes=["2,9,4"], frontend=frontend)
    torch.manual_seed(5)
    want = quantize_dynamic(MixedZeroForms().eval(), {nn.LSTM}, dtype=torch.qint8)
    x = np.random.default_rng(6).standard_normal((3, 7, 4)).astype(np.float32)
    with torch.no_grad():
        assert np.abs(qrt.load(tmp_path / "z.qrt").run(x) - want(torch.from_numpy(x)).numpy()).max() <= DRIFT_BOUND
