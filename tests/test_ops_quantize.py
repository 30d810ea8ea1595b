"""quantize_per_tensor, quantize_per_channel and dequantize against torch: bit-exact.

Tolerance: none. These are elementwise roundings that NUMERICS.md (Q1-Q3)
pins down exactly, so the stored integers and the float32 results must be
identical to torch's. Per-channel scales may be float64 (format version 2),
as torch holds them; per-channel dequantize is then
fl(double(fl(fl(q) - fl(zp))) * scale), and quantize uses 1.0f / fl(scale).
"""

import json
import struct
import zlib

import numpy as np
import pytest
import torch

import qrt
from qrt.builder import GraphBuilder

TORCH_DTYPES = {"quint8": torch.quint8, "qint8": torch.qint8, "qint32": torch.qint32}


def _roundtrip_model(path, shape, scale, zero_point, dtype, axis=None, scale_dtype=np.float32):
    """x -> quantize -> (q, dequantize(q)): both the integers and the floats come out."""
    b = GraphBuilder()
    x = b.input("x", "float32", list(shape))
    qp = {"scale": np.asarray(scale, scale_dtype), "zero_point": np.asarray(zero_point, np.int32)}
    if axis is None:
        q = b.node("quantize_per_tensor", {"x": x, **qp}, {"dtype": dtype}, name="q")
    else:
        q = b.node("quantize_per_channel", {"x": x, **qp}, {"dtype": dtype, "axis": axis}, name="q")
    shared = {"scale": "q.scale", "zero_point": "q.zero_point"}
    y = b.node("dequantize", {"x": q, **shared}, {"axis": axis}, name="dq")
    b.output(q, y)
    b.save(path)
    return qrt.load(path)


def _inputs(shape, kind, scale, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "tiny":
        x *= 1e-5
    elif kind == "large":
        x *= 1e4
    elif kind == "positive":
        x = np.abs(x) * 3
    elif kind == "ties":  # exact halves of the scale: round-half-to-even decides
        x = ((rng.integers(-300, 300, size=shape) + 0.5) * np.float32(scale)).astype(np.float32)
    return x


def test_documented_per_tensor_example(tmp_path):
    model = _roundtrip_model(tmp_path / "m.qrt", [4], 0.1, 10, "quint8")
    q, _ = model.run(np.array([-1.0, 0.0, 1.0, 2.0], np.float32))
    np.testing.assert_array_equal(q, [0, 10, 20, 30])
    ref = torch.quantize_per_tensor(torch.tensor([-1.0, 0.0, 1.0, 2.0]), 0.1, 10, torch.quint8).int_repr()
    np.testing.assert_array_equal(q, ref.numpy())


def test_documented_per_channel_example(tmp_path):
    model = _roundtrip_model(tmp_path / "m.qrt", [2, 2], [0.1, 0.01], [10, 0], "quint8", axis=0)
    q, _ = model.run(np.array([[-1.0, 0.0], [1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(q, [[0, 10], [100, 200]])
    ref = torch.quantize_per_channel(
        torch.tensor([[-1.0, 0.0], [1.0, 2.0]]), torch.tensor([0.1, 0.01]), torch.tensor([10, 0]), 0, torch.quint8
    )
    np.testing.assert_array_equal(q, ref.int_repr().numpy())


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
@pytest.mark.parametrize("kind", ["normal", "tiny", "large", "positive", "ties"])
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 37)])
def test_per_tensor_matches_torch(tmp_path, dtype, kind, shape):
    rng = np.random.default_rng(abs(hash((dtype, kind, shape))) % 2**32)
    lo, hi = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-1000, 1000)}[dtype]
    for scale in (0.1, 0.0123, 7.0, 3e-6):
        scale = float(np.float32(scale))
        zp = int(rng.integers(lo, hi + 1))
        model = _roundtrip_model(tmp_path / "m.qrt", [None] + list(shape[1:]), scale, zp, dtype)
        x = _inputs(shape, kind, scale, rng)
        q, y = model.run(x)
        ref = torch.quantize_per_tensor(torch.from_numpy(x), scale, zp, TORCH_DTYPES[dtype])
        np.testing.assert_array_equal(q, ref.int_repr().numpy())
        np.testing.assert_array_equal(y, ref.dequantize().numpy())


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
@pytest.mark.parametrize("kind", ["normal", "tiny", "large", "ties"])
@pytest.mark.parametrize("shape,axis", [((5,), 0), ((7, 13), 0), ((7, 13), 1), ((3, 5, 37), 1), ((3, 5, 37), 2)])
def test_per_channel_matches_torch(tmp_path, dtype, kind, shape, axis):
    rng = np.random.default_rng(abs(hash((dtype, kind, shape, axis))) % 2**32)
    lo, hi = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-1000, 1000)}[dtype]
    channels = shape[axis]
    scales = (10.0 ** rng.uniform(-5, 1, channels)).astype(np.float32)
    zps = rng.integers(lo, hi + 1, channels).astype(np.int32)
    model = _roundtrip_model(tmp_path / "m.qrt", shape, scales, zps, dtype, axis=axis)
    x = _inputs(shape, kind, float(scales[0]), rng)
    q, y = model.run(x)
    ref = torch.quantize_per_channel(
        torch.from_numpy(x), torch.from_numpy(scales).double(), torch.from_numpy(zps).long(), axis,
        TORCH_DTYPES[dtype],
    )
    np.testing.assert_array_equal(q, ref.int_repr().numpy())
    np.testing.assert_array_equal(y, ref.dequantize().numpy())


