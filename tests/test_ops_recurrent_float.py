"""The float recurrent ops (rnn/lstm/gru_float, *_cell_float; format version 8) against torch's float modules.

qrt runs each linear as linear_float's fixed chain of fmas and the gates with its own sigmoid and tanh; torch
runs MKL's and oneDNN's products (their own orders) and activations of their own. Neither is exact, so the
tolerance is the bound of tests/recurrent_bound.py, computed per element from the case's exact values: each side
within it of the exact result, the two within twice it. It is a guarantee, far above what is measured (the
worst case of any summation order, and of every sign over the steps): the tests run few steps and print what
they measure; docs/NUMERICS.md section 2.1 gives the figures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recurrent_bound import layer_bound, step

import qrt
from qrt.builder import GraphBuilder
from qrt.ops import layer_prefix

MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN, "rnn_relu": torch.nn.RNN}
CELLS = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell, "rnn_tanh": torch.nn.RNNCell, "rnn_relu": torch.nn.RNNCell}


def _op(kind: str) -> tuple[str, dict]:
    """(op family name, the kind's attributes)."""
    if kind.startswith("rnn"):
        return "rnn", {"nonlinearity": kind[4:]}
    return kind, {}


def _module(kind: str, *args, **kw) -> torch.nn.Module:
    extra = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    return MODULES[kind](*args, **kw, **extra).eval()


def sequence_file(path, kind: str, m: torch.nn.Module, states: bool) -> None:
    """One {kind}_float node over m's weights; h0 (and c0) inputs if states."""
    op, attrs = _op(kind)
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, None, m.input_size])}
    names = ["h0", "c0"] if kind == "lstm" else ["h0"]
    if states:
        for s in names:
            ports[s] = g.input(s, "float32", [m.num_layers * (2 if m.bidirectional else 1), None, m.hidden_size])
    dirs = 2 if m.bidirectional else 1
    for n in range(m.num_layers):
        for d in range(dirs):
            sfx, prefix = f"_l{n}" + ("_reverse" if d else ""), layer_prefix(n, d == 1)
            for side in ("ih", "hh"):
                ports[f"{prefix}{side}_weight"] = getattr(m, f"weight_{side}{sfx}").detach().numpy().copy()
                if m.bias:
                    ports[f"{prefix}{side}_bias"] = getattr(m, f"bias_{side}{sfx}").detach().numpy().copy()
    attrs.update(num_layers=m.num_layers, bidirectional=m.bidirectional, batch_first=m.batch_first)
    g.output(*g.node(f"{op}_float", ports, attrs))
    g.save(path)


def _assert_within(name: str, got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> float:
    diff = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(diff - 2 * bound), diff.shape)
    assert np.all(diff <= 2 * bound), f"{name}: |diff| {diff[worst]:.3g} > bound {2 * bound[worst]:.3g} at {worst}"
    return float(diff.max())


# (input, hidden, layers, bidirectional, batch_first, steps, batch, states given)
SHAPES = [(13, 24, 1, False, False, 5, 1, False), (7, 9, 2, True, True, 4, 3, True),
          (1, 1, 1, False, False, 3, 2, True)]


@pytest.mark.parametrize("kind", list(MODULES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:2])) + f"_L{s[2]}{'bi' if s[3] else ''}")
def test_sequence_within_the_bound_of_torch(tmp_path, kind, shape):
    inputs, hidden, layers, bi, batch_first, steps, batch, states = shape
    torch.manual_seed(inputs * hidden + layers)
    m = _module(kind, inputs, hidden, num_layers=layers, bidirectional=bi, batch_first=batch_first, bias=inputs != 1)
    sequence_file(tmp_path / "s.qrt", kind, m, states)
    rng = np.random.default_rng(hidden)
    x = (rng.standard_normal((batch, steps, inputs) if batch_first else (steps, batch, inputs)) * 2).astype(np.float32)
    shape_s = (layers * (2 if bi else 1), batch, hidden)
    given = [(rng.standard_normal(shape_s) * 0.5).astype(np.float32) for _ in range(2 if kind == "lstm" else 1)]
    feed = {"x": x}
    if states:
        feed.update(zip(("h0", "c0"), given))
    hx = tuple(map(torch.from_numpy, given)) if kind == "lstm" else torch.from_numpy(given[0])
    with torch.no_grad():
        y, final = m(torch.from_numpy(x), hx if states else None)
    want = [y.numpy(), *(f.numpy() for f in (final if kind == "lstm" else (final,)))]
    got = qrt.run(tmp_path / "s.qrt", feed)
    exact, bound = layer_bound(kind, m, x, *(given if states else ()))
    worst = 0.0
    for name, g, w, b in zip(("y", "h_n", "c_n"), got, want, bound):
        worst = max(worst, _assert_within(name, g, w, b))
    print(f"{kind} {shape}: max |qrt - torch| {worst:.3g}, bound {2 * bound[0].max():.3g}")


