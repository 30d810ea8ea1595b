"""Nested inputs and outputs (format version 3): input_structure / output_structure trees in the file,
GraphBuilder.input_nested / output_nested, and every way Model.run takes and returns them.

A model here is forward(x, state) with state = (h, c), returning (y, (h', c')): an LSTM step's shape.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from fuzz_cases import get_graph, join, set_graph, split

import qrt
from qrt import format as qformat
from qrt.builder import GraphBuilder
from qrt.graph import MAX_TREE_DEPTH


def _step(b: GraphBuilder, names=("x", "state.0", "state.1")) -> tuple[str, str, str]:
    """y = x + h, h' = relu(y), c' = h + c over [?, 3] inputs: each output tells which inputs fed it."""
    x, h, c = (b.input(n, "float32", [None, 3]) for n in names)
    y = b.node("add", {"a": x, "b": h}, name="y")
    return y, b.node("relu", {"x": y}, name="h_next"), b.node("add", {"a": h, "b": c}, name="c_next")


@pytest.fixture(scope="module")
def step_file(tmp_path_factory) -> Path:
    b = GraphBuilder()
    y, h, c = _step(b)
    b.input_nested(("x", ("state.0", "state.1")))
    b.output_nested((y, (h, c)))
    path = tmp_path_factory.mktemp("nested") / "step.qrt"
    b.save(path)
    return path


def _arrays(batch: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((batch, 3)).astype(np.float32) for _ in range(3))


def _expected(x, h, c):
    return x + h, (np.maximum(x + h, 0), h + c)


def _same(got, want) -> None:
    """got has want's nesting (tuples all the way) and its arrays, bit for bit."""
    if isinstance(want, tuple):
        assert type(got) is tuple and len(got) == len(want), got
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ the file


def test_builder_writes_trees_of_indices(step_file):
    f = qformat.load_file(step_file)
    assert f.version == qformat.FORMAT_VERSION >= 3  # trees since version 3
    g = json.loads(f.metadata["qrt.graph"])
    assert g["input_structure"] == [0, [1, 2]] and g["output_structure"] == [0, [1, 2]]
    assert g["outputs"] == ["y", "h_next", "c_next"]
    assert f.graph.input_structure == (0, (1, 2)) and f.graph.output_structure == (0, (1, 2))
    assert f.graph.output_tuple


def test_builder_writes_flat_structures_as_before():
    """Every input its own argument: no input_structure; a flat tuple: "tuple"; one name: "single"."""
    b = GraphBuilder()
    y, h, c = _step(b)
    b.input_nested(["x", "state.0", "state.1"])
    b.output_nested([y, h, c])
    g = b.graph()
    assert "input_structure" not in g and g["output_structure"] == "tuple"
    b.output_nested(y)
    assert b.graph()["output_structure"] == "single" and b.graph()["outputs"] == ["y"]
    b.output(y, c)  # output() keeps working, and replaces a nested declaration
    assert b.graph()["output_structure"] == "tuple" and b.graph()["outputs"] == ["y", "c_next"]


def test_builder_refuses_what_the_loader_would():
    b = GraphBuilder()
    y, h, c = _step(b)
    with pytest.raises(ValueError, match="'nope' is not a declared input"):
        b.input_nested(("x", ("state.0", "nope")))
    with pytest.raises(ValueError, match="one entry per forward"):
        b.input_nested("x")
    with pytest.raises(ValueError, match="leaves must be names"):
        b.output_nested((y, 3))
    b.input_nested(("x", ("state.0", "x")))  # every input exactly once: refused when written
    b.output(y)
    with pytest.raises(qrt.FormatError, match=r"input_structure\[1\]\[1\]: input 0 \('x'\) appears twice"):
        b.save("/nonexistent/never-written.qrt")


def test_trees_deep_and_wide(tmp_path):
    """Tuples nested as deep as allowed, outputs in any order, an input used by no node."""
    b = GraphBuilder()
    y, h, c = _step(b)
    b.input("unused", "int32", [2])
    tree: object = "state.1"
    for _ in range(MAX_TREE_DEPTH - 2):
        tree = (tree,)
    b.input_nested(("x", ("state.0", tree), "unused"))
    b.output_nested(((c,), ((y, h),)))
    b.save(tmp_path / "deep.qrt")
    model = qrt.load(tmp_path / "deep.qrt")
    assert model.graph.output_structure == ((0,), ((1, 2),))
    assert [s.name for s in model.outputs] == ["c_next", "y", "h_next"]
    x, hh, cc = _arrays()
    unused = np.zeros(2, np.int32)
    want_y, (want_h, want_c) = _expected(x, hh, cc)
    arg = cc
    for _ in range(MAX_TREE_DEPTH - 2):
        arg = [arg]
    _same(model.run([x, (hh, arg), unused]), ((want_c,), ((want_y, want_h),)))
    _same(model.run([x, hh, cc, unused]), ((want_c,), ((want_y, want_h),)))


