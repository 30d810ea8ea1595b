"""The CUDA backend against the CPU backend, op by op and on whole models.

Integers and the floats of quantize, dequantize and the linear ops must be
bit-identical; RNN cells with tanh agree within 3e-7 per step (the GPU's
tanhf is not the CPU's), with relu bit-identical. Tests that need a GPU skip
with the reason when CuPy or a GPU is missing; the error-message tests run
everywhere.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import qrt
from qrt import gpu
from qrt.builder import GraphBuilder


def _gpu_missing() -> str | None:
    try:
        gpu.require_cuda()
    except gpu.CUDAUnavailableError as e:
        return str(e)
    return None


_MISSING = _gpu_missing()
needs_gpu = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")
RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------- model builders


def _int8_weight(n: int, k: int, per_channel: bool, wzp: bool) -> dict:
    w = RNG.integers(-128, 128, (n, k), dtype=np.int8)
    shape = (n,) if per_channel else ()
    scale = RNG.uniform(0.001, 0.05, shape).astype(np.float32)
    zp = (RNG.integers(-5, 6, shape) if wzp else np.zeros(shape)).astype(np.int32)
    return {"weight": w, "weight_scale": scale, "weight_zero_point": zp}


def _save(b: GraphBuilder, out: str, tmp_path: Path, name: str = "m") -> Path:
    b.output(out)
    path = tmp_path / f"{name}.qrt"
    b.save(path)
    return path


def _dynamic_model(tmp_path, k, n, *, fp16=False, per_channel=False, wzp=False, bias=True, rr=True, rank=2):
    b = GraphBuilder()
    x = b.input("x", "float32", [None] * (rank - 1) + [k])
    if fp16:
        ports = {"weight": RNG.normal(0, 0.1, (n, k)).astype(np.float16)}
    else:
        ports = _int8_weight(n, k, per_channel, wzp)
    if bias:
        ports["bias"] = RNG.normal(0, 1, n).astype(np.float32)
    y = b.node("linear_dynamic", {"x": x, **ports}, {"reduce_range": rr})
    return _save(b, y, tmp_path)


def _static_model(tmp_path, k, n, *, per_channel=False, wzp=False, bias=True, relu=False):
    b = GraphBuilder()
    x = b.input("x", "uint8", [None, k])
    ports = _int8_weight(n, k, per_channel, wzp)
    ports.update(
        x_scale=np.float32(0.02), x_zero_point=np.int32(131), y_scale=np.float32(0.7), y_zero_point=np.int32(97)
    )
    if bias:
        ports["bias"] = RNG.normal(0, 20, n).astype(np.float32)
    y = b.node("linear", {"x": x, **ports}, {"relu": relu})
    return _save(b, y, tmp_path)


def _rnn_model(tmp_path, n_in, hidden, *, act="tanh", fp16=False, wzp=False):
    b = GraphBuilder()
    x = b.input("x", "float32", [None, n_in])
    h = b.input("h", "float32", [None, hidden])
    ports = {}
    for prefix, k in (("ih_", n_in), ("hh_", hidden)):
        if fp16:
            ports[f"{prefix}weight"] = RNG.normal(0, 0.1, (hidden, k)).astype(np.float16)
        else:
            ports.update({f"{prefix}{p}": v for p, v in _int8_weight(hidden, k, True, wzp).items()})
        ports[f"{prefix}bias"] = RNG.normal(0, 0.1, hidden).astype(np.float32)
    y = b.node("rnn_cell_dynamic", {"x": x, "h": h, **ports}, {"nonlinearity": act})
    return _save(b, y, tmp_path)


def _both(path, inputs):
    """(cpu output, gpu output as numpy) for the same inputs."""
    want = qrt.load(path).run(inputs)
    got = qrt.load(path, device="cuda").run(inputs)
    assert isinstance(got, np.ndarray), "numpy inputs must give numpy outputs"
    return want, got


@pytest.fixture(params=["gemv", "mma"])
def gemm_path(request, monkeypatch):
    """Run a test under each GEMM kernel, forced whatever the batch size."""
    if request.param == "mma" and _MISSING is None and not gpu._has_mma():
        pytest.skip("this GPU has no integer mma.sync (sm_80+)")
    monkeypatch.setattr(gpu, "GEMM_PATH", request.param)
    return request.param


# ---------------------------------------------------------------- without a GPU


def _tiny_model(tmp_path) -> Path:
    return _dynamic_model(tmp_path, 4, 3)


def test_import_qrt_does_not_import_cupy():
    code = "import qrt, qrt.gpu, sys; assert 'cupy' not in sys.modules, 'cupy imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_error_names_missing_cupy(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(gpu.CUDAUnavailableError, match="needs CuPy, which is not installed"):
        qrt.load(_tiny_model(tmp_path), device="cuda")


def _fake_cupy(get_device_count) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count))
    return cupy


def test_error_names_missing_driver(tmp_path, monkeypatch):
    def fail():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(fail))
    with pytest.raises(gpu.CUDAUnavailableError, match="no usable NVIDIA driver"):
        qrt.run(_tiny_model(tmp_path), np.zeros((1, 4), np.float32), device="cuda")


@pytest.mark.parametrize(
    "count", [lambda: 0, lambda: (_ for _ in ()).throw(RuntimeError("cudaErrorNoDevice: no CUDA-capable device"))]
)
def test_error_names_missing_gpu(tmp_path, monkeypatch, count):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count))
    with pytest.raises(gpu.CUDAUnavailableError, match="no NVIDIA GPU found"):
        qrt.load(_tiny_model(tmp_path), device="cuda")


def test_unknown_device_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        qrt.load(_tiny_model(tmp_path), device="tpu")


def test_backend_covers_every_op():
    assert set(gpu.IMPLEMENTATIONS) == set(qrt.ops.OPS)


# ---------------------------------------------------------------- dynamic linear


SHAPES = [(1, 37, 19), (2, 64, 130), (5, 1000, 33), (8, 4, 1), (17, 100, 257), (130, 300, 70)]


@needs_gpu
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("per_channel,wzp,bias", [(False, False, True), (True, False, False), (True, True, True)])
def test_dynamic_linear_int8(tmp_path, gemm_path, m, k, n, per_channel, wzp, bias):
    path = _dynamic_model(tmp_path, k, n, per_channel=per_channel, wzp=wzp, bias=bias)
    x = RNG.normal(0.3, 2.0, (m, k)).astype(np.float32)
    np.testing.assert_array_equal(*_both(path, x))


@needs_gpu
@pytest.mark.parametrize("rr", [True, False])
@pytest.mark.parametrize(
    "x",
    [
        np.zeros((3, 50), np.float32),  # scale falls back to 0.1
        np.full((3, 50), 1e-7, np.float32),  # tiny positive range: scale clamped, max rewritten
        -np.full((3, 50), 1e-7, np.float32),
        np.linspace(-1e-6, 2e-6, 150, dtype=np.float32).reshape(3, 50),  # both rescaled by 6.1e-5 / scale
        np.linspace(0.5, 9.0, 150, dtype=np.float32).reshape(3, 50),  # all positive: min extended to 0
        np.linspace(-9.0, -0.5, 150, dtype=np.float32).reshape(3, 50),
    ],
)
def test_dynamic_linear_qparams_edges(tmp_path, rr, x):
    path = _dynamic_model(tmp_path, 50, 21, per_channel=True, rr=rr)
    np.testing.assert_array_equal(*_both(path, x))


@needs_gpu
def test_dynamic_linear_large_input_and_rank3(tmp_path, gemm_path):
    # 240 * 700 values: more than one block quantizes (dq_partial + dq_finish)
    path = _dynamic_model(tmp_path, 700, 45, rank=3)
    x = RNG.normal(0, 3, (4, 60, 700)).astype(np.float32)
    assert x.size > gpu.SMALL_QUANT
    np.testing.assert_array_equal(*_both(path, x))


@needs_gpu
@pytest.mark.parametrize("m,k,n", [(1, 37, 19), (3, 512, 64), (4, 1100, 70), (33, 1537, 32), (2, 2000, 95)])
@pytest.mark.parametrize("bias", [True, False])
def test_dynamic_linear_fp16(tmp_path, m, k, n, bias):
    # k > 512 with n % 32 != 0 exercises the restarted chain in the tail columns
    path = _dynamic_model(tmp_path, k, n, fp16=True, bias=bias)
    x = RNG.normal(0, 1, (m, k)).astype(np.float32)
    np.testing.assert_array_equal(*_both(path, x))


@needs_gpu
def test_nan_input_gives_nan_outputs(tmp_path):
    """The GPU cannot raise without a synchronisation: NaN in, NaN out."""
    path = _dynamic_model(tmp_path, 8, 5)
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.nan
    y = qrt.load(path, device="cuda").run(x)
    assert np.isnan(y).all()


# ---------------------------------------------------------------- static linear


@needs_gpu
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize(
    "per_channel,wzp,bias,relu",
    [(False, False, True, False), (True, False, True, True), (False, True, False, True), (True, True, True, False)],
)
def test_static_linear(tmp_path, gemm_path, m, k, n, per_channel, wzp, bias, relu):
    path = _static_model(tmp_path, k, n, per_channel=per_channel, wzp=wzp, bias=bias, relu=relu)
    x = RNG.integers(0, 256, (m, k), dtype=np.uint8)
    np.testing.assert_array_equal(*_both(path, x))


# ---------------------------------------------------------------- quantize / dequantize


def _roundtrip_model(tmp_path, shape, dtype, axis):
    b = GraphBuilder()
    x = b.input("x", "float32", list(shape))
    zmax = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-1000, 1000)}[dtype]
    if axis is None:
        qp = {"scale": np.float32(0.037), "zero_point": np.int32(sum(zmax) // 2 + 3)}
        q = b.node("quantize_per_tensor", {"x": x, **qp}, {"dtype": dtype})
    else:
        c = shape[axis]
        qp = {
            "scale": RNG.uniform(0.01, 0.2, c).astype(np.float32),
            "zero_point": RNG.integers(zmax[0], zmax[1] + 1, c).astype(np.int32),
        }
        q = b.node("quantize_per_channel", {"x": x, **qp}, {"dtype": dtype, "axis": axis})
    y = b.node("dequantize", {"x": q, **{k: v.copy() for k, v in qp.items()}}, {"axis": axis})
    b.output(q, y)
    path = tmp_path / "q.qrt"
    b.save(path)
    return path


@needs_gpu
@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
@pytest.mark.parametrize("shape,axis", [((7, 13), None), ((1,), None), ((3, 5, 11), 1), ((6, 4), 0), ((2, 3, 9), 2)])
def test_quantize_dequantize(tmp_path, dtype, shape, axis):
    path = _roundtrip_model(tmp_path, shape, dtype, axis)
    x = RNG.normal(0, 8, shape).astype(np.float32)
    x.flat[0] = 1e12  # saturates every dtype
    want, got = _both_tuple(path, x)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def _both_tuple(path, x):
    want = qrt.load(path).run(x)
    got = qrt.load(path, device="cuda").run(x)
    assert all(isinstance(g, np.ndarray) for g in got)
    return want, got


@needs_gpu
def test_quantize_ties_and_zero_point_rules(tmp_path):
    # x / scale lands exactly on .5 for many values: Q1 (fma) and Q2 (two roundings) differ here
    for axis in (None, 0):
        path = _roundtrip_model(tmp_path, (4, 64), "quint8", axis)
        x = (np.arange(256, dtype=np.float32).reshape(4, 64) - 128) * np.float32(0.0185)
        want, got = _both_tuple(path, x)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------- RNN cell


@needs_gpu
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("n_in,hidden", [(10, 20), (37, 256), (300, 129)])
@pytest.mark.parametrize("act,fp16,wzp", [("tanh", False, False), ("relu", False, True), ("tanh", True, False)])
def test_rnn_cell_steps(tmp_path, batch, n_in, hidden, act, fp16, wzp):
    """20 steps, each from the CPU's state: bit-exact with relu, <= 3e-7 with tanh."""
    path = _rnn_model(tmp_path, n_in, hidden, act=act, fp16=fp16, wzp=wzp)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    h = RNG.normal(0, 0.5, (batch, hidden)).astype(np.float32)
    for _ in range(20):
        x = RNG.normal(0, 1, (batch, n_in)).astype(np.float32)
        want, got = cpu.run([x, h]), cuda.run([x, h])
        if act == "relu":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=3e-7)
        h = want