def test_infinities_saturate_and_nan_is_refused(tmp_path):
    model = _roundtrip_model(tmp_path / "m.qrt", [None], 0.1, 10, "quint8")
    q, _ = model.run(np.array([np.inf, -np.inf, 1e30], np.float32))
    ref = torch.quantize_per_tensor(torch.tensor([np.inf, -np.inf, 1e30]), 0.1, 10, torch.quint8).int_repr()
    np.testing.assert_array_equal(q, ref.numpy())
    # torch maps NaN to 255 per tensor and to 0 per channel: no answer to match, so qrt refuses it.
    with pytest.raises(ValueError, match="NaN"):
        model.run(np.array([1.0, np.nan], np.float32))


# ------------------------------------------------------------------ float64 per-channel scales (format version 2)


def _stored_dtypes(path) -> dict[str, str]:
    """The safetensors dtype code of each tensor in a .qrt file, read from its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def _float64_scales(channels: int, seed: int) -> np.ndarray:
    """Arbitrary float64 scales over six decades, as torch's own tests draw them (few are float32 values)."""
    g = torch.Generator().manual_seed(seed)
    s = (torch.rand(channels, dtype=torch.float64, generator=g) + 0.01) * 10.0 ** torch.empty(
        channels, dtype=torch.float64).uniform_(-5, 1, generator=g)
    return s.numpy()


def _per_channel_ref(x, scales, zps, axis, dtype):
    return torch.quantize_per_channel(
        torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps).long(), axis, TORCH_DTYPES[dtype])