def _edited(path: Path, edit, version: str | None = None) -> bytes:
    header, body = split(path.read_bytes())
    g = get_graph(header)
    edit(g)
    set_graph(header, g)
    if version is not None:
        header["__metadata__"]["qrt.version"] = version
    return join(header, body, fix_checksum=True)


def _rejects(tmp_path: Path, data: bytes, match: str) -> None:
    p = tmp_path / "bad.qrt"
    p.write_bytes(data)
    with pytest.raises(qrt.FormatError, match=match) as e:
        qrt.load(p)
    assert len(str(e.value)) < 1000


def _deep(depth: int) -> list:
    tree: object = 2
    for _ in range(depth - 1):
        tree = [tree]
    return [0, [1, tree]]


BAD_TREES = [
    ({"a": 1}, "must be a JSON array, got dict"),
    ("x", "must be a JSON array, got str"),
    (0, "must be a JSON array, got int"),
    ([0, [1, "state.1"]], r"\[1\]\[1\]: leaves must be input indices \(integers\), got 'state.1'"),
    ([0, [1, 2.0]], r"\[1\]\[1\]: leaves must be input indices \(integers\), got 2.0"),
    ([0, [1, True]], r"\[1\]\[1\]: leaves must be input indices \(integers\), got True"),
    ([0, [1, None]], r"\[1\]\[1\]: leaves must be input indices \(integers\), got None"),
    ([0, [1, {}]], r"leaves must be input indices \(integers\), got \{\}"),
    ([0, [1, 3]], r"\[1\]\[1\]: 3 is not an index into the 3 input\(s\)"),
    ([0, [1, -1]], r"-1 is not an index into the 3 input\(s\)"),
    ([0, [1, 2**62]], r"is not an index into the 3 input\(s\)"),
    ([0, [1, 2**70]], r"graph: integer 1180591620717411303424 does not fit in 64 bits"),  # refused as it is read
    ([0, [0, 1]], r"input_structure\[1\]\[0\]: input 0 \('x'\) appears twice"),
    ([0, [1, 2], 2], r"input 2 \('state.1'\) appears twice"),
    ([0] * 1_000_000, r"input_structure\[1\]: input 0 \('x'\) appears twice"),
    ([0, [1]], r"input\(s\) \['state.1'\] appear nowhere in it; every input must appear exactly once"),
    ([], r"input\(s\) \['x', 'state.0', 'state.1'\] appear nowhere"),
    ([0, [], [1, 2]], r"input_structure\[1\]: an empty array \(a tuple needs at least one element\)"),
    (_deep(MAX_TREE_DEPTH), f"tuples nested deeper than {MAX_TREE_DEPTH} levels"),
    (_deep(100), "JSON nested deeper than 64 levels"),
]


@pytest.mark.parametrize("tree, match", BAD_TREES)
def test_malformed_input_structure(tmp_path, step_file, tree, match):
    _rejects(tmp_path, _edited(step_file, lambda g: g.update({"input_structure": tree})), match)


@pytest.mark.parametrize("tree, match", [
    ([0, [1, "c_next"]], r"output_structure\[1\]\[1\]: leaves must be output indices \(integers\), got 'c_next'"),
    ([0, [1, False]], r"leaves must be output indices \(integers\), got False"),
    ([0, [1, 3]], r"output_structure\[1\]\[1\]: 3 is not an index into the 3 output\(s\)"),
    ([0, [1, -3]], r"-3 is not an index into the 3 output\(s\)"),
    ([0, [1, 1]], r"output_structure\[1\]\[1\]: output 1 \('h_next'\) appears twice"),
    ([0] * 1_000_000, r"output_structure\[1\]: output 0 \('y'\) appears twice"),
    ([[0], [2]], r"output\(s\) \['h_next'\] appear nowhere in it; every output must appear exactly once"),
    ([], r"output\(s\) \['y', 'h_next', 'c_next'\] appear nowhere"),
    ([0, [[]], [1, 2]], r"output_structure\[1\]\[0\]: an empty array"),
    (_deep(MAX_TREE_DEPTH), f"output_structure.*tuples nested deeper than {MAX_TREE_DEPTH} levels"),
    (_deep(100), "JSON nested deeper than 64 levels"),
])
def test_malformed_output_structure(tmp_path, step_file, tree, match):
    _rejects(tmp_path, _edited(step_file, lambda g: g.update({"output_structure": tree})), match)


