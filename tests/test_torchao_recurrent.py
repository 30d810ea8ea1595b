"""torchao models with a recurrent layer (issue 37): torchao quantizes the Linears, the nn.LSTM / GRU / RNN stays
float and runs as qrt's float recurrent op (rnn/lstm/gru_float), from a pickled module, a state_dict and a .pt2.

Tolerances: the float layer is held to twice the bound of tests/recurrent_bound.py (each of qrt and torch within
it of the exact layer; docs/NUMERICS.md). After it, Int8DynamicActivationInt8WeightConfig's head quantizes its
input per row, so one last-bit difference there can move a rounding by a whole step: the head is held to
torchao's bits on qrt's own input to it (tolerance 0, tests/test_torchao.py). Int8WeightOnlyConfig's head is
linear in its input, so the whole forward is held to the head's reordering bound plus the recurrent layers'
bounds carried through |W| (weight_only_bound).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recurrent_bound import layer_bound, step
from test_torchao import weight_only_bound
from torch import nn
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

import qrt
from qrt import format as qformat
from tools.compare import _with_outputs
from tools.convert import convert


class Tagger(nn.Module):
    """A recurrent layer of kind KIND (odd sizes), then a torchao Linear head on every step."""

    def __init__(self, kind: str = "lstm") -> None:
        super().__init__()
        if kind == "lstm":
            self.rnn = nn.LSTM(13, 11, num_layers=2, bidirectional=True, batch_first=True)
        elif kind == "gru":
            self.rnn = nn.GRU(13, 17, batch_first=True)
        else:
            self.rnn = nn.RNN(13, 9, nonlinearity="tanh", batch_first=True, bidirectional=True)
        width = self.rnn.hidden_size * (2 if self.rnn.bidirectional else 1)
        self.head = nn.Linear(width, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def _factory(kind: str) -> str:
    return f"{__name__}:{kind.upper()}_TAGGER"


LSTM_TAGGER, GRU_TAGGER, RNN_TAGGER = (lambda k=k: Tagger(k) for k in ("lstm", "gru", "rnn"))


def _quantized(kind: str, config) -> nn.Module:
    torch.manual_seed(len(kind))
    net = Tagger(kind).eval()
    quantize_(net, config)
    return net


def _layer_and_output(path, tmp_path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qrt's float recurrent layer output y and the model's output, from one run of the file."""
    qfile = qformat.load_file(path)
    layer = next(n for n in qfile.graph.nodes if n.op.endswith("_float"))
    out, y = _with_outputs(qfile, [layer.outputs[0]], str(tmp_path)).run(x)
    return y, out


def _check(net: nn.Module, path, tmp_path, batch: int, kind: str) -> float:
    """The layer within twice its bound of torch's; torchao's head on qrt's layer output gives qrt's bits."""
    x = (np.random.default_rng(batch).standard_normal((batch, 6, 13)) * 2).astype(np.float32)
    y, out = _layer_and_output(path, tmp_path, x)
    with torch.no_grad():
        want = net.rnn(torch.from_numpy(x))[0].numpy()
        head = net.head(torch.from_numpy(y)).numpy()
    _, (bound, *_) = layer_bound("rnn_tanh" if kind == "rnn" else kind, net.rnn, x)
    assert np.all(np.abs(y.astype(np.float64) - want) <= 2 * bound), f"{path} batch {batch}"
    np.testing.assert_array_equal(out, head, err_msg=f"{path} batch {batch}")
    return float(np.abs(y - want).max())


