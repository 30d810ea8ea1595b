"""embedding and embedding_bag against nn.Embedding, nn.EmbeddingBag and their quantized forms.

Tolerance: none, bit for bit. A float32 lookup copies rows. A quantized value is fmaf(scale, q, bias)
rounded once, and a quantized bag sums as fbgemm's EmbeddingSpMDM does, acc = fmaf(scale, q, acc +
bias) in index order; float bags add in index order, a mean divides by the count, a max keeps the
first value and then each greater one. These are fixed sequences of IEEE operations, and torch
performs them the same way on every CPU: fbgemm's AVX2 and AVX-512 kernels give the same bits (the
tests also pass with FBGEMM_ENABLE_INSTRUCTIONS=AVX2, which `make test-torch-avx2` runs). Scale
and bias are stored as torch's prepack stores them (qembeddingbag_prepack.cpp): scale as held,
bias = -(zero_point * scale) in float32, both rounded to float16 for 4-bit rows.

torch gaps worked around here: torch.ao.nn.quantized.Embedding with quint4x2 reads its rows with
the 8-bit layout (its output has the wrong width), so 4-bit lookups are checked against the 4-bit
EmbeddingBag with bags of one index; and the quantized EmbeddingBag always sums, whatever its mode
(its forward passes mode 0), so quantized means and maxima are checked against torch's exact sums
and single-row lookups.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.ao.nn.quantized as nnq
from torch.ao.quantization.qconfig import float_qparams_weight_only_qconfig, float_qparams_weight_only_qconfig_4bit

import qrt
from qrt.builder import GraphBuilder

RNG = np.random.default_rng(1414)
NUM = 23
_count = itertools.count()


def _weight(num: int, dim: int) -> np.ndarray:
    w = (RNG.standard_normal((num, dim)) * 3 + 0.7).astype(np.float32)
    w[1, 0] = -0.0  # a float32 lookup copies bits
    return w


def _quantized(module: torch.nn.Module, bits: int) -> torch.nn.Module:
    """torch's weight-only quantization of an Embedding or EmbeddingBag (float qparams, per row)."""
    module.qconfig = float_qparams_weight_only_qconfig if bits == 8 else float_qparams_weight_only_qconfig_4bit
    cls = nnq.EmbeddingBag if isinstance(module, torch.nn.EmbeddingBag) else nnq.Embedding
    return cls.from_float(module)


def _table(qmodule: torch.nn.Module, bits: int) -> tuple[dict[str, np.ndarray], int]:
    """weight, weight_scale, weight_bias as torch's prepacked table holds them, and torch's width."""
    qw = qmodule.weight()
    scale = qw.q_per_channel_scales().numpy()
    zero_point = qw.q_per_channel_zero_points().numpy()
    assert scale.dtype == zero_point.dtype == np.float32
    bias = -(zero_point * scale)  # weight_zero_points[i] * weight_scales[i] * -1, in float
    rows = qw.int_repr().numpy().reshape(qw.shape[0], -1)
    if bits == 4:
        scale, bias = scale.astype(np.float16), bias.astype(np.float16)  # at::Half(float): to nearest even
    return {"weight": rows, "weight_scale": scale, "weight_bias": bias}, qw.shape[1]


def _model(tmp_path, op: str, table: dict, attrs: dict, indices: tuple, offsets: tuple | None = None) -> qrt.Model:
    """indices (dtype, shape) and optional offsets (dtype, shape) as model inputs, the table stored."""
    b = GraphBuilder()
    ports = {"indices": b.input("indices", *indices), **table}
    if offsets is not None:
        ports["offsets"] = b.input("offsets", *offsets)
    b.output(b.node(op, ports, attrs, name="e"))
    path = tmp_path / f"m{next(_count)}.qrt"
    b.save(path)
    return qrt.load(path)


def _same(got: np.ndarray, want: torch.Tensor) -> None:
    want = want.detach().numpy()
    assert got.dtype == np.float32 and got.shape == want.shape, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes()


def _indices(shape: tuple, dtype: str) -> np.ndarray:
    return RNG.integers(0, NUM, shape).astype(dtype)


# Bags with an empty one, a long one and single ones; the last bag runs to the end of indices.
OFFSETS = [0, 3, 3, 10, 11, 25]
N_INDICES = 40