@pytest.mark.parametrize("value", [{"a": 1}, 0, 1, None, "list", "Single", True])
def test_output_structure_is_single_tuple_or_an_array(tmp_path, step_file, value):
    _rejects(tmp_path, _edited(step_file, lambda g: g.update({"output_structure": value})),
             "must be 'single', 'tuple' or an array of output indices")


@pytest.mark.parametrize("version", ["1", "2"])
def test_older_versions_refuse_trees(tmp_path, step_file, version):
    """A version-1 or -2 reader knows no trees: such a file claiming an older version is malformed."""
    _rejects(tmp_path, _edited(step_file, lambda g: g.update({"output_structure": "tuple"}), version),
             f"graph: input_structure: needs format version 3, the file says {version}")
    _rejects(tmp_path, _edited(step_file, lambda g: g.pop("input_structure"), version),
             f"graph: output_structure: a tree \\(an array\\) needs format version 3, the file says {version}")
    # without trees, the same graph is a valid older file
    flat = _edited(step_file, lambda g: (g.pop("input_structure"), g.update({"output_structure": "tuple"})), version)
    p = tmp_path / "flat.qrt"
    p.write_bytes(flat)
    model = qrt.load(p)
    assert qformat.load_file(p).version == int(version)
    assert model.input_structure == ("x", "state.0", "state.1")
    assert model.output_structure == ("y", "h_next", "c_next")
    x, h, c = _arrays()
    y, (hn, cn) = _expected(x, h, c)
    _same(model.run([x, h, c]), (y, hn, cn))


# ------------------------------------------------------------------ Model.run


def test_structure_properties(step_file):
    model = qrt.load(step_file)
    assert model.input_structure == ("x", ("state.0", "state.1"))
    assert model.output_structure == ("y", ("h_next", "c_next"))
    assert [s.name for s in model.inputs] == ["x", "state.0", "state.1"]
    assert [s.name for s in model.outputs] == ["y", "h_next", "c_next"]


def test_every_input_form_gives_the_same_nested_result(step_file):
    model = qrt.load(step_file)
    x, h, c = _arrays()
    want = _expected(x, h, c)
    forms = [
        [x, h, c],  # flat, in input order
        (x, h, c),
        {"x": x, "state.0": h, "state.1": c},  # by flat name, any order
        {"state.1": c, "x": x, "state.0": h},
        [x, (h, c)],  # nested as forward()'s arguments
        (x, [h, c]),
        [x, [h, c]],
        {"x": x, "state": (h, c)},  # by argument name
        {"state": [h, c], "x": x},
        {"x": x, "state.0": h, "state.1": c},
    ]
    for form in forms:
        _same(model.run(form), want)
    _same(qrt.run(step_file, [x, (h, c)]), want)


def test_a_step_feeds_the_next(step_file):
    """The nested result's state goes straight back in, as a streaming loop does."""
    model = qrt.load(step_file)
    x, h, c = _arrays()
    state = (h, c)
    for _ in range(3):
        y, state = model.run([x, state])
    assert isinstance(state, tuple) and state[0].shape == (2, 3)


def test_single_argument_tuple_and_nested_single_output(tmp_path):
    """forward(state) with state = (h, c) -> ((y,),): a 1-tuple stays a 1-tuple."""
    b = GraphBuilder()
    h, c = b.input("state.0", "float32", [None, 3]), b.input("state.1", "float32", [None, 3])
    y = b.node("add", {"a": h, "b": c}, name="y")
    b.input_nested(((h, c),))
    b.output_nested(((y,),))
    b.save(tmp_path / "one.qrt")
    model = qrt.load(tmp_path / "one.qrt")
    assert model.input_structure == (("state.0", "state.1"),) and model.output_structure == (("y",),)
    _, h, c = _arrays()
    for form in ([h, c], [(h, c)], {"state": (h, c)}, {"state.0": h, "state.1": c}):
        _same(model.run(form), ((h + c,),))


