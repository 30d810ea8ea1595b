"""The packed weight layout (qrt/layout.py, qrt/kernels/layout.h) that every kernel variant reads and format
version 4 stores: the C packer against the layout's element formula, unpack as its inverse, and the kernels
reading a PackedMatrix where it lies (a view of a file, at any alignment) giving the bits of the same
weights packed at load, on every variant this CPU runs.
"""

import mmap

import numpy as np
import pytest

from qrt import _kernels as K
from qrt.layout import PackedMatrix, pack, packed_shape, unpack

# n just off the strip (16) and panel (64, 32) widths, k just off the int8 group (4), the empty cases
SIZES = [(0, 0), (0, 3), (2, 0), (1, 1), (15, 3), (16, 4), (17, 5), (33, 7), (63, 9), (65, 130), (130, 33)]



def matrix(dtype, n, k, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.int8:
        return rng.integers(-128, 128, (n, k), dtype=np.int8)
    return rng.standard_normal((n, k)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32])
@pytest.mark.parametrize("n,k", SIZES)
def test_pack_follows_the_element_formula(dtype, n, k):
    w = matrix(dtype, n, k)
    p = pack(w)
    d = p.data
    assert d.shape == packed_shape(dtype, n, k) and d.dtype == dtype and p.shape == (n, k)
    if dtype == np.int8:  # [s, g, c, b] = w[16 s + c, 4 g + b], zero outside w
        assert d.shape[0] * 16 % 64 == 0 and d.shape[1] * 4 >= k
        for s, g, c, b in np.ndindex(d.shape):
            j, t = 16 * s + c, 4 * g + b
            assert d[s, g, c, b] == (w[j, t] if j < n and t < k else 0)
        np.testing.assert_array_equal(p.row_sums, w.sum(axis=1, dtype=np.int32))
    else:  # [s, t, c] = w[16 s + c, t]
        assert d.shape[0] * 16 % 32 == 0
        for s, t, c in np.ndindex(d.shape):
            j = 16 * s + c
            assert d[s, t, c] == (w[j, t] if j < n else 0)
        assert p.row_sums is None


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32])
@pytest.mark.parametrize("n,k", SIZES + [(300, 1031)])
def test_unpack_inverts_pack(dtype, n, k):
    w = matrix(dtype, n, k)
    p = pack(w)
    np.testing.assert_array_equal(unpack(p), w)
    np.testing.assert_array_equal(np.asarray(p), w)  # what the GPU backend and the tools see
    assert np.asarray(p, np.float64).dtype == np.float64


def test_pack_refuses_what_has_no_layout():
    for bad in (np.zeros((2, 3), np.int32), np.zeros(3, np.int8), np.zeros((2, 2, 2), np.float32)):
        with pytest.raises(ValueError, match="only 2-D int8, float16 or float32"):
            pack(bad)


def mapped(p: PackedMatrix, offset: int) -> PackedMatrix:
    """p as a file would hold it: its bytes at `offset` in a read-only mapping (any alignment)."""
    raw = p.data.tobytes()
    m = mmap.mmap(-1, offset + len(raw) + 1)
    m[offset : offset + len(raw)] = raw
    ro = np.frombuffer(m, np.uint8, len(raw), offset).view(p.data.dtype).reshape(p.data.shape)
    ro.flags.writeable = False
    return PackedMatrix(ro, p.shape, p.row_sums)


@pytest.mark.parametrize("offset", [0, 1, 3, 64])
@pytest.mark.parametrize("m,n,k", [(1, 65, 132), (1, 17, 5), (3, 130, 33), (8, 64, 256), (13, 33, 1030)])
def test_int8_kernels_read_packed_weights_where_they_lie(variant, offset, m, n, k):
    rng = np.random.default_rng(m * n + k)
    w = matrix(np.int8, n, k, seed=k)
    scale = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    zp = rng.integers(-3, 4, n).astype(np.int32)
    for weight_zp in (np.int32(0), zp):
        from_plain = K.DynamicLinear(w, scale, weight_zp, bias, True)
        from_file = K.DynamicLinear(mapped(pack(w), offset), scale, weight_zp, bias, True)
        want, got = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        from_plain(x, want)
        from_file(x, got)
        np.testing.assert_array_equal(got, want)
    xq = rng.integers(0, 256, (m, k), dtype=np.uint8)
    acc, ref = np.empty((m, n), np.int32), np.empty((m, n), np.int32)
    K.PackedS8(mapped(pack(w), offset), zp)(xq, 7, acc)
    K.gemm_u8s8_reference(xq, 7, w, zp, ref)
    np.testing.assert_array_equal(acc, ref)


@pytest.mark.parametrize("offset", [0, 2, 64])
@pytest.mark.parametrize("m,n,k", [(1, 33, 7), (3, 65, 129), (9, 130, 600), (20, 31, 1030)])
def test_float_kernels_read_packed_weights_where_they_lie(variant, offset, m, n, k):
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    for dtype, half in ((np.float16, True), (np.float32, False)):
        w = matrix(dtype, n, k, seed=n)
        want, got = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        K.PackedFloat(w, half)(x, bias, want)
        K.PackedFloat(mapped(pack(w), offset), half)(x, bias, got)
        np.testing.assert_array_equal(got, want)
        ref = np.empty((m, n), np.float32)
        K.gemm_f32_chain_reference(x, w.astype(np.float32), bias, ref)
        np.testing.assert_array_equal(got, ref)


def test_kernels_refuse_packed_weights_that_do_not_fit():
    p = pack(matrix(np.int8, 17, 9))
    with pytest.raises(ValueError, match="int8 and 768 bytes, expected int8 and 1536 bytes for shape \\[70, 9\\]"):
        K.PackedS8(PackedMatrix(p.data, (70, 9), np.zeros(70, np.int32)), 0)
    with pytest.raises(ValueError, match="row sums of shape \\[16\\], expected \\[17\\]"):
        K.PackedS8(PackedMatrix(p.data, (17, 9), p.row_sums[:16]), 0)
    f = pack(matrix(np.float32, 5, 3))
    with pytest.raises(ValueError, match="expected float16"):
        K.PackedFloat(f, True)
