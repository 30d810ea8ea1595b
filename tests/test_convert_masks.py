"""The lowerings of comparisons, logic, where / masked_fill, casts, clamp, pow, norms and normalize
(tools/lower_masks.py) through both front ends, against torch at two batch sizes and two lengths (both
free). The ops are exact (bit for bit) except the sums (the masked mean, the norms), which run in qrt's
order: within gamma(k(n) + 2) sum|x| of the exact value (docs/NUMERICS.md 8.1), torch within
gamma(n) sum|x|; for n <= 12 that is under 1e-6 sum|x|, the bound asserted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import quantize_dynamic

import qrt
from tools.convert import ConvertError, convert


class MaskOps(nn.Module):
    @staticmethod
    def picked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = (mask != 0) & (x > -0.5) | ~(mask.bool())
        return torch.where(keep, x, x.masked_fill(mask == 0, -1.5) * 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple:
        keep = (mask != 0) & (x > -0.5) | ~(mask.bool())
        filled = x.masked_fill(mask == 0, -1.5)
        picked = torch.where(keep, x, filled * 2)
        clamped = picked.clamp(min=0.1, max=2.0)
        powers = clamped ** 2 + clamped ** -1 + torch.rsqrt(clamped) + torch.sqrt(clamped) + clamped ** 3
        counted = (mask.float() * x).sum(1) / mask.to(torch.float32).sum(1).clamp(min=1e-9)
        norm = torch.linalg.vector_norm(picked, 2, dim=1, keepdim=True)
        return powers, counted, F.normalize(picked, p=2, dim=1), norm, mask.long() >= 1, keep


def make_mask_ops() -> nn.Module:
    return MaskOps()


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_mask_ops_against_torch(tmp_path, frontend):
    ckpt = str(tmp_path / "m.pt")
    torch.save(MaskOps().state_dict(), ckpt)
    out = str(tmp_path / "m.qrt")
    result = convert(ckpt, out, model="test_convert_masks:make_mask_ops", input_shapes=["2,9", "2,9"],
                     input_dtypes={"mask": "int64"}, frontend=frontend)
    assert result.shapes == {"x": "float32[?, ?]", "mask": "int64[?, ?]"}
    m, rng = qrt.load(out), np.random.default_rng(5)
    for batch, length in ((1, 7), (3, 12)):
        x = rng.standard_normal((batch, length)).astype(np.float32)
        x[0, :3] = [0.0, -0.0, 0.1]
        mask = rng.integers(0, 3, (batch, length))
        ref = MaskOps()(torch.from_numpy(x), torch.from_numpy(mask))
        got = m.run({"x": x, "mask": mask})
        for i in (0, 4, 5):
            assert np.array_equal(got[i], ref[i].numpy()), i
        picked = np.abs(MaskOps.picked(torch.from_numpy(x), torch.from_numpy(mask)).numpy())
        bounds = (np.abs(x * (mask != 0)).sum(1) / np.maximum((mask != 0).sum(1), 1), np.ones(batch),
                  np.sqrt((picked**2).sum(1)))
        for i, scale in zip((1, 2, 3), bounds):
            err = np.abs(got[i] - ref[i].numpy()).reshape(batch, -1).max(1)
            assert np.all(err <= 1e-6 * scale), (i, err, scale)


class NewTensors(nn.Module):
    """Tensors made in forward at sizes read from the inputs, free ones (HuggingFace's defaults for a missing
    token_type_ids or attention_mask: torch.zeros(input_shape, dtype=long), torch.ones(...)), in the forms
    torch.fx traces too."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple:
        types = torch.zeros(ids.shape, dtype=torch.long)
        ones = torch.ones((ids.size(0), ids.size(1)))
        counts = x.new_zeros(x.size(0), 2) + x.new_ones((1, x.size(1))).sum(1, keepdim=True)
        return (x * ones.unsqueeze(-1) + types.unsqueeze(-1), torch.full((x.size(0), 3), 2.5), torch.ones_like(ids),
                counts, torch.full_like(x, 7.9, dtype=torch.int64),
                torch.zeros((x.size(0), ids.size(1)), dtype=torch.bool), torch.full((ids.size(1),), True),
                ids.new_full((2, ids.size(1)), -3))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_new_tensors_of_free_sizes(tmp_path, frontend):
    """Each a stored value expanded to the sizes at run time (expand with like), cast to torch's dtype: the same
    values, dtypes and shapes as torch at two batches and lengths."""
    ckpt = str(tmp_path / "n.pt")
    torch.save({}, ckpt)
    out = str(tmp_path / "n.qrt")
    result = convert(ckpt, out, model="test_convert_masks:NewTensors", input_shapes=["2,9,4", "2,9"],
                     input_dtypes={"ids": "int64"}, frontend=frontend)
    assert result.shapes == {"x": "float32[?, ?, ?]", "ids": "int64[?, ?]"}
    m, rng = qrt.load(out), np.random.default_rng(6)
    for batch, length in ((1, 3), (3, 7)):
        x = rng.standard_normal((batch, length, 5)).astype(np.float32)
        ids = rng.integers(0, 50, (batch, length))
        got = m.run({"x": x, "ids": ids})
        want = NewTensors()(torch.from_numpy(x), torch.from_numpy(ids))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy())


class ComputedSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.zeros((x.size(0), x.size(1) + 1))], 1)


class ComputedRepeat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1].unsqueeze(1).repeat(1, x.size(1) * 2, 1)


@pytest.mark.parametrize(("name", "node", "size"), [("ComputedSize", "zeros", 6), ("ComputedRepeat", "repeat", 10)])
def test_a_computed_size_fixes_its_dimension(tmp_path, name, node, size):
    """x.size(1) + 1 (a new tensor's size) or x.size(1) * 2 (a repeat count, which had been refused: "expand's size
    10 at dimension 1 changes with a free dimension") is a number, not a size qrt follows: the automatic search
    fixes dimension 1, and a dimension marked free is refused, naming the node."""
    ckpt, out = str(tmp_path / "c.pt"), str(tmp_path / "c.qrt")
    torch.save({}, ckpt)
    result = convert(ckpt, out, model=f"test_convert_masks:{name}", input_shapes=["2,5"], frontend="export")
    assert result.shapes == {"x": "float32[?, 5]"}
    x = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)
    assert np.array_equal(qrt.load(out).run(x), globals()[name]()(torch.from_numpy(x)).numpy())
    with pytest.raises(ConvertError, match=rf"dimension 1 is declared free.*node '{node}'.* makes a tensor of size "
                                           rf"{size} at dimension 1, computed from a free size"):
        convert(ckpt, out, model=f"test_convert_masks:{name}", input_shapes=["2?,5?"], frontend="export",
                free_dims="marked")