# ---------------------------------------------------------------- whole models, array libraries


def _mlp(tmp_path) -> Path:
    """quantize -> static linear+relu -> dequantize -> dynamic linear -> relu -> add -> flatten."""
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 4, 24])
    q = b.node("quantize_per_tensor", {"x": x, "scale": np.float32(0.05), "zero_point": np.int32(120)},
               {"dtype": "quint8"})
    s = _int8_weight(40, 24, True, False)
    s.update(x_scale=np.float32(0.05), x_zero_point=np.int32(120), y_scale=np.float32(0.3),
             y_zero_point=np.int32(7), bias=RNG.normal(0, 1, 40).astype(np.float32))
    q2 = b.node("linear", {"x": q, **s}, {"relu": True})
    f = b.node("dequantize", {"x": q2, "scale": np.float32(0.3), "zero_point": np.int32(7)})
    d = b.node("linear_dynamic", {"x": f, **_int8_weight(24, 40, False, False),
                                  "bias": RNG.normal(0, 1, 24).astype(np.float32)})
    r = b.node("relu", {"x": d})
    a = b.node("add", {"a": r, "b": x})
    y = b.node("flatten", {"x": a}, {"start_dim": 1})
    return _save(b, y, tmp_path, "mlp")


@needs_gpu
@pytest.mark.parametrize("batch", [1, 9])
def test_whole_model_numpy_and_cupy(tmp_path, batch):
    import cupy as cp

    path = _mlp(tmp_path)
    x = RNG.normal(0, 2, (batch, 4, 24)).astype(np.float32)
    want, got = _both(path, x)
    np.testing.assert_array_equal(got, want)
    model = qrt.load(path, device="cuda")
    got_cp = model.run(cp.asarray(x))
    assert isinstance(got_cp, cp.ndarray), "cupy inputs must give cupy outputs"
    np.testing.assert_array_equal(cp.asnumpy(got_cp), want)
    with pytest.raises(ValueError, match="dtype"):
        model.run(cp.asarray(x, dtype=cp.float64))


@needs_gpu
def test_cupy_rnn_loop_matches_numpy(tmp_path):
    import cupy as cp

    path = _rnn_model(tmp_path, 16, 64, act="relu")
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    h_np = np.zeros((2, 64), np.float32)
    h_cp = cp.asarray(h_np)
    for _ in range(10):
        x = RNG.normal(0, 1, (2, 16)).astype(np.float32)
        h_np = cpu.run([x, h_np])
        h_cp = cuda.run([cp.asarray(x), h_cp])
    np.testing.assert_array_equal(cp.asnumpy(h_cp), h_np)
