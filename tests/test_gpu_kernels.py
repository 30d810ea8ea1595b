"""gemv_dynamic.cu against the CPU backend and the other GPU paths, bit for bit (issue 34).

The fused dynamic linear (gemv_dq: range, quantization and GEMV in one kernel) and the GEMV over a
quantized x in shared memory (gemv_q, float and requantizing epilogues) must give the CPU's bits at
sizes off every tile and vector width, with and without weight zero points, per-tensor and per-channel
scales, bias or not, reduce_range or not; GEMM_PATH forces each path so that all of them are compared
with the CPU on the same inputs. NaN in the input gives NaN out, as on the other GPU paths.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import RNG, _both, _int8_weight, _save, _static_model, needs_gpu

import qrt
from qrt import gpu
from qrt.builder import GraphBuilder
from qrt.gpu import linear as gpu_linear

PATHS = ["fused", "gemv_q", "gemv", "mma"]


def _dynamic(tmp_path, k, n, per_channel, wzp, bias, rr):
    """A one-node dynamic linear model and its constants (for the layer on its own)."""
    ports = _int8_weight(n, k, per_channel, wzp)
    if bias:
        ports["bias"] = RNG.normal(0, 1, n).astype(np.float32)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, k])
    return _save(b, b.node("linear_dynamic", {"x": x, **ports}, {"reduce_range": rr}), tmp_path), ports


def _inputs(m, k):
    """Inputs of m rows: normal, all equal, all zero, huge magnitudes, all positive."""
    return [
        RNG.normal(0.3, 2.0, (m, k)).astype(np.float32),
        np.full((m, k), -1.75, np.float32),
        np.zeros((m, k), np.float32),
        (RNG.uniform(-1, 1, (m, k)) * 3e38).astype(np.float32),
        RNG.uniform(0.5, 9.0, (m, k)).astype(np.float32),
    ]


def _layer_outputs(layer, x, monkeypatch, paths=PATHS):
    """{path: the layer's output for x with GEMM_PATH forced to path}."""
    cp = gpu.runtime.cupy()
    out = {}
    for path in paths:
        monkeypatch.setattr(gpu_linear, "GEMM_PATH", path)
        out[path] = cp.asnumpy(layer(cp.asarray(x)))
    return out


# per_channel, wzp, bias, reduce_range: each flag both ways
VARIANTS = [(False, False, True, True), (True, True, False, False), (True, False, True, False),
            (False, True, False, True)]


@needs_gpu
@pytest.mark.parametrize("k", [1, 5, 64, 1000, 4097])
@pytest.mark.parametrize("n", [1, 7, 129, 4096])
@pytest.mark.parametrize("per_channel,wzp,bias,rr", VARIANTS)
def test_every_path_matches_cpu(tmp_path, monkeypatch, k, n, per_channel, wzp, bias, rr):
    path, ports = _dynamic(tmp_path, k, n, per_channel, wzp, bias, rr)
    cpu = qrt.load(path)
    layer = gpu_linear.dynamic_linear(ports, rr)
    for m in range(1, 9):
        inputs = _inputs(m, k) if n <= 129 else _inputs(m, k)[:1]  # the edge inputs at the small sizes
        for x in inputs:
            want = cpu.run(x)
            for p, got in _layer_outputs(layer, x, monkeypatch).items():
                np.testing.assert_array_equal(got, want, err_msg=f"path {p}, m={m}")


@needs_gpu
@pytest.mark.parametrize("m", [9, 17])
def test_fused_falls_back_above_eight_rows(tmp_path, monkeypatch, m):
    path, ports = _dynamic(tmp_path, 300, 70, True, True, True, True)
    x = RNG.normal(0, 1, (m, 300)).astype(np.float32)
    got = _layer_outputs(gpu_linear.dynamic_linear(ports, True), x, monkeypatch, ["fused"])["fused"]
    np.testing.assert_array_equal(got, qrt.load(path).run(x))


@needs_gpu
@pytest.mark.parametrize("k", [7000, 20000])  # q_x of 8 rows: 56 KB (opted in above 48 KB), 160 KB (old gemv)
def test_large_inner_size(tmp_path, monkeypatch, k):
    path, ports = _dynamic(tmp_path, k, 33, True, True, True, True)
    layer, cpu = gpu_linear.dynamic_linear(ports, True), qrt.load(path)
    for m in (1, 8):
        x = RNG.normal(0, 1, (m, k)).astype(np.float32)
        for p, got in _layer_outputs(layer, x, monkeypatch).items():
            np.testing.assert_array_equal(got, cpu.run(x), err_msg=f"path {p}, m={m}")


@needs_gpu
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_fused_reads_unaligned_rows(tmp_path, monkeypatch, offset):
    """x a slice of a larger buffer, 16-byte aligned or not (a time step of a sequence): the range must
    take the scalar head before the first 16-byte boundary and the scalar tail."""
    cp = gpu.runtime.cupy()
    m, k = 3, 37
    path, ports = _dynamic(tmp_path, k, 20, False, False, True, True)
    flat = RNG.normal(0, 1, m * k + offset).astype(np.float32)
    flat[offset] = 40.0  # the maximum first (in the head unless aligned), the minimum last (in the tail)
    flat[-1] = -30.0
    x = cp.asarray(flat)[offset:].reshape(m, k)
    assert (x.data.ptr % 16 == 0) == (offset == 0) and x.flags.c_contiguous
    monkeypatch.setattr(gpu_linear, "GEMM_PATH", "fused")
    got = cp.asnumpy(gpu_linear.dynamic_linear(ports, True)(x))
    np.testing.assert_array_equal(got, qrt.load(path).run(flat[offset:].reshape(m, k)))


@needs_gpu
@pytest.mark.parametrize("m", [1, 4, 8])
def test_nan_input_gives_nan_outputs_on_every_path(tmp_path, monkeypatch, m):
    _, ports = _dynamic(tmp_path, 100, 9, True, True, True, True)
    x = np.ones((m, 100), np.float32)
    x[m - 1, 57] = np.nan
    for p, got in _layer_outputs(gpu_linear.dynamic_linear(ports, True), x, monkeypatch).items():
        assert np.isnan(got).all(), p


@needs_gpu
@pytest.mark.parametrize("path", [None, "fused", "gemv_q"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_whole_model_in_a_cuda_graph(tmp_path, monkeypatch, path, m):
    """The model's steps captured in its CUDA graph (qrt/gpu/plan.py) under each path."""
    monkeypatch.setattr(gpu_linear, "GEMM_PATH", path)
    model, _ = _dynamic(tmp_path, 515, 260, True, True, True, True)
    np.testing.assert_array_equal(*_both(model, RNG.normal(0, 1, (m, 515)).astype(np.float32)))


@needs_gpu
@pytest.mark.parametrize("m", range(1, 9))
@pytest.mark.parametrize("k,n", [(5, 7), (1000, 129), (4097, 300)])
@pytest.mark.parametrize("per_channel,wzp,bias,relu", [(False, False, True, False), (True, True, True, True),
                                                       (False, True, False, True)])
def test_static_linear_gemv_q(tmp_path, monkeypatch, m, k, n, per_channel, wzp, bias, relu):
    """gemv_q's requantizing epilogue (the automatic choice for m <= 8) against the CPU."""
    monkeypatch.setattr(gpu_linear, "GEMM_PATH", "gemv_q")
    model = _static_model(tmp_path, k, n, per_channel=per_channel, wzp=wzp, bias=bias, relu=relu)
    np.testing.assert_array_equal(*_both(model, RNG.integers(0, 256, (m, k), dtype=np.uint8)))
