"""The tensor ops (select, slice, cat, stack, reshape, permute, squeeze, unsqueeze, flatten) against torch.

Tolerance: none, bit for bit, dtype and shape included. These ops move values and compute none, so
every output element is a copy of an input element: torch and qrt must give the same bytes (float
inputs carry -0.0 and NaN to show that bits, not values, are copied). Each model declares its first
dimension free, as a batch, and runs at batch 1 and 5 with odd sizes elsewhere. Bad attributes are
FormatErrors at load; what depends on a free dimension is a ValueError at run time.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import qrt
from qrt.builder import GraphBuilder

RNG = np.random.default_rng(14)
DTYPES = ["float32", "uint8", "int8", "int32", "int64"]
BATCHES = [1, 5]


def _array(shape: tuple, dtype: str) -> np.ndarray:
    if dtype == "float32":
        a = RNG.standard_normal(shape).astype(np.float32)
        if a.size >= 2:
            a.flat[0], a.flat[-1] = -0.0, np.nan  # bits must survive, not only values
        return a
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape, dtype=dtype)


_count = itertools.count()


def _model(tmp_path, op: str, attrs: dict, specs: list[tuple[str, list]]) -> qrt.Model:
    """One node of op over inputs x (or x0, x1, ... for cat and stack) with the given dtypes and shapes."""
    b = GraphBuilder()
    if op in ("cat", "stack"):
        ins = {f"x{i}": b.input(f"x{i}", dt, shape) for i, (dt, shape) in enumerate(specs)}
    else:
        ins = {"x": b.input("x", *specs[0])}
    b.output(b.node(op, ins, attrs))
    path = tmp_path / f"m{next(_count)}.qrt"
    b.save(path)
    return qrt.load(path)


def _free_batch(shape: tuple) -> list:
    return [None, *shape[1:]] if shape else []


def _same(got: np.ndarray, want: torch.Tensor) -> None:
    want = want.contiguous().numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()


def _check(tmp_path, op: str, attrs: dict, shape: tuple, dtype: str, torch_fn) -> None:
    """op on x [batch, *shape[1:]] with a free batch, against torch_fn(x), for each batch size: twice, the
    per-node step's answer (the first call, which compiles the plan's program) and the program's."""
    model = _model(tmp_path, op, attrs, [(dtype, _free_batch(shape))])
    for batch in BATCHES:
        x = _array((batch, *shape[1:]), dtype)
        for _ in range(2):
            _same(model.run(x), torch_fn(torch.from_numpy(x)))


# ------------------------------------------------------------------ each op against torch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("dim", "index"), [(1, 0), (1, 2), (1, -1), (1, -3), (2, 6), (2, -7), (0, 0), (0, -1)])
def test_select(tmp_path, dtype, dim, index):
    _check(tmp_path, "select", {"dim": dim, "index": index}, (5, 3, 7), dtype, lambda x: torch.select(x, dim, index))


def test_select_to_a_scalar(tmp_path):
    model = _model(tmp_path, "select", {"dim": 0, "index": -1}, [("int64", [None])])
    x = _array((4,), "int64")
    got = model.run(x)
    assert got.shape == () and got.dtype == np.int64 and got == x[-1]


@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize(
    ("start", "end", "step"),
    [(0, None, 1), (1, 4, 1), (-3, None, 1), (2, -1, 2), (0, 100, 3), (-100, 2, 1), (5, 2, 1), (6, None, 1),
     (1, None, 4)],
)
def test_slice(tmp_path, dtype, start, end, step):
    """Python's clamping, as torch's x[start:end:step] (out-of-range bounds clamp, an empty range is empty)."""
    attrs = {"dim": 2, "start": start, "end": end, "step": step}
    _check(tmp_path, "slice", attrs, (1, 3, 7), dtype, lambda x: x[:, :, start:end:step])


@pytest.mark.parametrize("step", [2, 3])
@pytest.mark.parametrize(("dtype", "width"), [("uint8", 4), ("int8", 8), ("int32", 1), ("int32", 2)])
def test_slice_of_rows_as_wide_as_an_element(tmp_path, dtype, width, step):
    """Every other (every third) row of x [batch, 7, width]: blocks of 4 or 8 bytes, which the program moves as
    elements of that size where they lie as such (int8 or uint8 rows need not), else byte by byte."""
    _check(tmp_path, "slice", {"dim": 1, "start": 1, "step": step}, (1, 7, width), dtype, lambda x: x[:, 1::step])