@pytest.mark.parametrize("make, message", [
    (lambda x, h, c: [x, (h,)], r"argument 'state': expected a tuple \(state.0, state.1\), got 1 element\(s\)"),
    (lambda x, h, c: [x, (h, c, c)], r"argument 'state': expected a tuple \(state.0, state.1\), got 3 element"),
    (lambda x, h, c: {"x": x, "state": h}, r"argument 'state': expected a tuple \(state.0, state.1\), got ndarray"),
    (lambda x, h, c: [x, (h, c), c], r"got 3 argument\(s\), the model takes 2: \(x, state=\(state.0, state.1\)\)"),
    (lambda x, h, c: [(h, c)], r"got 1 argument\(s\), the model takes 2"),
    (lambda x, h, c: [x, h], r"got 2 input\(s\), the model takes 3: \['x', 'state.0', 'state.1'\]; nested as its "
                             r"arguments: \(x, state=\(state.0, state.1\)\)"),
    (lambda x, h, c: x, r"got one array, the model takes 3 inputs .*: pass a sequence or a dict; nested as"),
    (lambda x, h, c: {"x": x, "state": (h, c), "state.0": h}, r"input 'state.0' is given twice"),
    (lambda x, h, c: {"x": x, "hidden": (h, c)}, r"unknown input name\(s\) \['hidden'\]; .*nested as its arguments"),
    (lambda x, h, c: {"x": x, "state.0": h}, r"missing input\(s\) \['state.1'\]"),
    (lambda x, h, c: [(x,), (h, c)], r"input 'x': expected a numpy.ndarray of float32, got tuple"),
    (lambda x, h, c: [x, (h, [c])], r"input 'state.1': expected a numpy.ndarray of float32, got list"),
    (lambda x, h, c: [x, (h, c.astype(np.float64))], r"input 'state.1': dtype is float64, expected float32"),
    (lambda x, h, c: {"x": x, "state": (h[:, :2], c)}, r"input 'state.0': shape is \[2, 2\], expected \[\?, 3\]"),
])
def test_wrong_inputs_name_the_input_and_what_was_expected(step_file, make, message):
    model = qrt.load(step_file)
    with pytest.raises(ValueError, match=message):
        model.run(make(*_arrays()))


def test_argument_names_follow_the_converters_convention(tmp_path):
    """A tuple argument is named after its inputs `NAME.0`, `NAME.1`; inputs that do not follow the
    convention (or a name that is also an input's) leave it unnamed: by position or by flat name only."""
    b = GraphBuilder()
    y, h, c = _step(b, ("x", "h", "c"))
    b.input_nested(("x", ("h", "c")))
    b.output_nested((y, (h, c)))
    b.save(tmp_path / "unnamed.qrt")
    model = qrt.load(tmp_path / "unnamed.qrt")
    x, hh, cc = _arrays()
    want = _expected(x, hh, cc)
    _same(model.run([x, (hh, cc)]), want)
    _same(model.run({"x": x, "h": hh, "c": cc}), want)
    with pytest.raises(ValueError, match=r"argument 1: expected a tuple \(h, c\), got 1 element"):
        model.run([x, (hh,)])
    with pytest.raises(ValueError, match=r"the model takes 2: \(x, \(h, c\)\)"):
        model.run([x, (hh, cc), x])

    b = GraphBuilder()
    y, h, c = _step(b, ("s", "s.0", "s.1"))  # argument "s" would clash with input "s"
    b.input_nested(("s", ("s.0", "s.1")))
    b.output_nested((y, (h, c)))
    b.save(tmp_path / "clash.qrt")
    model = qrt.load(tmp_path / "clash.qrt")
    _same(model.run({"s": x, "s.0": hh, "s.1": cc}), want)
    with pytest.raises(ValueError, match="input 's': expected a numpy.ndarray of float32, got tuple"):
        model.run({"s": (hh, cc), "s.0": hh, "s.1": cc})


def test_one_array_fast_path_and_flat_outputs_unchanged(tmp_path):
    b = GraphBuilder()
    b.output(b.node("relu", {"x": b.input("x", "float32", [None, 3])}, name="r"))
    b.save(tmp_path / "relu.qrt")
    model = qrt.load(tmp_path / "relu.qrt")
    assert model.input_structure == ("x",) and model.output_structure == "r"
    x = np.array([[-1, 0, 2]], np.float32)
    for form in (x, [x], (x,), {"x": x}):
        out = model.run(form)
        assert type(out) is np.ndarray
        np.testing.assert_array_equal(out, [[0, 0, 2]])


def test_pickled_model_keeps_its_structure(step_file):
    model = pickle.loads(pickle.dumps(qrt.load(step_file)))
    assert model.input_structure == ("x", ("state.0", "state.1"))
    x, h, c = _arrays(batch=4, seed=2)
    _same(model.run({"x": x, "state": (h, c)}), _expected(x, h, c))
