"""quantize_per_tensor, quantize_per_channel and dequantize against torch: bit-exact.

Tolerance: none. These are elementwise roundings that NUMERICS.md (Q1-Q3)
pins down exactly, so the stored integers and the float32 results must be
identical to torch's.
"""

import numpy as np
import pytest
import torch

import qrt
from qrt.builder import GraphBuilder

TORCH_DTYPES = {"quint8": torch.quint8, "qint8": torch.qint8, "qint32": torch.qint32}


def _roundtrip_model(path, shape, scale, zero_point, dtype, axis=None):
    """x -> quantize -> (q, dequantize(q)): both the integers and the floats come out."""
    b = GraphBuilder()
    x = b.input("x", "float32", list(shape))
    qp = {"scale": np.asarray(scale, np.float32), "zero_point": np.asarray(zero_point, np.int32)}
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