def _saved_program(tmp_path, net: nn.Module) -> str:
    path = str(tmp_path / "model.pt2")
    ep = torch.export.export(net, (torch.randn(3, 6, 13),), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    torch.export.save(ep, path)
    return path


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_dynamic_model_with_float_recurrent_layer(tmp_path, kind):
    """From its state_dict and --model, traced by torch.fx and exported by torch.export (the module in memory,
    called again), and from a .pt2 (the ATen op rebuilt as the module): the same ops, the layer within its
    bound, the head torchao's bits."""
    net = _quantized(kind, Int8DynamicActivationInt8WeightConfig())
    torch.save(net.state_dict(), tmp_path / "state.pt")
    frontends = ("fx", "export", "pt2") if kind == "lstm" else ("fx", "pt2")  # export: the slowest, once
    files = {frontend: tmp_path / f"{frontend}.qrt" for frontend in frontends}
    for frontend in frontends[:-1]:
        convert(tmp_path / "state.pt", files[frontend], model=_factory(kind), input_shapes=["2,6,13"],
                frontend=frontend)
    convert(_saved_program(tmp_path, net), files["pt2"], trust_checkpoint=True)
    worst = 0.0
    for how, path in files.items():
        assert [n.op for n in qrt.load(path).graph.nodes] == [f"{kind}_float", "linear_dynamic"], how
        for batch in (1, 4):
            worst = max(worst, _check(net, path, tmp_path, batch, kind))
    print(f"{kind}: float layer max |qrt - torch| {worst:.3g}")


class StatefulTagger(nn.Module):
    """An LSTM from given states, a GRUCell on its last output from a given state, a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.cell, self.head = nn.LSTM(5, 7, batch_first=True), nn.GRUCell(7, 6), nn.Linear(6, 3)

    def forward(self, x, h0, c0, hc):
        y, _ = self.rnn(x, (h0, c0))
        return self.head(self.cell(y[:, -1], hc))


def test_weight_only_model_with_states_and_a_cell_whole_forward_within_bound(tmp_path):
    """A .pt2 whose recurrent ops take the program's inputs as states (aten.lstm, aten.gru_cell): the whole
    forward within the head's reordering bound for torch's input to it, plus the recurrent layers' bounds
    carried through it."""
    torch.manual_seed(5)
    net = StatefulTagger().eval()
    quantize_(net, Int8WeightOnlyConfig())
    batch = torch.export.Dim("batch")
    example = (torch.randn(3, 4, 5), torch.randn(1, 3, 7), torch.randn(1, 3, 7), torch.randn(3, 6))
    ep = torch.export.export(net, example, dynamic_shapes=({0: batch}, {1: batch}, {1: batch}, {0: batch}))
    torch.export.save(ep, tmp_path / "s.pt2")
    convert(tmp_path / "s.pt2", tmp_path / "s.qrt", trust_checkpoint=True)
    ops = [n.op for n in qrt.load(tmp_path / "s.qrt").graph.nodes]
    assert ops == ["lstm_float", "select", "gru_cell_float", "linear_dynamic", "mul", "add"]
    w = {f"{what}_{side}": getattr(net.cell, f"{what}_{side}").detach().double().numpy()
         for what in ("weight", "bias") for side in ("ih", "hh")}
    rng = np.random.default_rng(6)
    seen = {}
    net.head.register_forward_hook(lambda m, a, out: seen.update(h=a[0].numpy()))  # torch's input to the head
    for b in (1, 5):
        x, h0, c0, hc = (rng.standard_normal(shape).astype(np.float32)
                         for shape in ((b, 4, 5), (1, b, 7), (1, b, 7), (b, 6)))
        with torch.no_grad():
            want = net(*map(torch.from_numpy, (x, h0, c0, hc))).numpy()
        (y, *_), (e_y, *_) = layer_bound("lstm", net.rnn, x, h0, c0)
        _, e_h, *_ = step("gru", w, y[:, -1], e_y[:, -1], hc.astype(np.float64), np.zeros_like(hc, np.float64))
        got = qrt.run(tmp_path / "s.qrt", [x, h0, c0, hc])
        assert np.all(np.abs(got.astype(np.float64) - want) <= weight_only_bound(net.head, seen["h"], 2 * e_h))