@pytest.mark.parametrize("kind", list(CELLS))
@pytest.mark.parametrize("inputs, hidden, batch", [(1, 1, 1), (37, 13, 1), (5, 29, 6)])
def test_cell_one_step_within_the_bound_of_torch(tmp_path, kind, inputs, hidden, batch):
    torch.manual_seed(inputs + hidden)
    extra = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    cell = CELLS[kind](inputs, hidden, bias=batch != 6, **extra).eval()
    op, attrs = _op(kind)
    states = ["h", "c"] if kind == "lstm" else ["h"]
    g = GraphBuilder()
    ports = {"x": g.input("x", "float32", [None, inputs]), **{s: g.input(s, "float32", [None, hidden]) for s in states}}
    for side in ("ih", "hh"):
        ports[f"{side}_weight"] = getattr(cell, f"weight_{side}").detach().numpy().copy()
        if cell.bias:
            ports[f"{side}_bias"] = getattr(cell, f"bias_{side}").detach().numpy().copy()
    outs = g.node(f"{op}_cell_float", ports, attrs)
    g.output(*([outs] if isinstance(outs, str) else outs), as_tuple=True)
    g.save(tmp_path / "c.qrt")
    rng = np.random.default_rng(batch)
    x = (rng.standard_normal((batch, inputs)) * 2).astype(np.float32)
    hc = [(rng.standard_normal((batch, hidden)) * 0.5).astype(np.float32) for _ in states]
    with torch.no_grad():
        out = cell(torch.from_numpy(x), tuple(map(torch.from_numpy, hc)) if kind == "lstm" else torch.from_numpy(hc[0]))
    want = [o.numpy() for o in (out if kind == "lstm" else (out,))]
    got = qrt.run(tmp_path / "c.qrt", {"x": x, **dict(zip(states, hc))})
    w = {f"weight_{s}": getattr(cell, f"weight_{s}").detach().double().numpy() for s in ("ih", "hh")}
    for s in ("ih", "hh"):
        w[f"bias_{s}"] = getattr(cell, f"bias_{s}").detach().double().numpy() if cell.bias else \
            np.zeros(w[f"weight_{s}"].shape[0])
    zero = np.zeros((batch, hidden))
    args = [np.float64(v) for v in (x, *hc)]
    h2, eh2, c2, ec2 = step(kind, w, args[0], np.zeros_like(args[0]), args[1], zero,
                            *(args[2], zero) if kind == "lstm" else ())
    for name, gv, wv, b in zip(("h", "c"), got, want, (eh2, ec2)):
        _assert_within(name, gv, wv, b)


def test_bits_independent_of_threads_and_batching(tmp_path, threads):
    """Split as finely as it goes, on any number of threads, and a sample run alone or in a batch: the same bits."""
    torch.manual_seed(3)
    m = _module("lstm", 19, 37, num_layers=2, bidirectional=True)
    sequence_file(tmp_path / "t.qrt", "lstm", m, False)
    x = np.random.default_rng(4).standard_normal((6, 5, 19)).astype(np.float32)
    model = qrt.load(tmp_path / "t.qrt")
    whole = model.run({"x": x})
    alone = model.run({"x": x[:, 2:3]})
    np.testing.assert_array_equal(alone[0], whole[0][:, 2:3])
    for got, want in zip(whole, qrt.run(tmp_path / "t.qrt", {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_version_8_and_bad_nodes(tmp_path):
    """Written as version 8 and refused, naming the op, by a header that says 7; int8 weights, a missing layer's
    weights and a state of the wrong shape are refused by name."""
    torch.manual_seed(0)
    m = _module("gru", 4, 3)
    sequence_file(tmp_path / "g.qrt", "gru", m, True)
    data = (tmp_path / "g.qrt").read_bytes()
    assert qrt.load(tmp_path / "g.qrt").metadata["qrt.version"] == "8"
    (tmp_path / "v7.qrt").write_bytes(data.replace(b'"qrt.version":"8"', b'"qrt.version":"7"', 1))
    with pytest.raises(qrt.FormatError, match=r"op 'gru_float' needs format version 8, the file says 7"):
        qrt.load(tmp_path / "v7.qrt")
    w_ih, w_hh = m.weight_ih_l0.detach().numpy(), m.weight_hh_l0.detach().numpy()
    for ports, attrs, message in (
        ({"l0_ih_weight": w_ih.astype(np.int8), "l0_hh_weight": w_hh}, {}, "l0_ih_weight"),
        ({"l0_ih_weight": w_ih, "l0_hh_weight": w_hh}, {"num_layers": 2}, "missing input l1_ih_weight"),
        ({"l0_ih_weight": w_ih, "l0_hh_weight": w_hh[:, :2]}, {}, r"l0_hh_weight must have shape \[3 \* hidden"),
    ):
        g = GraphBuilder()
        g.output(*g.node("gru_float", {"x": g.input("x", "float32", [None, None, 4]), **ports}, attrs))
        with pytest.raises(qrt.FormatError, match=message):
            g.save(tmp_path / "bad.qrt")
    with pytest.raises(ValueError, match=r"h0 has shape \[1, 3, 3\], expected \[1, 2, 3\]"):
        qrt.run(tmp_path / "g.qrt", {"x": np.zeros((5, 2, 4), np.float32), "h0": np.zeros((1, 3, 3), np.float32)})
