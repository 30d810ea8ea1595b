"""The float recurrent ops (rnn/lstm/gru_float, *_cell_float) on the CUDA backend: the CPU's bits.

Their linears are linear_float's chains of fmas (qrt/cuda/linear_chain.cu, linear_f32, in the CPU's order) and
their gates the CPU's sigmoid and tanh compiled as device code (qrt/cuda/rnn_cell.cu), so every output must equal
the CPU's exactly, over many steps too. Skip, with the reason, without CuPy or a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import GATES, needs_gpu

import qrt
from qrt.builder import GraphBuilder
from qrt.ops import layer_prefix

RNG = np.random.default_rng(88)


def _float_set(prefix: str, rows: int, k: int, bias: bool) -> dict:
    """Weights scaled so that gate pre-activations are O(1), not saturated."""
    out = {f"{prefix}weight": RNG.normal(0, 1 / np.sqrt(max(k, 1)), (rows, k)).astype(np.float32)}
    if bias:
        out[f"{prefix}bias"] = RNG.normal(0, 0.1, rows).astype(np.float32)
    return out


def _same_bits(path, inputs) -> None:
    want = qrt.load(path).run(inputs)
    got = qrt.load(path, device="cuda").run(inputs)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray) and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@needs_gpu
@pytest.mark.parametrize("kind,act", [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None)])
@pytest.mark.parametrize("n_in,hidden", [(1, 1), (37, 129)])
def test_cells(tmp_path, kind, act, n_in, hidden):
    b = GraphBuilder()
    states = ("h", "c") if kind == "lstm" else ("h",)
    ports = {"x": b.input("x", "float32", [None, n_in]), **{s: b.input(s, "float32", [None, hidden]) for s in states}}
    for side, k in (("ih_", n_in), ("hh_", hidden)):
        ports.update(_float_set(side, GATES[kind] * hidden, k, bias=side == "ih_" or hidden > 1))
    out = b.node(f"{kind}_cell_float", ports, {"nonlinearity": act} if act else {})
    b.output(*(out if isinstance(out, tuple) else (out,)), as_tuple=True)
    b.save(tmp_path / "cell.qrt")
    for batch in (1, 5):
        inputs = {"x": RNG.normal(0, 1, (batch, n_in)).astype(np.float32)}
        inputs.update({s: RNG.normal(0, 0.5, (batch, hidden)).astype(np.float32) for s in states})
        _same_bits(tmp_path / "cell.qrt", inputs)


@needs_gpu
@pytest.mark.parametrize("kind,act", [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None)])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_sequences(tmp_path, kind, act, layers, bidirectional):
    """1 and 9 steps (and 200 for one layer), with and without initial states, batch first or not."""
    n_in, hidden, dirs = 11, 19, 2 if bidirectional else 1
    states = ("h", "c") if kind == "lstm" else ("h",)
    for steps, batch, batch_first, given in ((1, 1, False, False), (9, 3, True, True), (200, 2, False, False)):
        if steps == 200 and layers > 1:
            continue
        b = GraphBuilder()
        ports = {"x": b.input("x", "float32", [None, None, n_in])}
        if given:
            ports.update({f"{s}0": b.input(f"{s}0", "float32", [layers * dirs, None, hidden]) for s in states})
        for n in range(layers):
            for d in range(dirs):
                for side, k in (("ih_", n_in if n == 0 else dirs * hidden), ("hh_", hidden)):
                    ports.update(_float_set(layer_prefix(n, d == 1) + side, GATES[kind] * hidden, k, bias=n == 0))
        attrs = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first}
        b.output(*b.node(f"{kind}_float", ports, attrs | ({"nonlinearity": act} if act else {})))
        b.save(tmp_path / "seq.qrt")
        shape = (batch, steps, n_in) if batch_first else (steps, batch, n_in)
        inputs = {"x": RNG.normal(0, 1, shape).astype(np.float32)}
        if given:
            inputs.update({f"{s}0": RNG.normal(0, 0.5, (layers * dirs, batch, hidden)).astype(np.float32)
                           for s in states})
        _same_bits(tmp_path / "seq.qrt", inputs)