class BoolAgainstNumbers(nn.Module):
    """A bool mask compared with integers (mask == 0: torch compares in int64) and floats, and used to fill."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> tuple:
        return (x.masked_fill(mask == 0, -1e9), mask >= 1, mask == ids, mask < 0.5, mask != True)  # noqa: E712


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_bool_compared_with_numbers(tmp_path, frontend):
    """A bool operand against an integer one counts as an integer (it was left bool, and the file's graph check
    refused the comparison of bool with int32), against a float one as a float."""
    ckpt = str(tmp_path / "b.pt")
    torch.save({}, ckpt)
    out = str(tmp_path / "b.qrt")
    convert(ckpt, out, model="test_convert_masks:BoolAgainstNumbers", input_shapes=["2,9", "2,9", "2,9"],
            input_dtypes={"mask": "bool", "ids": "int64"}, frontend=frontend)
    m, rng = qrt.load(out), np.random.default_rng(8)
    for batch, length in ((1, 4), (3, 7)):
        feeds = {"x": rng.standard_normal((batch, length)).astype(np.float32),
                 "mask": rng.integers(0, 2, (batch, length)).astype(bool), "ids": rng.integers(-1, 3, (batch, length))}
        want = BoolAgainstNumbers()(*(torch.from_numpy(v) for v in feeds.values()))
        for g, w in zip(m.run(feeds), want):
            assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy())


class AnyAll(nn.Module):
    """Row tests of a padding mask: torch.any / torch.all over a dimension, several, or all of them (the
    decomposed attention's 'is every key masked' is any(not keep, -1, keepdim=True))."""

    def forward(self, mask: torch.Tensor) -> tuple:
        return (mask.any(1), torch.all(mask, -1, keepdim=True), mask.any(), (~mask).all(),
                torch.any(mask.unsqueeze(1), dim=(0, 2)))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_any_and_all(tmp_path, frontend):
    """Exact: rows of all False, all True and mixed, at two batches and lengths."""
    ckpt = str(tmp_path / "a.pt")
    torch.save({}, ckpt)
    out = str(tmp_path / "a.qrt")
    convert(ckpt, out, model="test_convert_masks:AnyAll", input_shapes=["2,9"], input_dtypes={"mask": "bool"},
            frontend=frontend)
    m = qrt.load(out)
    for batch, length in ((1, 5), (4, 7)):
        mask = np.zeros((batch, length), bool)
        mask[1:2] = True
        mask[2:, ::3] = True
        for feed in (mask, ~mask, np.zeros_like(mask)):
            got, want = m.run([feed]), AnyAll()(torch.from_numpy(feed))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == np.bool_ and g.shape == w.shape and np.array_equal(g, w.numpy())


class RelativeBuckets(nn.Module):
    """MPNet's relative position buckets (transformers' MPNetAttention: T5's scheme), over relative positions
    of the free length: sign, abs, a float32 log, a truncation and torch.min; and the elementwise abs, min and
    max they are built from, of integers and of floats; rotary embeddings' sin and cos."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple:
        n = -(torch.arange(x.size(1))[None, :] - torch.arange(x.size(1))[:, None])
        buckets = (n < 0).to(torch.long) * 16
        n = torch.abs(n)
        large = 8 + (torch.log(n.float() / 8) / math.log(128 / 8) * 8).to(torch.long)
        large = torch.min(large, torch.full_like(large, 15))
        buckets += torch.where(n < 8, n, large)
        return (buckets, x.abs(), torch.log(x.abs()), torch.minimum(ids, ids[:, :1] * -3 + 4),
                torch.max(ids, ids * 3 - 5), ids.abs(), torch.sin(x * 100), (x * 100).cos())


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_relative_position_buckets(tmp_path, frontend):
    """Exact against torch at every relative position up to 299 (the log's bucket edges at 16, 32, 64, 128 and 256
    included: msun's logf, qrt's, equals torch's log there and every bucket equals torch's at its AVX-512, AVX2 and
    default capabilities up to 65535, measured); abs of -0.0 is +0.0; log within 1 ulp of torch's (99.6% of floats
    bit-equal, measured over 2 million); sin and cos within 1 ulp of torch's. A file with log is format version 12."""
    ckpt = str(tmp_path / "r.pt")
    torch.save({}, ckpt)
    out = str(tmp_path / "r.qrt")
    convert(ckpt, out, model="test_convert_masks:RelativeBuckets", input_shapes=["2,9", "2,9"],
            input_dtypes={"ids": "int64"}, frontend=frontend)
    m, rng = qrt.load(out), np.random.default_rng(9)
    assert m.metadata["qrt.version"] == "12"
    for batch, length in ((1, 1), (2, 17), (1, 300)):
        x = rng.standard_normal((batch, length)).astype(np.float32)
        x[0, 0] = -0.0
        ids = rng.integers(-2**40, 2**40, (batch, length))
        got, want = m.run([x, ids]), [w.numpy() for w in RelativeBuckets()(torch.from_numpy(x), torch.from_numpy(ids))]
        for i in (0, 1, 3, 4, 5):
            assert got[i].dtype == want[i].dtype and np.array_equal(got[i].view(np.uint8), want[i].view(np.uint8)), i
        for i in (2, 6, 7):
            ulps = np.abs(got[i].view(np.int32).astype(np.int64) - want[i].view(np.int32))
            assert got[i].dtype == np.float32 and ulps.max() <= 1, i


