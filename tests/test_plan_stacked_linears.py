"""Dynamic linears reading one input run as one product in an execution plan (qrt/stacked_linears.py): the
compiled program's bits are the per-node path's (each linear alone, Plan._per_node) exactly, no tolerance: the
input's quantization is the same for each linear and the integer product and its epilogue are per column."""

from __future__ import annotations

import numpy as np
import pytest

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder

RNG = np.random.default_rng(380)


def _linear(g: GraphBuilder, x: str, n: int, k: int, bias: bool, per_channel: bool, zero_point: int,
            attrs: dict) -> str:
    """A linear_dynamic of random int8 weights, scales per tensor or per column, and this zero point."""
    ports = {"x": x, "weight": RNG.integers(-128, 128, (n, k)).astype(np.int8),
             "weight_scale": (RNG.random(n) * 0.01 + 0.001).astype(np.float32) if per_channel
             else np.float32(RNG.random() * 0.01 + 0.001),
             "weight_zero_point": np.full(n, zero_point, np.int32) if per_channel else np.int32(zero_point)}
    if bias:
        ports["bias"] = RNG.standard_normal(n).astype(np.float32)
    return g.node("linear_dynamic", ports, attrs)


def _block(tmp_path, k: int, heads: int, e: int, ev: int, biases: str, attrs: dict, in_place: bool = True,
           also_out: str = "", zero_points: tuple = (3, -7, 0)) -> qrt.Model:
    """x -> q, k, v linears (biases: which have one; zero points and scales differing) -> attention -> output.
    in_place: q, k, v reshaped to [B, L, heads, e] and permuted to heads (BERT's layers); else read as they come,
    [B, L, e] (heads 1). also_out: the linears ("qkv") whose outputs are also model outputs. zero_points: the q, k, v
    weights' (all 0: x quantized straight into the product's layout, PackedS8.matmul_float)."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, k])
    symmetric = attrs.get("activation") == "per_row_symmetric"
    wired, outs = {}, []
    for p, width, zp, per_channel in zip("qkv", (e, e, ev), zero_points, (False, True, True)):
        y = _linear(g, x, heads * width, k, p in biases, per_channel, 0 if symmetric else zp, attrs)
        if p in also_out:
            outs.append(y)
        if in_place:
            y = g.node("permute", {"x": g.node("reshape", {"x": y}, {"shape": [0, 0, heads, width]})},
                       {"perm": [0, 2, 1, 3]})
        wired[p] = y
    wired["mask"] = g.input("mask", "bool", [None, 1, 1, None] if in_place else [None, 1, None])
    y = g.node("attention", wired)
    if in_place:
        y = g.node("reshape", {"x": g.node("permute", {"x": y}, {"perm": [0, 2, 1, 3]})}, {"shape": [0, 0, heads * ev]})
    g.output(y, *outs)
    g.save(tmp_path / "block.qrt")
    return qrt.load(tmp_path / "block.qrt")


def _bits_and_products(model: qrt.Model, inputs: list[np.ndarray]) -> int:
    """The compiled program's outputs are the per-node path's bit for bit (the first call compiles, the next
    runs the program); returns how many linear products the program runs."""
    plan = model._plan
    want = plan._per_node(inputs)
    for _ in range(2):
        got = plan.run(inputs)
        assert [a.dtype for a in got] == [a.dtype for a in want]
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want]
    assert plan._executor.fallback_steps(tuple(a.shape for a in inputs)) == []
    assert plan._executor.handed_back == 0
    return sum(op == "linear_dynamic" for _, op, _ in plan.profile(inputs, 1))


def _inputs(batch: int, length: int, k: int, heads_mask: bool = True) -> list[np.ndarray]:
    mask = RNG.random((batch, 1, 1, length) if heads_mask else (batch, 1, length)) < 0.8
    mask[..., 0] = True
    return [(RNG.standard_normal((batch, length, k)) * 2).astype(np.float32), mask]


SETTINGS = [
    {"reduce_range": True, "engine": "x86"},
    {"reduce_range": False, "engine": "x86"},
    {"reduce_range": False, "engine": "qnnpack"},
    {"reduce_range": False, "engine": "x86", "activation": "per_row_symmetric"},
]


@pytest.mark.parametrize("attrs", SETTINGS, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("biases", ["qkv", "", "qv"])
def test_query_key_value_as_one_product(tmp_path, threads, attrs, biases):
    """BERT's block at odd sizes (k 37, 3 heads of 5, values 7 wide), batch 1 and 3: one product, the attention
    reading q, k and v as columns of its output."""
    model = _block(tmp_path, 37, 3, 5, 7, biases, attrs)
    for batch, length in ((1, 9), (3, 13)):
        assert _bits_and_products(model, _inputs(batch, length, 37)) == 1


def test_every_kernel_variant(tmp_path):
    """The same bits under every int8 kernel this CPU runs (the stacked weights packed for each)."""
    for variant, ok in K.kernel_variants().items():
        if not ok:
            continue
        before = K._use_variant(variant)
        try:
            model = _block(tmp_path, 70, 4, 16, 16, "qkv", SETTINGS[0])
            assert _bits_and_products(model, _inputs(2, 33, 70)) == 1, variant
        finally:
            K._use_variant(before)


def test_one_batch_splits_the_product_by_heads(tmp_path, threads):
    """The product's columns go head by head (q, k and v of head 0, then of head 1, ...); at batch 1, whose heads
    the attention splits across the threads, the threads split the product by columns, so that each writes the
    heads its attention task reads; at batch 2 by rows. The per-node path's bits both ways, on every int8 kernel
    this CPU runs (6 heads of 16 + 16 + 24 columns: several panels on every variant; weights without zero points,
    as BERT's: the path that splits so)."""
    for variant, ok in K.kernel_variants().items():
        if not ok:
            continue
        before = K._use_variant(variant)
        try:
            model = _block(tmp_path, 45, 6, 16, 24, "qkv", SETTINGS[1], zero_points=(0, 0, 0))
            for batch in (1, 2):
                assert _bits_and_products(model, _inputs(batch, 11, 45)) == 1, variant
        finally:
            K._use_variant(before)


def test_operands_read_as_they_come(tmp_path):
    """q, k and v [B, L, E] read by the attention without a permute: columns of the product all the same."""
    model = _block(tmp_path, 19, 1, 11, 6, "kv", SETTINGS[0], in_place=False)
    for batch in (1, 2):
        assert _bits_and_products(model, _inputs(batch, 7, 19, heads_mask=False)) == 1


def test_output_read_elsewhere_runs_alone(tmp_path):
    """A linear whose output another step reads too (here the model's output) runs alone; the others together."""
    model = _block(tmp_path, 21, 2, 3, 5, "qk", SETTINGS[0], also_out="k")
    assert _bits_and_products(model, _inputs(2, 6, 21)) == 2


def test_other_readers_or_settings_not_stacked(tmp_path):
    """Linears reading one input whose outputs an add reads (a contiguous operand), or with another quantization
    setting, run one by one, as before."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 23])
    a, b = (_linear(g, x, 10, 23, True, False, 0, SETTINGS[0]) for _ in range(2))
    c = _linear(g, x, 10, 23, True, False, 0, SETTINGS[1])
    g.output(g.node("add", {"a": a, "b": b}), c)
    g.save(tmp_path / "add.qrt")
    model = qrt.load(tmp_path / "add.qrt")
    assert model._plan._linear_groups == [(0, 1)]
    assert _bits_and_products(model, [RNG.standard_normal((5, 23)).astype(np.float32)]) == 3