def test_issue_example_float64_scale(tmp_path):
    """The example of issue 18: a float64 scale of 0.03 dequantizes to torch's -0.30000001. Bit-exact."""
    model = _roundtrip_model(tmp_path / "m.qrt", [1, 2], [0.2, 0.03], [5, 10], "quint8", 1, np.float64)
    assert _stored_dtypes(tmp_path / "m.qrt")["q.scale"] == "F64"
    q, y = model.run(np.array([[0.0, -0.3]], np.float32))
    ref = _per_channel_ref(np.array([[0.0, -0.3]], np.float32), np.array([0.2, 0.03]), np.array([5, 10]), 1,
                           "quint8")
    np.testing.assert_array_equal(q, [[5, 0]])
    np.testing.assert_array_equal(q, ref.int_repr().numpy())
    np.testing.assert_array_equal(y.view(np.int32), ref.dequantize().numpy().view(np.int32))
    assert y[0, 1] == np.float32(-0.30000001192092896) != np.float32(-10) * np.float32(0.03)  # float32 gives ...998


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
@pytest.mark.parametrize("kind", ["normal", "large", "ties", "wide"])
@pytest.mark.parametrize("shape,axis", [((5,), 0), ((7, 13), 0), ((7, 13), 1), ((3, 5, 37), 0), ((3, 5, 37), 2)])
def test_per_channel_float64_scales_match_torch(tmp_path, dtype, kind, shape, axis):
    """Arbitrary float64 scales: stored as F64, integers and floats bit-exact with torch.

    "wide" spreads x over up to 2**28 steps of each channel's scale, so qint32 values with
    |q - zp| > 2**24 occur (8-bit dtypes saturate there).
    """
    seed = zlib.crc32(repr((dtype, kind, shape, axis)).encode())  # str hashes vary between runs
    rng = np.random.default_rng(seed)
    lo, hi = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-(2**31), 2**31 - 1)}[dtype]
    channels = shape[axis]
    scales = _float64_scales(channels, seed)
    zps = rng.integers(max(lo, -(2**30)), min(hi, 2**30) + 1, channels).astype(np.int32)
    s_b = scales.reshape([channels if d == axis else 1 for d in range(len(shape))])  # broadcasts along axis
    if kind == "ties":  # exact halves of each scale: 1/fl(s) versus fl(1/s) decides
        x = ((rng.integers(-300, 300, size=shape) + 0.5) * s_b).astype(np.float32)
    elif kind == "wide":
        x = (rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(0, 29, shape) * s_b).astype(np.float32)
        x.reshape(-1)[0] = 1.5 * 2**27 * scales[0]  # at least one value far beyond 2**24 steps
    else:
        x = (rng.standard_normal(shape) * s_b * (300 if kind == "normal" else 1e6)).astype(np.float32)
    model = _roundtrip_model(tmp_path / "m.qrt", shape, scales, zps, dtype, axis, np.float64)
    assert _stored_dtypes(tmp_path / "m.qrt")["q.scale"] == "F64"
    q, y = model.run(x)
    ref = _per_channel_ref(x, scales, zps, axis, dtype)
    np.testing.assert_array_equal(q, ref.int_repr().numpy())
    np.testing.assert_array_equal(y.view(np.int32), ref.dequantize().numpy().view(np.int32))
    if dtype == "qint32" and kind == "wide":
        z_b = zps.reshape(s_b.shape).astype(np.int64)
        assert np.abs(q.astype(np.int64) - z_b).max() > 2**24


def test_quantize_uses_the_float32_rounding_of_the_scale(tmp_path):
    """torch quantizes with 1.0f / (float)scale, not with fl(1.0 / scale): bit-exact, and the test can tell.

    The scales are those whose two reciprocals differ; ties make the difference show in the integers.
    """
    scales = _float64_scales(4096, 1)
    inv32, inv64 = np.float32(1) / scales.astype(np.float32), (1.0 / scales).astype(np.float32)
    scales = scales[inv32 != inv64][:64]
    rng = np.random.default_rng(1)
    x = ((rng.integers(-(2**20), 2**20, (64, 200)) + 0.5) * scales[:, None]).astype(np.float32)
    zps = np.zeros(64, np.int32)
    model = _roundtrip_model(tmp_path / "m.qrt", x.shape, scales, zps, "qint32", 0, np.float64)
    q, _ = model.run(x)
    ref = _per_channel_ref(x, scales, zps, 0, "qint32").int_repr().numpy()
    np.testing.assert_array_equal(q, ref)
    other = np.rint((x * (1.0 / scales).astype(np.float32)[:, None]).astype(np.float32))
    assert np.any(other != ref), "the inputs do not tell the two reciprocals apart"


def _dequantize_model(path, shape, dtype, scales, zps, axis):
    b = GraphBuilder()
    q = b.input("q", dtype, list(shape))
    b.output(b.node("dequantize", {"x": q, "scale": scales, "zero_point": zps}, {"axis": axis}, name="dq"))
    b.save(path)
    return qrt.load(path)