class LogBuckets(nn.Module):
    """DeBERTa-v2's relative positions over the free length (transformers' build_relative_position, its
    make_log_bucket_position: sign, where, a float32 log, ceil), at DeBERTa-v3's settings (256 buckets, 512
    positions) and a tiny model's (8, 32); their clamp into the embedding table's rows (an integer clamp; one
    with a float bound gives float32, as torch promotes); sign, ceil and floor of floats; a count of rows
    written as arithmetic on a free size (x.size(0) * 3, as DeBERTa expands its position index to its scores'
    batch * heads), which qrt takes from a value of that size (q)."""

    def forward(self, x: torch.Tensor) -> tuple:
        from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

        q = x.unsqueeze(1).expand(-1, 3, -1).reshape(-1, x.size(1), 1)  # [batch * 3, length, 1]
        v3 = build_relative_position(q, q, bucket_size=256, max_position=512)
        tiny = build_relative_position(q, q, bucket_size=8, max_position=32)
        rows = torch.clamp(tiny + 8, 0, 15).squeeze(0).expand([x.size(0) * 3, x.size(1), x.size(1)])
        return (v3, rows + q, torch.sign(x * 100), torch.ceil(x * 100), torch.floor(x * 100), tiny.sign(),
                tiny.clamp(min=-2.5))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_deberta_log_buckets(tmp_path, frontend):
    """Exact against torch (transformers' own bucket function) at every relative position up to 599, both settings;
    sign of -0.0 and NaN is +0.0 as torch's; ceil gives -0.0 in (-1, 0) as torch's. A file with ceil is format
    version 13; batch and length stay free (the count x.size(0) * 3)."""
    ckpt = str(tmp_path / "b.pt")
    torch.save({}, ckpt)
    out = str(tmp_path / "b.qrt")
    result = convert(ckpt, out, model="test_convert_masks:LogBuckets", input_shapes=["2,9"], frontend=frontend)
    assert result.shapes == {"x": "float32[?, ?]"}
    m, rng = qrt.load(out), np.random.default_rng(10)
    assert m.metadata["qrt.version"] == "13" and {"ceil", "floor"} <= {n.op for n in m.graph.nodes}
    for batch, length in ((1, 1), (2, 17), (1, 600)):
        x = rng.standard_normal((batch, length)).astype(np.float32)
        x[0, 0] = -0.0
        if length > 2:
            x[0, 1:3] = [np.nan, -0.004]
        got, want = m.run([x]), [w.numpy() for w in LogBuckets()(torch.from_numpy(x))]
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype)
            bits = np.array_equal(g.view(np.uint8), w.view(np.uint8))
            assert bits or (np.isnan(w).any() and np.array_equal(g, w, equal_nan=True)), (i, batch, length)


