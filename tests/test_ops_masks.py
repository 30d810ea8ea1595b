"""Comparisons, logic, where, cast, clamp, sqrt / rsqrt, integer arithmetic, cumsum and the shape-following
ops against torch.

Every op here but sqrt is exact (a comparison, a selection, min / max, one conversion that C and IEEE define,
or integer arithmetic modulo 2**bits), so each is held bit for bit to torch at odd shapes, broadcasting, NaN,
infinities, -0.0 and integer extremes included. sqrt is IEEE's (correctly rounded), held bit for bit to a
float64 sqrt rounded once; torch's float32 sqrt is within 1 ulp of it (on AVX-512 builds torch's kernel is not
correctly rounded: 0.6% of values differ by 1 ulp), which the test states. rsqrt is fl(1 / fl(sqrt(x))), bit
for bit with torch. Same bits under every kernel variant (sqrt and rsqrt run in the float-ops builds); bad
attributes raise FormatError at load and bad run-time shapes or indices ValueError.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from qrt.errors import FormatError

RNG = np.random.default_rng(38)
_count = itertools.count()
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -3.5, 2.5, 1e38], np.float32)


def _model(tmp_path, op: str, inputs: dict, attrs: dict | None = None, dtypes: dict | None = None) -> qrt.Model:
    """One node of op; inputs maps port -> shape list (a run-time input, of dtypes[port]) or array (stored)."""
    b = GraphBuilder()
    ports = {p: v if isinstance(v, np.ndarray) else b.input(p, (dtypes or {}).get(p, "float32"), v)
             for p, v in inputs.items()}
    b.output(b.node(op, ports, attrs or {}))
    path = tmp_path / f"m{next(_count)}.qrt"
    b.save(path)
    return qrt.load(path)


def _floats(shape: tuple) -> np.ndarray:
    a = np.asarray(RNG.standard_normal(shape) * 3, np.float32)
    flat = a.reshape(-1)
    flat[: min(flat.size, SPECIALS.size)] = SPECIALS[: flat.size]
    return a


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


@pytest.mark.parametrize("op", sorted(COMPARE))
@pytest.mark.parametrize("shapes", [((3, 7), (3, 7)), ((2, 1, 5), (4, 1)), ((1, 9), ())])
def test_comparisons_float_broadcast(tmp_path, op, shapes):
    a, b = _floats(shapes[0]), _floats(shapes[1])
    b.reshape(-1)[:1] = np.nan  # NaN against everything
    m = _model(tmp_path, op, {"a": [None] * a.ndim, "b": [None] * b.ndim})
    want = COMPARE[op](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert _same(m.run({"a": a, "b": b}), want)


@pytest.mark.parametrize("op", ["ge", "eq", "lt"])
def test_comparisons_integers_exact(tmp_path, op):
    """int64 against a stored int32 scalar, and int64 against int64 at the extremes (exact, no float)."""
    a = np.array([[-(2**63), 2**63 - 1, 2**53 + 1, 0, -1, 7, 2**31]], np.int64)
    m = _model(tmp_path, op, {"a": [1, None], "b": np.asarray(np.int32(0))}, dtypes={"a": "int64"})
    assert _same(m.run(a), COMPARE[op](torch.from_numpy(a), 0).numpy())
    b = np.array([[2**53, 2**63 - 1, 2**53, 0, 0, 7, -(2**31)]], np.int64)
    m = _model(tmp_path, op, {"a": [1, None], "b": [1, None]}, dtypes={"a": "int64", "b": "int64"})
    assert _same(m.run({"a": a, "b": b}), COMPARE[op](torch.from_numpy(a), torch.from_numpy(b)).numpy())


def test_logical_and_where(tmp_path):
    a = RNG.integers(0, 2, (3, 1, 6)).astype(bool)
    b = RNG.integers(0, 2, (4, 1)).astype(bool)
    for op, fn in (("logical_and", torch.logical_and), ("logical_or", torch.logical_or)):
        m = _model(tmp_path, op, {"a": [3, 1, 6], "b": [4, 1]}, dtypes={"a": "bool", "b": "bool"})
        assert _same(m.run({"a": a, "b": b}), fn(torch.from_numpy(a), torch.from_numpy(b)).numpy())
    m = _model(tmp_path, "logical_not", {"x": [3, 1, 6]}, dtypes={"x": "bool"})
    assert _same(m.run(a), torch.logical_not(torch.from_numpy(a)).numpy())
    x, y = _floats((4, 6)), _floats((1, 6))
    m = _model(tmp_path, "where", {"condition": [3, 1, 6], "a": [None, None], "b": [1, 6]},
               dtypes={"condition": "bool"})
    want = torch.where(torch.from_numpy(a), torch.from_numpy(x), torch.from_numpy(y)).numpy()
    assert _same(m.run({"condition": a, "a": x, "b": y}), want)
    with pytest.raises(ValueError, match="do not broadcast"):
        m.run({"condition": a, "a": _floats((4, 5)), "b": y})


@pytest.mark.parametrize(("src", "dst"), [("int64", "float32"), ("int64", "bool"), ("float32", "bool"),
                                          ("float32", "int64"), ("float32", "int32"), ("bool", "float32"),
                                          ("int32", "int64"), ("bool", "int64")])
def test_cast_as_torch(tmp_path, src, dst):
    if src == "float32":  # in range of the integer type: out of range, C and torch leave it undefined
        x = np.concatenate([_floats((40,)), np.array([2.5, -2.5, -0.7, 1e9, -0.0], np.float32)])
        if dst != "bool":
            x = x[np.isfinite(x) & (np.abs(x) < 2e9)]
    elif src == "bool":
        x = RNG.integers(0, 2, 17).astype(bool)
    else:  # int64 -> float32 rounds to nearest even: 2^24 + 1, 2^53 + 1 and the extremes included
        x = np.array([0, 1, -1, 2**24 + 1, 2**24 + 3, 2**53 + 1, -(2**63), 2**63 - 1, 255, 256, -7], np.int64)
    if src == "int32":
        x = RNG.integers(-(2**31), 2**31 - 1, 13, dtype=np.int64).astype(np.int32)
    m = _model(tmp_path, "cast", {"x": [None]}, {"dtype": dst}, dtypes={"x": src})
    want = torch.from_numpy(x).to({"float32": torch.float32, "int64": torch.int64, "int32": torch.int32,
                                   "bool": torch.bool}[dst]).numpy()
    assert _same(m.run(x), want)


def test_clamp_as_torch(tmp_path):
    x = _floats((5, 11))
    for lo, hi in ((1e-9, None), (None, 0.5), (-1.25, 2.0), (1e-12, None), (-1e30, 3e38)):
        lo, hi = (None if v is None else float(np.float32(v)) for v in (lo, hi))  # as the converter writes them
        m = _model(tmp_path, "clamp", {"x": [None, 11]}, {"min": lo, "max": hi})
        assert _same(m.run(x), torch.clamp(torch.from_numpy(x), lo, hi).numpy())
    with pytest.raises(FormatError, match="needs min, max or both"):
        _model(tmp_path, "clamp", {"x": [3]})
    with pytest.raises(FormatError, match="float32 value"):
        _model(tmp_path, "clamp", {"x": [3]}, {"min": 0.1})  # 0.1 is no float32: torch would round it


def test_sqrt_rsqrt_every_variant(tmp_path):
    x = np.abs(_floats((1001,)))
    x = np.concatenate([x, np.array([-1.0, -0.0, 0.0, 1e-45, 3.4e38, np.inf], np.float32),
                        RNG.uniform(0, 100, 4096).astype(np.float32)])
    with np.errstate(invalid="ignore"):
        exact = np.sqrt(x.astype(np.float64)).astype(np.float32)  # IEEE sqrt: the float64 root rounded once
    outs = {}
    for name, ok in K.kernel_variants().items():
        if not ok:
            continue
        before = K._use_variant(name)
        try:
            s = _model(tmp_path, "sqrt", {"x": [None]}).run(x)
            r = _model(tmp_path, "rsqrt", {"x": [None]}).run(x)
        finally:
            K._use_variant(before)
        outs[name] = (s, r)
        assert _same(s, exact)
        assert _same(r, torch.rsqrt(torch.from_numpy(x)).numpy())
    t = torch.sqrt(torch.from_numpy(x)).numpy()
    finite = np.isfinite(exact) & (exact > 0)
    # torch's AVX-512 sqrt is not correctly rounded: within 1 ulp of IEEE's
    assert np.all(np.abs(t[finite].view(np.int32) - exact[finite].view(np.int32)) <= 1)
    assert len({(s.tobytes(), r.tobytes()) for s, r in outs.values()}) == 1


def test_arange_expand_follow_free_sizes(tmp_path):
    b = GraphBuilder()
    x = b.input("x", "int64", [None, None])
    r = b.node("arange", {"x": x}, {"dim": 1})
    row = b.node("unsqueeze", {"x": r}, {"dim": 0})
    e = b.node("expand", {"x": row, "like": x}, {"shape": [-1, -1], "like_dims": [0, None]})
    e3 = b.node("expand", {"x": row}, {"shape": [2, 3, -1]})
    b.output(r, e, e3)
    path = tmp_path / "a.qrt"
    b.save(path)
    m = qrt.load(path)
    for shape in ((1, 1), (3, 7), (2, 0)):
        xv = np.zeros(shape, np.int64)
        got = m.run(xv)
        want = torch.arange(shape[1]).unsqueeze(0)
        assert _same(got[0], torch.arange(shape[1]).numpy())
        assert _same(got[1], want.expand(shape[0], -1).contiguous().numpy())
        assert _same(got[2], want.expand(2, 3, -1).contiguous().numpy())
    with pytest.raises(FormatError, match="cannot be expanded"):
        _model(tmp_path, "expand", {"x": [2, 3]}, {"shape": [4, 3]})
    with pytest.raises(FormatError, match="like_dims and the input like"):
        _model(tmp_path, "expand", {"x": [1, 3]}, {"shape": [-1, -1], "like_dims": [0, None]})


def test_index_select_gather(tmp_path):
    x = _floats((4, 9, 3))
    idx = np.array([8, 0, 3, 3], np.int64)
    m = _model(tmp_path, "index_select", {"x": [None, None, 3], "index": [None]}, {"dim": 1},
               dtypes={"index": "int64"})
    want = torch.index_select(torch.from_numpy(x), 1, torch.from_numpy(idx)).numpy()
    assert _same(m.run({"x": x, "index": idx}), want)
    with pytest.raises(ValueError, match=r"index must lie in \[0, 9\)"):
        m.run({"x": x, "index": np.array([9], np.int64)})
    g = RNG.integers(0, 9, (3, 5, 2)).astype(np.int32)
    m = _model(tmp_path, "gather", {"x": [None, None, 3], "index": [3, 5, 2]}, {"dim": 1}, dtypes={"index": "int32"})
    want = torch.gather(torch.from_numpy(x), 1, torch.from_numpy(g).long()).numpy()
    assert _same(m.run({"x": x, "index": g}), want)
    with pytest.raises(ValueError, match="larger than x's"):
        m.run({"x": x[:2], "index": g})
    with pytest.raises(FormatError, match=r"index must lie in \[0, 9\)"):
        _model(tmp_path, "gather", {"x": [4, 9], "index": np.array([[9]], np.int32)}, {"dim": 1})


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_gather_of_every_dtype_and_dimension(tmp_path, dtype, dim):
    """The CPU's gather (C, qrt/_mask_steps.pxi): torch.gather's elements for 1-, 4- and 8-byte dtypes along every
    dimension, an index smaller than x in the other dimensions, NaN payloads and -0.0 moved as bits; an index out
    of range refused before any is read, naming the range (a negative one too); an empty index."""
    shape = (3, 5, 7)
    x = {"float32": _floats(shape), "int32": RNG.integers(-2**31, 2**31, shape, np.int32),
         "int64": RNG.integers(-2**63, 2**63, shape, np.int64), "bool": RNG.integers(0, 2, shape).astype(bool)}[dtype]
    small = tuple(n - 1 if d != dim else 9 for d, n in enumerate(shape))
    index = RNG.integers(0, shape[dim], small)
    m = _model(tmp_path, "gather", {"x": [None] * 3, "index": [None] * 3}, {"dim": dim},
               dtypes={"x": dtype, "index": "int64"})
    got = m.run({"x": x, "index": index})
    want = torch.gather(torch.from_numpy(x), dim, torch.from_numpy(index)).numpy()
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    for bad in (shape[dim], -1):
        index[1, 0, 0] = bad
        message = rf"index must lie in \[0, {shape[dim]}\), got values in \[{min(bad, 0)}, "
        with pytest.raises(ValueError, match=message):
            m.run({"x": x, "index": index})
    assert m.run({"x": x, "index": np.zeros((0, 2, 2), np.int64)}).shape == (0, 2, 2)


INTEGER_ARITHMETIC = {"add_int": torch.add, "sub_int": torch.sub, "mul_int": torch.mul}
EDGES = {"int32": [-(2**31), 2**31 - 1, -1, 0, 46341, 3, -7], "int64": [-(2**63), 2**63 - 1, -1, 0, 2**32 + 1, 3, -7]}


def _ints(dtype: str, shape: tuple) -> np.ndarray:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    flat = a.reshape(-1)
    flat[: min(flat.size, 7)] = EDGES[dtype][: flat.size]
    return a


@pytest.mark.parametrize("op", sorted(INTEGER_ARITHMETIC))
@pytest.mark.parametrize(("dtypes", "shapes"), [
    (("int32", "int32"), ((3, 7), (3, 7))),  # wraps modulo 2**32, as torch's int32 tensors
    (("int64", "int64"), ((2, 1, 7), (4, 1))),  # modulo 2**64, broadcast
    (("int64", "int32"), ((3, 7), (1, 7))),  # an int32 b widened first: int64, as torch promotes tensors
])
def test_integer_arithmetic_wraps_as_torch(tmp_path, op, dtypes, shapes):
    a, b = _ints(dtypes[0], shapes[0]), _ints(dtypes[1], shapes[1])
    b.reshape(-1)[:7] = b.reshape(-1)[:7][::-1]  # extremes against extremes
    m = _model(tmp_path, op, {"a": [None] * a.ndim, "b": [None] * b.ndim}, dtypes=dict(zip("ab", dtypes)))
    want = INTEGER_ARITHMETIC[op](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert _same(m.run({"a": a, "b": b}), want)
    if dtypes[1] == "int32":  # files store no int64 tensor
        stored = _model(tmp_path, op, {"a": [None] * a.ndim, "b": b}, dtypes={"a": dtypes[0]})
        assert _same(stored.run(a), want)


@pytest.mark.parametrize(("dtype", "dim"), [("int32", 1), ("int64", 0), ("bool", 2)])
def test_cumsum_as_torch(tmp_path, dtype, dim):
    """int64 running sums, as torch sums integers and bool; int32 extremes sum past int32's range exactly, and
    int64 ones wrap modulo 2**64."""
    x = RNG.integers(0, 2, (3, 5, 4)).astype(bool) if dtype == "bool" else _ints(dtype, (3, 5, 4))
    m = _model(tmp_path, "cumsum", {"x": [None, None, 4]}, {"dim": dim}, dtypes={"x": dtype})
    for part in (x, x[:1, :1], x[:, :0]):
        assert _same(m.run(part), torch.cumsum(torch.from_numpy(part), dim).numpy())


def test_bad_dtypes_refused_at_load(tmp_path):
    with pytest.raises(FormatError, match="must both be float32, both integers or both bool"):
        _model(tmp_path, "eq", {"a": [3], "b": [3]}, dtypes={"b": "int64"})
    with pytest.raises(FormatError, match="dtype"):
        _model(tmp_path, "logical_and", {"a": [3], "b": [3]}, dtypes={"a": "bool"})
    with pytest.raises(FormatError, match="one dtype"):
        _model(tmp_path, "where", {"condition": [3], "a": [3], "b": [3]}, dtypes={"condition": "bool", "b": "int64"})
    with pytest.raises(FormatError, match="out of range"):
        _model(tmp_path, "arange", {"x": [3]}, {"dim": 1})
    with pytest.raises(FormatError, match="dtype"):
        _model(tmp_path, "add_int", {"a": [3], "b": [3]}, dtypes={"a": "int64"})  # float32 b
    with pytest.raises(FormatError, match="dtype"):
        _model(tmp_path, "cumsum", {"x": [3]}, {"dim": 0})  # float32: torch sums it in float64
    with pytest.raises(ValueError, match="do not broadcast"):
        _model(tmp_path, "mul_int", {"a": [None], "b": [None]}, dtypes={"a": "int32", "b": "int32"}).run(
            {"a": np.ones(3, np.int32), "b": np.ones(4, np.int32)})


def _first_maximum(x: np.ndarray, dims: list[int], keepdim: bool) -> np.ndarray:
    """amax's rule, element by element: NaN where any is, else the first maximum in index order over dims."""
    dims = sorted(dims)
    rest = [d for d in range(x.ndim) if d not in dims]
    lines = np.transpose(x, rest + dims).reshape(tuple(x.shape[d] for d in rest) + (-1,))
    out = np.empty(lines.shape[:-1], np.float32)
    for at in np.ndindex(out.shape):
        best = lines[at][0]
        for v in lines[at][1:]:
            if np.isnan(best):
                break
            if np.isnan(v) or v > best:
                best = v
        out[at] = best
    return out.reshape(tuple(1 if d in dims else n for d, n in enumerate(x.shape))) if keepdim else out