# ------------------------------------------------------------------ embedding


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("shape", [(1,), (7,), (1, 5), (3, 5), (2, 3, 4)])
def test_float_embedding(tmp_path, dtype, shape):
    emb = torch.nn.Embedding(NUM, 13)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(_weight(NUM, 13)))
    spec = [None, *shape[1:]]
    model = _model(tmp_path, "embedding", {"weight": emb.weight.detach().numpy()}, {}, (dtype, spec))
    for batch in {1, shape[0]}:
        idx = _indices((batch, *shape[1:]), dtype)
        idx.flat[0] = 1  # the row holding -0.0
        _same(model.run(idx), emb(torch.from_numpy(idx)))


@pytest.mark.parametrize(("dim", "dtype", "shape"), [(1, "int64", (9,)), (7, "int32", (3, 5)), (14, "int64", (3, 5)),
                                                  (33, "int32", (9,))])
def test_8bit_embedding(tmp_path, dim, dtype, shape):
    emb = torch.nn.Embedding(NUM, dim)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(_weight(NUM, dim)))
    q = _quantized(emb, 8)
    table, _ = _table(q, 8)
    model = _model(tmp_path, "embedding", table, {"bits": 8}, (dtype, [None, *shape[1:]]))
    for batch in (1, shape[0]):
        idx = _indices((batch, *shape[1:]), dtype)
        _same(model.run(idx), q(torch.from_numpy(idx)))


@pytest.mark.parametrize("dim", [2, 7, 14, 33])
def test_4bit_embedding(tmp_path, dim):
    """Against the 4-bit EmbeddingBag with one index per bag (torch's 4-bit Embedding is broken); an odd
    dim leaves the last high nibble out, so torch's extra column (its rows are padded to even) is cut."""
    bag = torch.nn.EmbeddingBag(NUM, dim, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(_weight(NUM, dim)))
    q = _quantized(bag, 4)
    table, width = _table(q, 4)
    assert width == dim + dim % 2
    for attr_dim in sorted({dim, width}):
        model = _model(tmp_path, "embedding", table, {"bits": 4, "dim": attr_dim}, ("int64", [None, 4]))
        for batch in (1, 6):
            idx = _indices((batch, 4), "int64")
            flat = torch.from_numpy(idx.reshape(-1))
            want = q(flat, torch.arange(flat.numel())).reshape(batch, 4, width)[..., :attr_dim]
            _same(model.run(idx), want)


# ------------------------------------------------------------------ embedding_bag


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_float_embedding_bag(tmp_path, mode, dtype):
    bag = torch.nn.EmbeddingBag(NUM, 13, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(_weight(NUM, 13) * 1e3))  # large values: rounding in every add
    table = {"weight": bag.weight.detach().numpy()}
    with_offsets = _model(tmp_path, "embedding_bag", table, {"mode": mode}, (dtype, [None]), (dtype, [None]))
    idx = _indices((N_INDICES,), dtype)
    offsets = np.array(OFFSETS, dtype)
    _same(with_offsets.run([idx, offsets]), bag(torch.from_numpy(idx), torch.from_numpy(offsets)))
    _same(with_offsets.run([idx[:1], offsets[:1]]), bag(torch.from_numpy(idx[:1]), torch.from_numpy(offsets[:1])))
    two_d = _model(tmp_path, "embedding_bag", table, {"mode": mode}, (dtype, [None, 9]))
    for batch in (1, 4):
        idx = _indices((batch, 9), dtype)
        _same(two_d.run(idx), bag(torch.from_numpy(idx)))