def test_slice_of_the_free_dimension_and_narrow(tmp_path):
    _check(tmp_path, "slice", {"dim": 0, "start": -2}, (5, 3), "float32", lambda x: x[-2:])
    # torch.narrow(x, dim, start, length) is slice(start, start + length)
    attrs = {"dim": 1, "start": 2, "end": 2 + 3}
    _check(tmp_path, "slice", attrs, (5, 6, 2), "int8", lambda x: torch.narrow(x, 1, 2, 3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat(tmp_path, dtype, dim):
    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for i, s in enumerate(shapes):
        s[dim] += 2 * i  # sizes differ along dim
    for s in shapes:
        s[0] = None if dim != 0 else s[0]
    model = _model(tmp_path, "cat", {"dim": dim}, [(dtype, s) for s in shapes])
    for batch in BATCHES if dim else [3]:
        xs = [_array(tuple(batch if d is None else d for d in s), dtype) for s in shapes]
        for _ in range(2):  # the per-node step, then the plan's program
            _same(model.run(xs), torch.cat([torch.from_numpy(x) for x in xs], dim))
    assert model.outputs[0].shape == tuple(sum(s[dim] for s in shapes) if a == dim else shapes[0][a]
                                           for a in range(3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_stack(tmp_path, dtype, dim):
    model = _model(tmp_path, "stack", {"dim": dim}, [(dtype, [None, 3, 5])] * 4)
    for batch in BATCHES:
        xs = [_array((batch, 3, 5), dtype) for _ in range(4)]
        for _ in range(2):  # the per-node step, then the plan's program
            _same(model.run(xs), torch.stack([torch.from_numpy(x) for x in xs], dim))


def test_cat_and_stack_take_sixteen_inputs(tmp_path):
    specs = [("int32", [None, i + 1]) for i in range(16)]
    xs = [_array((2, i + 1), "int32") for i in range(16)]
    _same(_model(tmp_path, "cat", {"dim": 1}, specs).run(xs), torch.cat([torch.from_numpy(x) for x in xs], 1))
    xs = [_array((2, 3), "int32") for _ in range(16)]
    model = _model(tmp_path, "stack", {"dim": 2}, [("int32", [None, 3])] * 16)
    _same(model.run(xs), torch.stack([torch.from_numpy(x) for x in xs], 2))


@pytest.mark.parametrize("dtype", ["float32", "uint8", "int64"])
@pytest.mark.parametrize(
    ("shape", "static"),
    [([0, -1], (None, 21)), ([0, 7, 3], (None, 7, 3)), ([0, 3, -1], (None, 3, 7)), ([-1], (None,)),
     ([0, 1, 21, 1], (None, 1, 21, 1)), ([-1, 7], (None, 7)), ([0, 0, 7], (None, 3, 7))],
)
def test_reshape(tmp_path, dtype, shape, static):
    model = _model(tmp_path, "reshape", {"shape": shape}, [(dtype, [None, 3, 7])])
    assert model.outputs[0].shape == static
    for batch in BATCHES:
        x = _array((batch, 3, 7), dtype)
        resolved = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]  # ONNX's 0; torch infers -1 too
        _same(model.run(x), torch.reshape(torch.from_numpy(x), resolved))


@pytest.mark.parametrize("dtype", ["float32", "int8", "int32"])
@pytest.mark.parametrize("perm", list(itertools.permutations(range(3))) + [(3, 1, 0, 2), (0, 2, 3, 1)])
def test_permute(tmp_path, dtype, perm):
    shape = (5, 3, 7) if len(perm) == 3 else (5, 3, 1, 7)
    _check(tmp_path, "permute", {"perm": list(perm)}, shape, dtype, lambda x: x.permute(perm))


@pytest.mark.parametrize("dtype", DTYPES)
def test_squeeze_and_unsqueeze(tmp_path, dtype):
    _check(tmp_path, "squeeze", {"dims": [1, 3]}, (5, 1, 7, 1), dtype, lambda x: torch.squeeze(x, (1, 3)))
    _check(tmp_path, "squeeze", {"dims": []}, (5, 1), dtype, lambda x: x)
    for dim in range(4):
        _check(tmp_path, "unsqueeze", {"dim": dim}, (5, 3, 7), dtype, lambda x, d=dim: torch.unsqueeze(x, d))


def test_squeeze_of_a_free_dimension(tmp_path):
    model = _model(tmp_path, "squeeze", {"dims": [0]}, [("float32", [None, 3])])
    x = _array((1, 3), "float32")
    _same(model.run(x), torch.squeeze(torch.from_numpy(x), 0))
    with pytest.raises(ValueError, match=r"dimension 0 must have size 1"):
        model.run(_array((2, 3), "float32"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("start", "end"), [(1, None), (0, None), (1, 2), (0, 1), (2, 2), (1, 3), (3, 3)])
def test_flatten(tmp_path, dtype, start, end):
    attrs = {"start_dim": start} | ({} if end is None else {"end_dim": end})
    last = -1 if end is None else end
    _check(tmp_path, "flatten", attrs, (5, 3, 1, 7), dtype, lambda x: torch.flatten(x, start, last))


def test_flatten_without_end_dim_is_the_old_op(tmp_path):
    """Files written before end_dim existed mean torch.flatten(x, start_dim)."""
    model = _model(tmp_path, "flatten", {"start_dim": 1}, [("uint8", [None, 2, 3])])
    assert model.graph.nodes[0].attrs["end_dim"] is None and model.outputs[0].shape == (None, 6)
    x = _array((4, 2, 3), "uint8")
    _same(model.run(x), torch.flatten(torch.from_numpy(x), 1))
    scalar = _model(tmp_path, "flatten", {"start_dim": 0, "end_dim": 0}, [("float32", [])])
    _same(scalar.run(np.array(2.5, np.float32)), torch.flatten(torch.tensor(2.5), 0, 0))


def test_a_chain_keeps_the_free_batch(tmp_path):
    """x [B, T, F] -> last step, a reshape through the batch, a permute back: a typical tail of a model."""
    b = GraphBuilder()
    x = b.input("x", "float32", [None, None, 6])
    last = b.node("select", {"x": x}, {"dim": 1, "index": -1})
    pairs = b.node("reshape", {"x": last}, {"shape": [0, 3, 2]})
    t = b.node("permute", {"x": pairs}, {"perm": [0, 2, 1]})
    b.output(b.node("flatten", {"x": t}, {"start_dim": 1}))
    b.save(tmp_path / "chain.qrt")
    model = qrt.load(tmp_path / "chain.qrt")
    assert model.outputs[0].shape == (None, 6)
    for shape in [(1, 1, 6), (5, 9, 6)]:
        xs = _array(shape, "float32")
        want = torch.from_numpy(xs)[:, -1].reshape(-1, 3, 2).permute(0, 2, 1).flatten(1)
        _same(model.run(xs), want)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("op", "attrs", "specs", "match"),
    [
        ("select", {"dim": 2, "index": 0}, [("float32", [None, 3])], "dim 2 is out of range"),
        ("select", {"dim": 1, "index": 3}, [("float32", [None, 3])], "index 3 is out of range"),
        ("select", {"dim": 1, "index": -4}, [("float32", [None, 3])], "index -4 is out of range"),
        ("select", {"dim": 1}, [("float32", [None, 3])], "missing attribute 'index'"),
        ("select", {"dim": 0, "index": True}, [("float32", [None, 3])], "must be int"),
        ("slice", {"dim": 0, "step": 0}, [("int8", [None, 3])], "step must be >= 1"),
        ("slice", {"dim": 0, "step": -1}, [("int8", [None, 3])], "step must be >= 1"),
        ("slice", {"dim": 0, "end": 1.5}, [("int8", [None, 3])], "must be int or null"),
        ("slice", {"dim": -1}, [("int8", [None, 3])], "dim -1 is out of range"),
        ("cat", {"dim": 1}, [("float32", [None, 3]), ("int32", [None, 3])], "dtypes and ranks must agree"),
        ("cat", {"dim": 1}, [("float32", [None, 3]), ("float32", [None, 3, 1])], "dtypes and ranks must agree"),
        ("cat", {"dim": 0}, [("float32", [2, 3]), ("float32", [2, 4])], "x1 has size 4 at dimension 1"),
        ("cat", {"dim": 1}, [("float32", [])], "dim 1 is out of range"),
        ("stack", {"dim": 3}, [("float32", [None, 3])] * 2, r"dim 3 is out of range \[0, 2\]"),
        ("stack", {"dim": 0}, [("float32", [None, 3]), ("float32", [None, 4])], "x1 has size 4 at dimension 1"),
        ("stack", {"dim": 0}, [("float32", [1] * 8)] * 2, "rank 9, more than the maximum of 8"),
        ("reshape", {"shape": [0, 4]}, [("float32", [None, 6])], r"cannot be reshaped to \[0, 4\]"),
        ("reshape", {"shape": [-1, 5]}, [("float32", [2, 6])], r"cannot be reshaped to \[-1, 5\]"),
        ("reshape", {"shape": [5]}, [("float32", [2, 3])], r"cannot be reshaped to \[5\]"),
        ("reshape", {"shape": [-1, -1]}, [("float32", [None, 6])], "at most one dimension"),
        ("reshape", {"shape": [-2, 3]}, [("float32", [None, 6])], "shape entries must be"),
        ("reshape", {"shape": [2**63, 1]}, [("float32", [None, 6])], "integer 9223372036854775808 does not fit"),
        ("reshape", {"shape": [0, 0, 0]}, [("float32", [None, 6])], r"shape\[2\] is 0"),
        ("reshape", {"shape": [1, "2"]}, [("float32", [None, 6])], "must be a list of integers"),
        ("reshape", {"shape": [1, True]}, [("float32", [None, 6])], "must be a list of integers"),
        ("reshape", {"shape": 6}, [("float32", [None, 6])], "must be list"),
        ("reshape", {"shape": [1] * 9}, [("float32", [None, 6])], "rank 9"),
        ("permute", {"perm": [0, 0]}, [("float32", [None, 6])], "must be a permutation"),
        ("permute", {"perm": [1, 0, 2]}, [("float32", [None, 6])], "must be a permutation"),
        ("squeeze", {"dims": [1]}, [("float32", [None, 6])], "dimension 1 of x has size 6"),
        ("squeeze", {"dims": [1, 1]}, [("float32", [None, 1])], "names a dimension twice"),
        ("squeeze", {"dims": [2]}, [("float32", [None, 1])], "out of range"),
        ("unsqueeze", {"dim": 3}, [("float32", [None, 1])], r"out of range \[0, 2\]"),
        ("unsqueeze", {"dim": 0}, [("float32", [1] * 8)], "rank 9"),
        ("flatten", {"start_dim": 2, "end_dim": 1}, [("float32", [None, 1, 2])], "end_dim 1 must lie in"),
        ("flatten", {"start_dim": 0, "end_dim": 3}, [("float32", [None, 1, 2])], "end_dim 3 must lie in"),
        ("flatten", {"start_dim": 0}, [("float16", [None, 1, 2])], "has dtype float16"),
    ],
)
def test_bad_attributes_are_format_errors(tmp_path, op, attrs, specs, match):
    with pytest.raises(qrt.FormatError, match=match):
        _model(tmp_path, op, attrs, specs)


def test_cat_inputs_without_gaps(tmp_path):
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3])
    b.output(b.node("cat", {"x0": x, "x2": x}, {"dim": 0}))
    with pytest.raises(qrt.FormatError, match=r"without gaps, got \['x0', 'x2'\]"):
        b.save(tmp_path / "gap.qrt")


@pytest.mark.parametrize(
    ("op", "attrs", "specs", "inputs", "match"),
    [
        ("select", {"dim": 0, "index": 3}, [("float32", [None, 2])], [(3, 2)], "index 3 is out of range"),
        ("select", {"dim": 0, "index": -4}, [("float32", [None, 2])], [(3, 2)], "index -4 is out of range"),
        ("select", {"dim": 0, "index": 2**62}, [("float32", [None, 2])], [(3, 2)], "out of range"),
        ("reshape", {"shape": [0, 4]}, [("float32", [None, None])], [(2, 3)], r"cannot be reshaped to \[0, 4\]"),
        ("reshape", {"shape": [0, -1]}, [("float32", [None, None])], [(0, 3)], "cannot be reshaped"),
        ("cat", {"dim": 1}, [("int8", [None, 2]), ("int8", [None, 3])], [(2, 2), (3, 3)], "x1 has shape"),
        ("stack", {"dim": 0}, [("int8", [None, 2])] * 2, [(2, 2), (3, 2)], "x1 has shape"),
        ("squeeze", {"dims": [1]}, [("int8", [2, None])], [(2, 2)], "must have size 1"),
    ],
)
def test_free_dimensions_are_checked_at_run_time(tmp_path, op, attrs, specs, inputs, match):
    model = _model(tmp_path, op, attrs, specs)
    arrays = [_array(shape, dt) for (dt, _), shape in zip(specs, inputs)]
    with pytest.raises(ValueError, match=match) as e:
        model.run(arrays if len(arrays) > 1 else arrays[0])
    assert type(e.value) is ValueError and f"({op})" in str(e.value)  # names the node


def test_slice_bounds_at_int64_limits_clamp(tmp_path):
    """Python's clamping at the widest bounds a file holds (wider integers are refused as read: test_format.py)."""
    model = _model(tmp_path, "slice", {"dim": 1, "start": -(2**63), "end": 2**63 - 1}, [("int32", [None, 3])])
    x = _array((2, 3), "int32")
    _same(model.run(x), torch.from_numpy(x))