@pytest.mark.parametrize("dims, keepdim", [([1], False), ([0, 2], True), ([2], False), ([2, 0, 1], False)])
def test_amax_as_torch(tmp_path, dims, keepdim):
    """The maximum over dims, as torch.amax: bit for bit with torch wherever the maximum is unique in sign (values,
    NaN where any is, infinities); where +0.0 and -0.0 tie for it, the first in index order (torch's own choice
    there follows its vector lanes: it differs between its AVX2 and AVX-512 kernels), checked against a scalar
    loop. Batch 1 and odd sizes."""
    m = _model(tmp_path, "amax", {"x": [None, None, None]}, {"dims": dims, "keepdim": keepdim})
    for shape in ((1, 1, 1), (3, 37, 5), (2, 17, 19)):
        x = _floats(shape)
        got, want = m.run(x), torch.amax(torch.from_numpy(x), dims, keepdim).numpy()
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
        assert _same(got, _first_maximum(x, dims, keepdim))
        zeros = RNG.choice(np.array([0.0, -0.0, -1.0], np.float32), shape)
        assert _same(m.run(zeros), _first_maximum(zeros, dims, keepdim))
    if 0 not in dims:  # a batch of 0 rows kept: nothing out, as torch
        empty = np.zeros((0, 4, 3), np.float32)
        assert m.run(empty).shape == torch.amax(torch.from_numpy(empty), dims, keepdim).shape
    if 1 in dims:  # torch raises too: a maximum of nothing
        with pytest.raises(ValueError, match=r"amax over an empty dimension: x has shape \[2, 0, 3\]"):
            m.run(np.zeros((2, 0, 3), np.float32))


def test_amax_attributes_checked_at_load(tmp_path):
    with pytest.raises(FormatError, match="dims must not repeat a dimension"):
        _model(tmp_path, "amax", {"x": [3, 4]}, {"dims": [1, 1]})
    with pytest.raises(FormatError, match="out of range"):
        _model(tmp_path, "amax", {"x": [3, 4]}, {"dims": [2]})
    with pytest.raises(FormatError, match="dtype"):
        _model(tmp_path, "amax", {"x": [3, 4]}, {"dims": [0]}, dtypes={"x": "int64"})