@pytest.mark.parametrize(("bits", "dim"), [(8, 1), (8, 7), (8, 16), (8, 33), (4, 2), (4, 14), (4, 34)])
def test_quantized_embedding_bag_sum(tmp_path, bits, dim):
    bag = torch.nn.EmbeddingBag(NUM, dim, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(_weight(NUM, dim)))
    q = _quantized(bag, bits)
    table, width = _table(q, bits)
    attrs = {"bits": bits, "dim": width, "mode": "sum"}
    with_offsets = _model(tmp_path, "embedding_bag", table, attrs, ("int64", [None]), ("int64", [None]))
    idx = _indices((N_INDICES,), "int64")
    offsets = np.array(OFFSETS, np.int64)
    _same(with_offsets.run([idx, offsets]), q(torch.from_numpy(idx), torch.from_numpy(offsets)))
    two_d = _model(tmp_path, "embedding_bag", table, attrs, ("int32", [None, 6]))
    for batch in (1, 5):
        idx = _indices((batch, 6), "int32")
        _same(two_d.run(idx), q(torch.from_numpy(idx.astype(np.int64))))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_embedding_bag_mean_and_max(tmp_path, bits):
    """torch's quantized bags only sum: a mean is that exact sum / count, a max the greatest of the rows
    (each row as torch looks it up, in bags of one)."""
    bag = torch.nn.EmbeddingBag(NUM, 10, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(_weight(NUM, 10)))
    q = _quantized(bag, bits)
    table, width = _table(q, bits)
    idx = _indices((N_INDICES,), "int64")
    ends = OFFSETS + [N_INDICES]
    sums = q(torch.from_numpy(idx), torch.tensor(OFFSETS))
    rows = q(torch.from_numpy(idx), torch.arange(N_INDICES))
    counts = torch.tensor(np.diff(ends), dtype=torch.float32).clamp(min=1)[:, None]
    maxima = torch.stack([rows[a:b].amax(0) if b > a else torch.zeros(width) for a, b in zip(ends, ends[1:])])
    for mode, want in (("mean", sums / counts), ("max", maxima)):
        attrs = {"bits": bits, "dim": width, "mode": mode}
        model = _model(tmp_path, "embedding_bag", table, attrs, ("int64", [None]), ("int32", [None]))
        _same(model.run([idx, np.array(OFFSETS, np.int32)]), want)


def test_embedding_bag_default_mode_is_mean(tmp_path):
    table = {"weight": _weight(NUM, 3)}
    model = _model(tmp_path, "embedding_bag", table, {}, ("int64", [2, 3]))
    assert model.graph.nodes[0].attrs["mode"] == "mean"
    idx = _indices((2, 3), "int64")
    torch_bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(table["weight"]))
    _same(model.run(idx), torch_bag(torch.from_numpy(idx)))


def test_empty_inputs(tmp_path):
    table = {"weight": _weight(NUM, 5)}
    model = _model(tmp_path, "embedding", table, {}, ("int32", [None, 3]))
    assert model.run(np.zeros((0, 3), np.int32)).shape == (0, 3, 5)
    bags = _model(tmp_path, "embedding_bag", table, {"mode": "max"}, ("int64", [None]), ("int64", [None]))
    np.testing.assert_array_equal(bags.run([np.zeros(0, np.int64), np.zeros(2, np.int64)]), np.zeros((2, 5)))
    assert bags.run([np.zeros(0, np.int64), np.zeros(0, np.int64)]).shape == (0, 5)


# ------------------------------------------------------------------ errors


def _t8(num: int = NUM, dim: int = 6) -> dict:
    return {"weight": np.zeros((num, dim), np.uint8), "weight_scale": np.ones(num, np.float32),
            "weight_bias": np.zeros(num, np.float32)}


def _t4(num: int = NUM, cols: int = 3) -> dict:
    return {"weight": np.zeros((num, cols), np.uint8), "weight_scale": np.ones(num, np.float16),
            "weight_bias": np.zeros(num, np.float16)}


