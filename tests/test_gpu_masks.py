"""The comparison, logic, cast, clamp, sqrt / rsqrt, integer and size-following ops on the GPU give the CPU's
bits (skipped without a GPU): CuPy's comparisons, selections and conversions (qrt/mask_ops.py, written once for
both backends) and float_ops.cu's sqrt and rsqrt, over an encoder's mask-building graph at two batch sizes
and lengths, with NaN, infinities, -0.0, subnormals and int64 values past 2^24; bad indices raise the CPU's
ValueError.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import _MISSING, _assert_same_bits, _values

import qrt
from qrt.builder import GraphBuilder

needs_gpu = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")
RNG = np.random.default_rng(3839)


def _mask_graph(tmp_path):
    b = GraphBuilder()
    x = b.input("x", "float32", [None, None])
    mask = b.input("mask", "int64", [None, None])
    on = b.node("cast", {"x": mask}, {"dtype": "bool"})
    pos = b.node("arange", {"x": mask}, {"dim": 1})
    late = b.node("ge", {"a": pos, "b": np.asarray(np.int32(3))})
    keep = b.node("logical_or", {"a": b.node("logical_and", {"a": on, "b": late}), "b": b.node("logical_not",
                                                                                                 {"x": late})})
    outs = [b.node(op, {"a": x, "b": np.asarray(np.float32(0.5))}) for op in ("eq", "ne", "lt", "le", "gt", "ge")]
    w = b.node("where", {"condition": keep, "a": x, "b": np.asarray(np.float32(-2.0))})
    c = b.node("clamp", {"x": w}, {"min": -1.0, "max": 3.0})
    outs += [w, c, b.node("sqrt", {"x": x}), b.node("rsqrt", {"x": x}), b.node("cast", {"x": x}, {"dtype": "bool"})]
    outs += [b.node("cast", {"x": mask}, {"dtype": d}) for d in ("float32", "int32")]
    row = b.node("unsqueeze", {"x": pos}, {"dim": 0})
    index = b.node("expand", {"x": row, "like": x}, {"shape": [-1, -1], "like_dims": [0, None]})
    table = np.arange(3 * 64, dtype=np.int32).reshape(3, 64)
    picked = b.node("index_select", {"x": table, "index": pos}, {"dim": 1})
    outs += [index, picked, b.node("gather", {"x": x, "index": index}, {"dim": 1})]
    # RoBERTa's positions (format version 9): int32 arithmetic, a running sum, an int64 mask widening it
    real = b.node("cast", {"x": on}, {"dtype": "int32"})
    counts = b.node("cast", {"x": b.node("cumsum", {"x": real}, {"dim": 1})}, {"dtype": "int32"})
    wraps = np.asarray(np.int32(2**31 - 1))
    outs += [b.node("add_int", {"a": b.node("mul_int", {"a": counts, "b": real}), "b": wraps}),
             b.node("sub_int", {"a": mask, "b": real}), b.node("mul_int", {"a": mask, "b": mask})]
    # max pooling (format version 10): NaN where any is, else the first maximum (the sign of a zero tie)
    outs += [b.node("amax", {"x": x}, {"dims": [1]}), b.node("amax", {"x": x}, {"dims": [0, 1], "keepdim": True})]
    b.output(*outs)
    path = tmp_path / "masks.qrt"
    b.save(path)
    return path


@needs_gpu
@pytest.mark.parametrize(("batch", "length"), [(1, 8), (3, 37)])
def test_mask_graph_same_bits(tmp_path, batch, length):
    path = _mask_graph(tmp_path)
    mask = RNG.integers(0, 2, (batch, length)).astype(np.int64)
    mask[0, 0] = 2**40 + 3
    inputs = {"x": _values((batch, length)), "mask": mask}
    want, got = qrt.load(path).run(inputs), qrt.load(path, device="cuda").run(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _assert_same_bits(g, w)


@needs_gpu
def test_bad_index_raises_as_on_the_cpu(tmp_path):
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 5])
    i = b.input("i", "int64", [None])
    b.output(b.node("index_select", {"x": x, "index": i}, {"dim": 1}))
    path = tmp_path / "bad.qrt"
    b.save(path)
    for device in ("cpu", "cuda"):
        with pytest.raises(ValueError, match=r"index must lie in \[0, 5\)"):
            qrt.load(path, device).run({"x": _values((2, 5)), "i": np.array([5], np.int64)})
