"""qrt.io: model inputs from .npy / .npz files, and random inputs of a model's dtypes and shapes."""

from __future__ import annotations

import numpy as np
import pytest

import qrt
from qrt import io as qio
from qrt.builder import GraphBuilder
from qrt.graph import parse_graph
from qrt.ops import ValueInfo


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """forward(x, state=(h, c)): three flat inputs."""
    b = GraphBuilder()
    x, h, c = (b.input(n, "float32", [None, 3]) for n in ("x", "state.0", "state.1"))
    b.input_nested((x, (h, c)))
    b.output(b.node("add", {"a": x, "b": h}), b.node("add", {"a": h, "b": c}))
    path = tmp_path_factory.mktemp("io") / "step.qrt"
    b.save(path)
    return qrt.load(path)


def test_load_inputs_from_files_and_an_archive(step, tmp_path):
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in ("x", "state.0", "state.1")}
    np.savez(tmp_path / "in.npz", **arrays)
    for n, a in arrays.items():
        np.save(tmp_path / f"{n}.npy", a)
    from_archive = qio.load_inputs(step.inputs, archive=tmp_path / "in.npz")
    from_files = qio.load_inputs(step.inputs, [f"{n}={tmp_path / n}.npy" for n in arrays])
    other = np.zeros((2, 3), np.float32)
    np.save(tmp_path / "other.npy", other)
    mixed = qio.load_inputs(step.inputs, [f"x={tmp_path / 'other.npy'}"], str(tmp_path / "in.npz"))
    for got in (from_archive, from_files):
        assert set(got) == set(arrays)
        for n, a in arrays.items():
            np.testing.assert_array_equal(got[n], a)
    np.testing.assert_array_equal(mixed["x"], other)  # a file replaces the archive's array
    step.run(from_archive)  # the names are the model's flat input names


def test_one_input_model_takes_any_name(tmp_path):
    b = GraphBuilder()
    b.output(b.node("relu", {"x": b.input("x", "float32", [None, 2])}))
    b.save(tmp_path / "relu.qrt")
    specs = qrt.load(tmp_path / "relu.qrt").inputs
    np.savez(tmp_path / "one.npz", whatever=np.ones((1, 2), np.float32))
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    assert list(qio.load_inputs(specs, archive=tmp_path / "one.npz")) == ["x"]
    assert list(qio.load_inputs(specs, [str(tmp_path / "x.npy")])) == ["x"]


def test_errors_name_the_file_or_the_inputs(step, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32), extra=np.ones(1))
    (tmp_path / "text.npy").write_text("not an array")
    cases = [
        (lambda: qio.read_array(tmp_path / "missing.npy"), "input file .*missing.npy' does not exist"),
        (lambda: qio.read_array(tmp_path), "is a directory"),
        (lambda: qio.read_array(tmp_path / "text.npy"), "cannot read .*text.npy' as a .npy array"),
        (lambda: qio.read_array(tmp_path / "in.npz"), "is an .npz archive, not one .npy array"),
        (lambda: qio.read_archive(tmp_path / "x.npy"), "is a single .npy array, not an .npz archive"),
        (lambda: qio.read_archive(tmp_path / "text.npy"), "cannot read .*text.npy' as an .npz archive"),
        (lambda: qio.load_inputs(step.inputs, [str(tmp_path / "x.npy")]),
         r"the model takes 3 inputs \['x', 'state.0', 'state.1'\]: give each file as NAME=FILE.npy"),
        (lambda: qio.load_inputs(step.inputs, archive=tmp_path / "in.npz"),
         r"inputs do not fit the model: it takes .*; missing \['state.0', 'state.1'\]; unknown \['extra'\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_random_inputs_find_time_axes_and_index_ranges():
    """Token ids -> embedding -> linear -> a batch-first LSTM: the ids' free axis 1 is the time axis, and
    they index the table's 7 rows; h0 of [1, ?, 4] gets the batch; other integers stay within [-128, 255]."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    ids = b.input("ids", "int64", [None, None])
    e = b.node("embedding", {"indices": ids, "weight": rng.standard_normal((7, 5)).astype(np.float32)})
    y = b.node("linear_float", {"x": e, "weight": rng.standard_normal((6, 5)).astype(np.float32)})
    h0 = b.input("h0", "float32", [1, None, 4])
    w = {"l0_ih_weight": rng.standard_normal((16, 6)), "l0_hh_weight": rng.standard_normal((16, 4))}
    out = b.node("lstm_dynamic", {"x": y, "h0": h0, "c0": b.input("c0", "float32", [1, None, 4]),
                                  **{k: v.astype(np.float16) for k, v in w.items()}}, {"batch_first": True})
    b.input("flags", "int8", [None])
    b.output(out[0])
    infos = {k: ValueInfo(v.dtype.name, v.shape) for k, v in b.tensors.items()}
    g = parse_graph(b.graph(), infos, b.tensors, qrt.format.FORMAT_VERSION)
    assert qio.time_axes(g) == {"ids": 1}
    r = qio.random_inputs(g, batch=3, seq=11, seed=1)
    assert r["ids"].shape == (3, 11) and r["ids"].dtype == np.int64
    assert r["ids"].min() >= 0 and r["ids"].max() < 7
    assert r["h0"].shape == (1, 3, 4) and r["flags"].shape == (3,)
    assert r["flags"].min() >= -128 and r["flags"].max() <= 127
    again = qio.random_inputs(g, batch=3, seq=11, seed=1)
    assert all(np.array_equal(again[k], r[k]) for k in r)


@pytest.mark.parametrize("batch", [1, 5])
def test_random_inputs_give_an_embedding_bag_valid_offsets(tmp_path, batch):
    """An embedding bag's offsets start at 0, never decrease and stay within its indices: the model runs on them
    (qrt bench's default inputs were refused: "offsets[0] is 68, expected 0")."""
    g = GraphBuilder()
    ids, offsets = g.input("ids", "int64", [None]), g.input("offsets", "int64", [None])
    table = np.random.default_rng(1).standard_normal((9, 3)).astype(np.float32)
    g.output(g.node("embedding_bag", {"indices": ids, "offsets": offsets, "weight": table}, {"mode": "sum"}))
    g.save(tmp_path / "bag.qrt")
    model = qrt.load(tmp_path / "bag.qrt")
    r = qio.random_inputs(model.graph, batch=batch, seed=3)
    o = r["offsets"]
    assert o[0] == 0 and np.all(np.diff(o) >= 0) and o[-1] <= r["ids"].size
    assert model.run(r).shape == (batch, 3)


def test_random_inputs_refuse_what_a_header_could_ask(tmp_path):
    """A file's fixed dimensions could ask for any size: random inputs stop at qio.MAX_RANDOM_BYTES."""
    g = GraphBuilder()
    g.output(g.node("relu", {"x": g.input("x", "float32", [2**31, 4])}))
    g.save(tmp_path / "big.qrt")
    with pytest.raises(ValueError, match=r"input 'x': random values of shape \[2147483648, 4\]"):
        qio.random_inputs(qrt.load(tmp_path / "big.qrt").graph)