@pytest.mark.parametrize(
    ("op", "table", "attrs", "indices", "match"),
    [
        ("embedding", _t4(), {"bits": 4}, ("int64", [None]), "bits 4 needs attribute 'dim'"),
        ("embedding", _t4(), {"bits": 4, "dim": 7}, ("int64", [None]), r"dim 7 needs ceil\(dim / 2\) = 4 bytes"),
        ("embedding", _t4(), {"bits": 4, "dim": -1}, ("int64", [None]), "dim -1 needs"),
        ("embedding", _t8(), {"bits": 8, "dim": 5}, ("int64", [None]), "dim 5 disagrees with the weight's 6"),
        ("embedding", _t8(), {"bits": 4, "dim": 12}, ("int64", [None]), "weight_scale must be float16"),
        ("embedding", _t4(), {"bits": 8}, ("int64", [None]), "weight_scale must be float32"),
        ("embedding", _t8(), {}, ("int64", [None]), "bits 32 needs a float32 weight"),
        ("embedding", {"weight": np.zeros((3, 2), np.float32)}, {"bits": 8}, ("int64", [None]), "needs a uint8"),
        ("embedding", {"weight": np.zeros((3, 2), np.float32), "weight_scale": np.ones(3, np.float32)}, {},
         ("int64", [None]), "takes no weight_scale"),
        ("embedding", {k: v for k, v in _t8().items() if k != "weight_bias"}, {"bits": 8}, ("int64", [None]),
         "bits 8 needs weight_bias"),
        ("embedding", {**_t8(), "weight_scale": np.ones(4, np.float32)}, {"bits": 8}, ("int64", [None]),
         r"weight_scale must be float32\[23\]"),
        ("embedding", {"weight": np.zeros((0, 2), np.float32)}, {}, ("int64", [None]), "at least one row"),
        ("embedding", {"weight": np.zeros(4, np.float32)}, {}, ("int64", [None]), "weight must be 2-D"),
        ("embedding", _t8(), {"bits": 16}, ("int64", [None]), "must be one of"),
        ("embedding", _t8(), {"bits": 8}, ("int8", [None]), "has dtype int8, expected int32 or int64"),
        ("embedding", _t8(), {"bits": 8}, ("int64", [1] * 8), "rank 9"),
        ("embedding_bag", _t8(), {"bits": 8}, ("int64", [None]), "must be 2-D"),
        ("embedding_bag", _t8(), {"bits": 8, "mode": "min"}, ("int64", [None, 2]), "must be one of"),
    ],
)
def test_bad_tables_are_format_errors(tmp_path, op, table, attrs, indices, match):
    with pytest.raises(qrt.FormatError, match=match):
        _model(tmp_path, op, table, attrs, indices)


def test_offsets_need_1d_indices(tmp_path):
    with pytest.raises(qrt.FormatError, match="indices and offsets must be 1-D"):
        _model(tmp_path, "embedding_bag", _t8(), {"bits": 8}, ("int64", [None, 2]), ("int64", [None]))


def test_stored_indices_and_offsets_are_checked_at_load(tmp_path):
    def build(indices, offsets):
        b = GraphBuilder()
        b.input("unused", "float32", [1])
        b.output(b.node("embedding_bag", {"indices": indices, "offsets": offsets, **_t8()}, {"bits": 8}))
        b.save(tmp_path / f"s{next(_count)}.qrt")

    build(np.array([0, 22, 5], np.int32), np.array([0, 1, 3], np.int32))
    with pytest.raises(qrt.FormatError, match=r"indices must lie in \[0, 23\)"):
        build(np.array([0, 23], np.int32), np.array([0], np.int32))
    with pytest.raises(qrt.FormatError, match="offsets must start at 0, never decrease"):
        build(np.array([0, 1], np.int32), np.array([0, 2, 1], np.int32))
    with pytest.raises(qrt.FormatError, match="offsets must start at 0, never decrease"):
        build(np.array([0, 1], np.int32), np.array([0, 3], np.int32))


@pytest.mark.parametrize("bits", [32, 8, 4])
@pytest.mark.parametrize("bad", [-1, NUM, 2**40, -(2**62)])
def test_index_out_of_range_is_a_value_error(tmp_path, bits, bad):
    table = {32: {"weight": _weight(NUM, 6)}, 8: _t8(), 4: _t4()}[bits]
    attrs = {"bits": bits} | ({"dim": 6} if bits == 4 else {})
    lookup = _model(tmp_path, "embedding", table, attrs, ("int64", [None, 2]))
    idx = np.array([[1, 2], [3, bad]], np.int64)
    with pytest.raises(ValueError, match=rf"node 'e' \(embedding\): indices: {bad} \(at flat position 3\) is out"):
        lookup.run(idx)
    bags = _model(tmp_path, "embedding_bag", table, attrs, ("int64", [None, 2]))
    with pytest.raises(ValueError, match=rf"indices: {bad} .* must lie in \[0, {NUM}\)"):
        bags.run(idx)


@pytest.mark.parametrize(
    ("offsets", "match"),
    [([1, 2], r"offsets\[0\] is 1, expected 0"), ([0, 3, 2], r"must not decrease, got offsets\[1\] = 3"),
     ([0, 2, 5], r"offsets\[2\] is 5, beyond the 4 indices")],
)
def test_bad_offsets_are_value_errors(tmp_path, offsets, match):
    model = _model(tmp_path, "embedding_bag", _t8(), {"bits": 8}, ("int64", [None]), ("int32", [None]))
    with pytest.raises(ValueError, match=match):
        model.run([np.array([0, 1, 2, 3], np.int64), np.array(offsets, np.int32)])