@pytest.mark.parametrize("scale_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((6, 101), 0), ((3, 5, 7), 2)])
def test_per_channel_dequantize_qint32_over_the_whole_range(tmp_path, scale_dtype, shape, axis):
    """qint32 values and zero points anywhere in int32: bit-exact with torch.

    torch computes float(q) - zp in float32 before the double multiply, so for |q| or |q - zp| above
    2**24 the exact difference would be wrong; the test checks that it would be.
    """
    rng = np.random.default_rng(7)
    channels = shape[axis]
    scales = _float64_scales(channels, 7).astype(scale_dtype)
    zps = rng.integers(-(2**31), 2**31, channels).astype(np.int32)
    zps[0] = 0
    q = rng.integers(-(2**31), 2**31, shape).astype(np.int32)
    q.reshape(-1)[:20] = rng.integers(-(2**24) - 9, 2**24 + 9, 20)
    model = _dequantize_model(tmp_path / "m.qrt", shape, "int32", scales, zps, axis)
    y = model.run(q)
    ref = torch._make_per_channel_quantized_tensor(
        torch.from_numpy(q), torch.from_numpy(scales.astype(np.float64)), torch.from_numpy(zps).long(), axis
    ).dequantize().numpy()
    np.testing.assert_array_equal(y.view(np.int32), ref.view(np.int32))
    b_shape = [channels if d == axis else 1 for d in range(len(shape))]
    exact = ((q.astype(np.int64) - zps.reshape(b_shape)) * scales.astype(np.float64).reshape(b_shape))
    assert np.any(exact.astype(np.float32) != ref), "no value where the float32 subtraction matters"


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_float32_scales_give_the_float32_product(tmp_path, dtype):
    """A model with float32 per-channel scales stores F32 and gives what it gave before format version 2.

    Bit-exact: with |q - zp| < 2**24 the double product of two floats is exact, so rounding it once
    equals the float32 product fl(fl(q - zp) * s) that qrt computed before; and torch agrees.
    """
    rng = np.random.default_rng(3)
    lo, hi = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-(2**23), 2**23)}[dtype]
    scales = (10.0 ** rng.uniform(-5, 1, 9)).astype(np.float32)
    zps = rng.integers(lo, hi + 1, 9).astype(np.int32)
    q = rng.integers(lo, hi + 1, (4, 9, 11)).astype(qrt.ops.QUANT_DTYPES[dtype])
    model = _dequantize_model(tmp_path / "m.qrt", q.shape, q.dtype.name, scales, zps, 1)
    assert _stored_dtypes(tmp_path / "m.qrt")["dq.scale"] == "F32"
    y = model.run(q)
    before = (q.astype(np.int64) - zps[:, None]).astype(np.float32) * scales[:, None]
    np.testing.assert_array_equal(y.view(np.int32), before.view(np.int32))
    ref = torch._make_per_channel_quantized_tensor(
        torch.from_numpy(q.astype(np.int32) if dtype == "qint32" else q), torch.from_numpy(scales).double(),
        torch.from_numpy(zps).long(), 1)
    np.testing.assert_array_equal(y.view(np.int32), ref.dequantize().numpy().view(np.int32))


def test_float64_scales_only_where_torch_holds_them(tmp_path):
    """Per-tensor scales and linear weight scales stay float32 (torch computes them in float32)."""
    b = GraphBuilder()
    b.output(b.node("dequantize", {"x": b.input("q", "uint8", [3]), "scale": np.array(0.1),
                                   "zero_point": np.array(0, np.int32)}))
    with pytest.raises(qrt.FormatError, match="a per-tensor scale .axis null. must be float32, got float64"):
        b.save(tmp_path / "m.qrt")
    b = GraphBuilder()
    b.output(b.node("quantize_per_tensor", {"x": b.input("x", "float32", [3]), "scale": np.array(0.1),
                                            "zero_point": np.array(0, np.int32)}, {"dtype": "quint8"}))
    with pytest.raises(qrt.FormatError, match="input 'scale' .* has dtype float64, expected float32"):
        b.save(tmp_path / "m.qrt")
    b = GraphBuilder()
    b.output(b.node("linear_dynamic", {
        "x": b.input("x", "float32", [None, 2]), "weight": np.ones((3, 2), np.int8),
        "weight_scale": np.full(3, 0.1), "weight_zero_point": np.zeros(3, np.int32)}))
    with pytest.raises(qrt.FormatError, match="input 'weight_scale' .* has dtype float64, expected float32"):
        b.save(tmp_path / "m.qrt")


@pytest.mark.parametrize("bad", [1e300, 3.5e38, 1e-50, 1e-39, 5e-39, 0.0, -0.03, float("nan"), float("inf")])
def test_float64_scale_must_round_to_a_usable_float32(tmp_path, bad):
    """quantize multiplies by 1/fl(scale): a float64 scale whose fl is 0, infinite or subnormal (5e-39: its
    reciprocal is finite, but a flush-to-zero unit reads it as 0) is refused (torch accepts some of these and
    saturates or returns zero point)."""
    scales = np.array([0.1, bad])
    with pytest.raises(qrt.FormatError, match="scale must be finite and > 0, a normal float32"):
        _roundtrip_model(tmp_path / "m.qrt", [1, 2], scales, [0, 0], "qint8", 1, np.float64)