class Padded(nn.Module):
    """MobileBERT's trigram embeddings (the sequence shifted by one token each way, a zero row padded in), a pad of
    the last two dimensions with a value, integers padded."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple:
        trigram = torch.cat([F.pad(x[:, 1:], [0, 0, 0, 1, 0, 0], value=0.0), x,
                             F.pad(x[:, :-1], [0, 0, 1, 0, 0, 0], value=0.0)], dim=2)
        return trigram, F.pad(x, (2, 1, 0, 3), value=-1.5), F.pad(ids, (1, 0), value=7)


class BadPad(nn.Module):
    def __init__(self, pad: tuple, mode: str) -> None:
        super().__init__()
        self.pad, self.mode = pad, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pad, mode=self.mode)


def make_reflect_pad() -> nn.Module:
    return BadPad((1, 1), "reflect")


def make_crop() -> nn.Module:
    return BadPad((0, -1), "constant")


@pytest.mark.parametrize("frontend", ["fx", "export", "decomposed"])
def test_constant_pad(tmp_path, frontend):
    """Exact: torch's values at two batches and lengths (both free), through both front ends and a program saved
    after run_decompositions() (constant_pad_nd); reflection and cropping refused by name."""
    out = str(tmp_path / "p.qrt")
    if frontend == "decomposed":
        b, n = torch.export.Dim("b"), torch.export.Dim("n", min=3)  # x[:, 1:] of one token guards n - 1 != 1
        args = (torch.randn(2, 9, 4), torch.ones(2, 9, dtype=torch.int64))
        ep = torch.export.export(Padded(), args, dynamic_shapes=({0: b, 1: n}, {0: b, 1: n}))
        torch.export.save(ep.run_decompositions(), tmp_path / "p.pt2")
        convert(tmp_path / "p.pt2", out)
    else:
        torch.save({}, tmp_path / "p.pt")
        convert(tmp_path / "p.pt", out, model="test_convert_masks:Padded", input_shapes=["2,9,4", "2,9"],
                input_dtypes={"ids": "int64"}, frontend=frontend)
    m, rng = qrt.load(out), np.random.default_rng(11)
    assert all(tuple(i.shape[:2]) == (None, None) for i in m.graph.inputs)
    for batch, length in ((1, 3), (3, 12)):
        x, ids = rng.standard_normal((batch, length, 4)).astype(np.float32), rng.integers(0, 9, (batch, length))
        for g, w in zip(m.run([x, ids]), Padded()(torch.from_numpy(x), torch.from_numpy(ids))):
            assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy())
    if frontend != "decomposed":
        for make, message in (("make_reflect_pad", "F.pad mode 'reflect' is not supported"),
                              ("make_crop", r"qrt pads by constant amounts of at least 0 \(no cropping\)")):
            with pytest.raises(ConvertError, match=message):
                convert(tmp_path / "p.pt", out, model=f"test_convert_masks:{make}", input_shapes=["2,9"],
                        frontend=frontend)


def test_float_extremum_refused(tmp_path):
    ckpt = str(tmp_path / "f.pt")
    torch.save({}, ckpt)
    with pytest.raises(ConvertError, match="an elementwise minimum of float32 values is not supported"):
        convert(ckpt, tmp_path / "f.qrt", model="test_convert_masks:FloatMinimum", input_shapes=["2,9"])


class FloatMinimum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.minimum(x, x * 0.5)


class Repeats(nn.Module):
    """A decoder's state beside each source step (bentrevett's seq2seq attention), a new leading dimension, a
    repeat that changes nothing."""

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> tuple:
        beside = h.unsqueeze(1).repeat(1, x.size(1), 1)
        return torch.cat([beside, x], 2), h.repeat(3, 1, 1), x.repeat(1, 1, 1)


class TiledRepeats(nn.Module):
    """Copies of dimensions above size 1: DeBERTa's position projections repeated by the batch ([heads, 2k, e]
    .repeat(x.size(0), 1, 1)), a free dimension tiled beside a free one kept, a new leading dimension."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(24, dtype=torch.float32).view(2, 3, 4))

    def forward(self, x: torch.Tensor) -> tuple:
        return self.table.repeat(x.size(0), 1, 1) + 0, x.repeat(1, 2), x.repeat(3, 2, 1)


class TiledFreeTwice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(2, 3)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_repeats(tmp_path, frontend):
    """Exact (data movement): torch's values at two batches and lengths, for dimensions of size 1 (an expand) and
    larger ones (copies); tiling two dimensions of free size (two sizes to infer) is refused by name."""
    ckpt, out = str(tmp_path / "r.pt"), str(tmp_path / "r.qrt")
    torch.save({}, ckpt)
    result = convert(ckpt, out, model="test_convert_masks:Repeats", input_shapes=["2,6", "2,9,4"], frontend=frontend)
    assert result.shapes == {"h": "float32[?, ?]", "x": "float32[?, ?, ?]"}
    m, rng = qrt.load(out), np.random.default_rng(9)
    for batch, length in ((1, 3), (4, 11)):
        h, x = (rng.standard_normal(s).astype(np.float32) for s in ((batch, 6), (batch, length, 4)))
        for g, w in zip(m.run([h, x]), Repeats()(torch.from_numpy(h), torch.from_numpy(x))):
            assert np.array_equal(g, w.numpy())
    torch.save(TiledRepeats().state_dict(), ckpt)
    result = convert(ckpt, out, model="test_convert_masks:TiledRepeats", input_shapes=["2,5"], frontend=frontend)
    assert result.shapes == {"x": "float32[?, ?]"}
    m = qrt.load(out)
    for batch, length in ((1, 3), (4, 7)):
        x = rng.standard_normal((batch, length)).astype(np.float32)
        for g, w in zip(m.run([x]), TiledRepeats()(torch.from_numpy(x))):
            assert np.array_equal(g, w.numpy())
    torch.save({}, ckpt)
    with pytest.raises(ConvertError, match=r"repeat tiles 2 dimensions of free size; qrt infers at most one"):
        convert(ckpt, out, model="test_convert_masks:TiledFreeTwice", input_shapes=["2,5"], frontend=frontend)


class BadPow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x ** 1.5


def test_pow_beyond_torchs_exact_exponents_refused(tmp_path):
    ckpt = str(tmp_path / "p.pt")
    torch.save(BadPow().state_dict(), ckpt)
    with pytest.raises(ConvertError, match=r"exponent 1.5 \(torch runs libm's powf"):
        convert(ckpt, str(tmp_path / "p.qrt"), model="test_convert_masks:BadPow", input_shapes=["2,5"])


class SizeFollowing(nn.Module):
    """What encoders build from their inputs' sizes: indexing by full aranges (the identity, a transpose), a
    constant buffer sliced to the length and expanded to the batch, one constant index tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(64).view(1, 64) * 3)

    def forward(self, x: torch.Tensor) -> tuple:
        b, s = x.size(0), x.size(1)
        rows, cols = torch.arange(b), torch.arange(s) + 0
        same = x[rows[:, None], cols[None, :]]
        swapped = x[rows[None, :], cols[:, None]]
        positions = self.table[:, :s].expand(b, s)
        return same, swapped, positions.float() + x, x[:, torch.tensor([0, 2])]


def make_size_following() -> nn.Module:
    return SizeFollowing()


def test_sizes_followed_at_run_time(tmp_path):
    ckpt = str(tmp_path / "s.pt")
    torch.save(SizeFollowing().state_dict(), ckpt)
    out = str(tmp_path / "s.qrt")
    result = convert(ckpt, out, model="test_convert_masks:make_size_following", input_shapes=["2,9"],
                     frontend="export")
    assert result.shapes == {"x": "float32[?, ?]"}
    m = qrt.load(out)
    for batch, length in ((1, 3), (4, 17), (3, 64)):
        x = np.random.default_rng(length).standard_normal((batch, length)).astype(np.float32)
        ref = SizeFollowing()(torch.from_numpy(x))
        for g, r in zip(m.run(x), ref):
            assert np.array_equal(g, r.numpy())
    with pytest.raises(ValueError, match=r"index must lie in \[0, 64\)"):
        m.run(np.zeros((1, 65), np.float32))  # where torch's slice would clamp (docs/CONVERTER.md)


class IntegerArithmetic(nn.Module):
    """Integer arithmetic as transformers writes it (RoBERTa's positions) and as torch promotes it: int32
    against int32, a Python int, an int64 0-dim buffer and a 0-dim int64 value (int32 kept), int64 against
    int64, bool against a Python int (int64), negation, cumsum with and without dtype, and integers meeting
    float32 (x + mask, ids / 2, ids + 0.0: float32, the integers converted first); y += b in place keeps y's int32,
    as torch writes it, and in place on a clone leaves the original as it was; cumsum of a single value."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.tensor(5))  # int64, 0-dim
        self.register_buffer("steps", torch.tensor([2**31 - 1, 2]))  # int64, stored as int32: sums past 2**31

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple:
        real = ids.ne(1).int()
        positions = torch.cumsum(real, dim=1).type_as(real) * real + 1
        narrow = torch.cumsum(real, 1, dtype=torch.int32) - self.offset
        wide = positions.long() * ids - ids
        counted = real.bool() + (2**31 - 1)  # int64: past int32's range
        first = real + ids[0, 0]  # int32: a 0-dim int64 does not widen a tensor; the sum wraps past 2**31
        widened = real[:, :2] + self.steps  # int64 (an int64 buffer of rank 1 widens)
        kept = real * 3
        kept += ids  # in place: int32 kept, the int64 sum's low 32 bits
        copied, shifted = real.clone(), x.clone()
        copied -= ids  # in place on copies: real and x themselves unchanged
        shifted += 1
        return (positions, narrow, wide, counted, first, widened, kept, copied, shifted, -real, x + real, ids / 2,
                x * ids, ids + 0.0, torch.cumsum(ids[0, 0], 0), real * 2, x * 2)


def make_integer_arithmetic() -> nn.Module:
    return IntegerArithmetic()


class FloatCumsum(nn.Module):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(ids, 1, dtype=torch.float32)


def test_cumsum_to_float_refused(tmp_path):
    """torch sums in float64 there and rounds each sum to float32: not qrt's exact integer sums cast after."""
    torch.save(FloatCumsum().state_dict(), tmp_path / "c.pt")
    with pytest.raises(ConvertError, match=r"cumsum of a float32 tensor, or to a float dtype, is not supported"):
        convert(str(tmp_path / "c.pt"), str(tmp_path / "c.qrt"), model="test_convert_masks:FloatCumsum",
                input_shapes=["2,9"], input_dtypes={"ids": "int64"})


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_integer_arithmetic_as_torch(tmp_path, frontend):
    """Every result exact (integers modulo 2**bits, one float32 rounding each), so bit for bit, dtypes included;
    ids near 2**40 make int64 products wrap and int64 -> float32 conversions round."""
    ckpt = str(tmp_path / "i.pt")
    torch.save(IntegerArithmetic().state_dict(), ckpt)
    out = str(tmp_path / "i.qrt")
    convert(ckpt, out, model="test_convert_masks:make_integer_arithmetic", input_shapes=["2,9", "2,9"],
            input_dtypes={"ids": "int64"}, frontend=frontend)
    m, rng = qrt.load(out), np.random.default_rng(9)
    for batch, length in ((1, 7), (3, 12)):
        x = rng.standard_normal((batch, length)).astype(np.float32)
        ids = rng.integers(0, 2**41, (batch, length))
        ids[0, 4:] = 1  # padding
        ref = IntegerArithmetic()(torch.from_numpy(x), torch.from_numpy(ids))
        got = m.run({"x": x, "ids": ids})
        assert len(got) == len(ref)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert g.dtype == r.numpy().dtype and np.array_equal(g, r.numpy()), i


class FilledFromSizes(nn.Module):
    """A buffer's new_zeros (torch.fx records it as a function), a masked_fill of int64 ids with a number, and
    zeros_like of a run-time scalar returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple:
        return (self.b.new_zeros((x.size(0), 3)) + x[:, :3], ids.masked_fill(ids == 0, 7), torch.zeros_like(x.sum()))


class Lengths(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((x.size(0),), x.size(1))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_new_tensors_found_by_the_audit(tmp_path, frontend):
    """Each had been refused or wrong: the buffer's new_zeros (fx: 'function TensorBase.new_zeros'), the int64
    masked_fill (a file its own check refused: where of int32 and int64), the scalar zeros_like ('returns a
    constant'); and a fill value read from a free size, which had been stored at its example value with the
    dimension left free: it now fixes that dimension, or is refused where the dimension is declared free."""
    ckpt, out = str(tmp_path / "f.pt"), str(tmp_path / "f.qrt")
    torch.save(FilledFromSizes().state_dict(), ckpt)
    convert(ckpt, out, model="test_convert_masks:FilledFromSizes", input_shapes=["2,9", "2,9"],
            input_dtypes={"ids": "int64"}, frontend=frontend)
    m = qrt.load(out)
    for batch, length in ((1, 4), (3, 10)):
        x = np.random.default_rng(length).standard_normal((batch, length)).astype(np.float32)
        ids = np.random.default_rng(batch).integers(0, 3, (batch, length))
        for g, w in zip(m.run([x, ids]), FilledFromSizes()(torch.from_numpy(x), torch.from_numpy(ids))):
            assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy())
    torch.save({}, ckpt)
    result = convert(ckpt, out, model="test_convert_masks:Lengths", input_shapes=["2,9"], frontend=frontend)
    assert result.shapes == {"x": "float32[?, 9]"}
    assert np.array_equal(qrt.load(out).run(np.zeros((4, 9), np.float32)), np.full(4, 9))
    with pytest.raises(ConvertError, match=r"dimension 1 is declared free.*fills a new tensor with .* = 9"):
        convert(ckpt, out, model="test_convert_masks:Lengths", input_shapes=["2?,9?"], frontend=frontend,
                free_dims="marked")


class PoolOverIds(nn.Module):
    """Mean pooling over the tokens that are not padding (id 0), then a Linear: on the converter's first example,
    ids all 0, the pooled rows are 0 / 0 = NaN, which the Linear's dynamic quantization refuses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(10)
        self.emb, self.fc = nn.Embedding(20, 8, padding_idx=0), nn.Linear(8, 3)

    def pooled(self, ids: torch.Tensor) -> torch.Tensor:
        keep = (ids != 0).unsqueeze(-1).float()
        return (self.emb(ids) * keep).sum(1) / keep.sum(1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pooled(ids))


def test_second_example_where_the_first_masks_every_row(tmp_path):
    """torch's quantize_dynamic model converts on the converter's second example, ids 0 then 1 along each row (it
    had stopped: 'min should be less than or equal to max'), and agrees: the pooled rows within 1e-6 relative (the
    masked mean's sum, qrt's order), so the head's dynamic quantization of them moves by at most one step s (its
    range over 127, reduce_range) on an element, the output by at most s times the largest row sum of |W|."""
    q = quantize_dynamic(PoolOverIds().eval(), {nn.Linear}, dtype=torch.qint8)
    torch.save(q, tmp_path / "p.pt")
    convert(tmp_path / "p.pt", tmp_path / "p.qrt", input_shapes=["2,9"], trust_checkpoint=True)
    m, rng = qrt.load(tmp_path / "p.qrt"), np.random.default_rng(11)
    w = q.fc.weight().dequantize().abs().sum(1).max().item()
    for batch, length in ((1, 4), (3, 10)):
        ids = rng.integers(1, 20, (batch, length))
        ids[0, 2:] = 0
        with torch.no_grad():
            pooled, want = q.pooled(torch.from_numpy(ids)).numpy(), q(torch.from_numpy(ids)).numpy()
        step = (max(pooled.max(), 0) - min(pooled.min(), 0)) / 127
        assert np.abs(m.run(ids) - want).max() <= step * w + 1e-6


class OneTokenType(nn.Module):
    """A one-row token-type table (RoBERTa's type_vocab_size=1), then max pooling over a keep-mask: the
    converter's second example (1s after the first position) indexes past the table."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(12)
        self.types, self.fc = nn.Embedding(1, 6), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, types: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        y = torch.where(keep.unsqueeze(-1), x + self.types(types), -1e4)
        return self.fc(y.amax(1))


def test_first_example_kept_where_it_runs(tmp_path):
    """The model runs on the converter's first example only, and converts (with the second in its place, as for
    a stop of this project, it had failed: IndexError). Bit for bit: an add and a max round as torch's."""
    q = quantize_dynamic(OneTokenType().eval(), {nn.Linear}, dtype=torch.qint8)
    torch.save(q, tmp_path / "t.pt")
    convert(tmp_path / "t.pt", tmp_path / "t.qrt", input_shapes=["2,5,6", "2,5", "2,5"],
            input_dtypes={"types": "int64", "keep": "bool"}, trust_checkpoint=True)
    m, rng = qrt.load(tmp_path / "t.qrt"), np.random.default_rng(12)
    x = rng.standard_normal((3, 7, 6)).astype(np.float32)
    types, keep = np.zeros((3, 7), np.int64), np.ones((3, 7), bool)
    keep[1, 4:] = False
    with torch.no_grad():
        want = q(*map(torch.from_numpy, (x, types, keep))).numpy()
    assert np.array_equal(m.run([x, types, keep]), want)
