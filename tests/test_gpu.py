"""The CUDA backend against the CPU backend, op by op and on whole models.

Every result must be bit-identical: integers, the floats of quantize,
dequantize and the linear ops, and the recurrent cells and whole sequences,
whose gates run the CPU's own sigmoid and tanh (qrt/kernels/gate_math.h,
compiled as device code). Tests that need a GPU skip with the reason when
CuPy or a GPU is missing; the error-message tests run everywhere.
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
from qrt.gpu import linear as gpu_linear
from qrt.ops import layer_prefix


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
    if request.param == "mma" and _MISSING is None and not gpu.runtime.has_mma():
        pytest.skip("this GPU has no integer mma.sync (sm_80+)")
    monkeypatch.setattr(gpu_linear, "GEMM_PATH", request.param)
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


def test_both_backends_implement_every_registered_op():
    """One registry (qrt/ops.py): every op runs on the CPU and on the GPU, nothing else does."""
    from qrt import cpu

    assert sorted(gpu.IMPLEMENTATIONS) == sorted(qrt.ops.OPS)
    assert sorted(cpu.IMPLEMENTATIONS) == sorted(qrt.ops.OPS)


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
    assert x.size > gpu.quantize.SMALL_QUANT
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


def _roundtrip_model(tmp_path, shape, dtype, axis, scale_dtype=np.float32):
    b = GraphBuilder()
    x = b.input("x", "float32", list(shape))
    zmax = {"quint8": (0, 255), "qint8": (-128, 127), "qint32": (-1000, 1000)}[dtype]
    if axis is None:
        qp = {"scale": np.float32(0.037), "zero_point": np.int32(sum(zmax) // 2 + 3)}
        q = b.node("quantize_per_tensor", {"x": x, **qp}, {"dtype": dtype})
    else:
        c = shape[axis]
        qp = {
            "scale": RNG.uniform(0.01, 0.2, c).astype(scale_dtype),
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


@needs_gpu
@pytest.mark.parametrize("dtype", ["quint8", "qint8", "qint32"])
def test_quantize_dequantize_float64_scales(tmp_path, dtype):
    """float64 per-channel scales (format version 2): the GPU gives the CPU's bits, which are torch's.

    x reaches 2**28 steps of its scale, so qint32 has |q - zp| > 2**24, where torch's float32 subtraction rounds.
    """
    shape = (3, 5, 11)
    path = _roundtrip_model(tmp_path, shape, dtype, 1, np.float64)
    x = (RNG.uniform(-1, 1, shape) * 2.0 ** RNG.integers(0, 29, shape) * 0.05).astype(np.float32)
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
    """20 steps, each from the CPU's state: bit-exact."""
    path = _rnn_model(tmp_path, n_in, hidden, act=act, fp16=fp16, wzp=wzp)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    h = RNG.normal(0, 0.5, (batch, hidden)).astype(np.float32)
    for _ in range(20):
        x = RNG.normal(0, 1, (batch, n_in)).astype(np.float32)
        want, got = cpu.run([x, h]), cuda.run([x, h])
        np.testing.assert_array_equal(got, want)
        h = want


# ---------------------------------------------------------------- LSTM / GRU cells, sequence layers

GATES = {"rnn": 1, "lstm": 4, "gru": 3}
RECURRENT_WEIGHTS = {"qint8": (False, False, False), "qint8_per_channel_wzp": (False, True, True),
                     "float16": (True, False, False)}


def _recurrent_ports(prefix: str, rows: int, k: int, weights: str) -> dict:
    """A dynamic weight set scaled so that gate pre-activations are O(1), not saturated."""
    fp16, per_channel, wzp = RECURRENT_WEIGHTS[weights]
    if fp16:
        ports = {"weight": RNG.normal(0, 1 / np.sqrt(max(k, 1)), (rows, k)).astype(np.float16)}
    else:
        ports = _int8_weight(rows, k, per_channel, wzp)
        ports["weight_scale"] = (ports["weight_scale"] / (0.6 * np.sqrt(max(k, 1)))).astype(np.float32)
    ports["bias"] = RNG.normal(0, 0.1, rows).astype(np.float32)
    return {f"{prefix}{name}": v for name, v in ports.items()}


def _cell_model(tmp_path, kind, n_in, hidden, weights):
    b = GraphBuilder()
    ports = {"x": b.input("x", "float32", [None, n_in]), "h": b.input("h", "float32", [None, hidden])}
    if kind == "lstm":
        ports["c"] = b.input("c", "float32", [None, hidden])
    for side, k in (("ih_", n_in), ("hh_", hidden)):
        ports.update(_recurrent_ports(side, GATES[kind] * hidden, k, weights))
    out = b.node(f"{kind}_cell_dynamic", ports)
    b.output(*(out if isinstance(out, tuple) else (out,)), as_tuple=kind == "lstm")
    path = tmp_path / "cell.qrt"
    b.save(path)
    return path


@needs_gpu
@pytest.mark.parametrize("weights", list(RECURRENT_WEIGHTS))
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("n_in,hidden", [(1, 1), (10, 20), (37, 129)])
def test_recurrent_cell_steps(tmp_path, kind, weights, n_in, hidden):
    """Several steps, each from the CPU's state: bit-exact."""
    path = _cell_model(tmp_path, kind, n_in, hidden, weights)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    for batch in (1, 5):
        h = RNG.normal(0, 0.5, (batch, hidden)).astype(np.float32)
        c = RNG.normal(0, 1.0, (batch, hidden)).astype(np.float32)
        for _ in range(6):
            x = RNG.normal(0, 1, (batch, n_in)).astype(np.float32)
            inputs = [x, h, c] if kind == "lstm" else [x, h]
            want, got = cpu.run(inputs), cuda.run(inputs)
            want, got = (want, got) if kind == "lstm" else ((want,), (got,))
            for g, w in zip(got, want):
                assert isinstance(g, np.ndarray) and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
            h, c = want[0], want[-1]


def _sequence_model(tmp_path, kind, n_in, hidden, layers, bidirectional, batch_first, states, weights, act="tanh"):
    b = GraphBuilder()
    dirs = 2 if bidirectional else 1
    ports = {"x": b.input("x", "float32", [None, None, n_in])}
    names = ("h", "c") if kind == "lstm" else ("h",)
    if states:
        for s in names:
            ports[f"{s}0"] = b.input(f"{s}0", "float32", [layers * dirs, None, hidden])
    for n in range(layers):
        for d in range(dirs):
            for side, k in (("ih_", n_in if n == 0 else dirs * hidden), ("hh_", hidden)):
                ports.update(_recurrent_ports(layer_prefix(n, d == 1) + side, GATES[kind] * hidden, k, weights))
    attrs = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first}
    if kind == "rnn":
        attrs["nonlinearity"] = act
    b.output(*b.node(f"{kind}_dynamic", ports, attrs))
    path = tmp_path / "seq.qrt"
    b.save(path)
    return path, names


def _sequence_inputs(kind, names, steps, batch, n_in, hidden, layers, dirs, batch_first, states):
    shape = (batch, steps, n_in) if batch_first else (steps, batch, n_in)
    inputs = {"x": RNG.normal(0, 1, shape).astype(np.float32)}
    if states:
        for s in names:
            inputs[f"{s}0"] = RNG.normal(0, 0.5, (layers * dirs, batch, hidden)).astype(np.float32)
    return inputs


SEQUENCE_KINDS = [("rnn", "tanh"), ("rnn", "relu"), ("lstm", None), ("gru", None)]


@needs_gpu
@pytest.mark.parametrize("weights", ["qint8_per_channel_wzp", "float16"])
@pytest.mark.parametrize("kind,act", SEQUENCE_KINDS, ids=["rnn_tanh", "rnn_relu", "lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("layers", [1, 2])
def test_sequence_layers(tmp_path, kind, act, weights, layers, bidirectional):
    """1 and 7 steps, with and without initial states, batch first or not: the CPU's bits."""
    n_in, hidden, batch, dirs = 11, 19, 3, 2 if bidirectional else 1
    for steps, batch_first, states in ((1, False, False), (7, True, True), (7, False, False), (1, True, True)):
        path, names = _sequence_model(tmp_path, kind, n_in, hidden, layers, bidirectional, batch_first, states,
                                      weights, act)
        inputs = _sequence_inputs(kind, names, steps, batch, n_in, hidden, layers, dirs, batch_first, states)
        want = qrt.load(path).run(inputs)
        got = qrt.load(path, device="cuda").run(inputs)
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(isinstance(g, np.ndarray) for g in got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


@needs_gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sequence_input_projection_under_each_gemm(tmp_path, gemm_path, kind):
    """T*B = 24 rows of input projection: GEMV and MMA give the CPU's bits."""
    path, names = _sequence_model(tmp_path, kind, 40, 33, 1, True, False, True, "qint8")
    inputs = _sequence_inputs(kind, names, 8, 3, 40, 33, 1, 2, False, True)
    want = qrt.load(path).run(inputs)
    got = qrt.load(path, device="cuda").run(inputs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@needs_gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_two_hundred_free_running_steps(tmp_path, kind):
    path, names = _sequence_model(tmp_path, kind, 16, 64, 1, False, False, False, "qint8")
    inputs = _sequence_inputs(kind, names, 200, 2, 16, 64, 1, 1, False, False)
    want = qrt.load(path).run(inputs)
    got = qrt.load(path, device="cuda").run(inputs)
    for g, w in zip(got, want):  # no drift: each step gives the CPU's bits
        np.testing.assert_array_equal(g, w)


@needs_gpu
def test_lstm_sequence_given_c0_alone(tmp_path):
    """c0 without h0: c starts at c0 and h at zeros (states taken by port, not by position), as on the CPU."""
    b = GraphBuilder()
    ports = {"x": b.input("x", "float32", [None, None, 6]), "c0": b.input("c0", "float32", [1, None, 9])}
    for side, k in (("ih_", 6), ("hh_", 9)):
        ports.update(_recurrent_ports(layer_prefix(0, False) + side, 4 * 9, k, "qint8"))
    b.output(*b.node("lstm_dynamic", ports, {"num_layers": 1, "bidirectional": False, "batch_first": False}))
    path = tmp_path / "c0.qrt"
    b.save(path)
    inputs = {"x": RNG.normal(0, 1, (5, 2, 6)).astype(np.float32),
              "c0": RNG.normal(0, 0.5, (1, 2, 9)).astype(np.float32)}
    want = qrt.load(path).run(inputs)
    got = qrt.load(path, device="cuda").run(inputs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@needs_gpu
def test_sequence_cupy_in_cupy_out_and_states_untouched(tmp_path):
    import cupy as cp

    path, names = _sequence_model(tmp_path, "lstm", 8, 16, 2, True, True, True, "qint8")
    inputs = _sequence_inputs("lstm", names, 5, 2, 8, 16, 2, 2, True, True)
    want = qrt.load(path).run(inputs)
    dev = {k: cp.asarray(v) for k, v in inputs.items()}
    got = qrt.load(path, device="cuda").run(dev)
    assert all(isinstance(g, cp.ndarray) for g in got)
    for k, v in inputs.items():  # the final states are new arrays, not the initial ones updated
        np.testing.assert_array_equal(cp.asnumpy(dev[k]), v)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(cp.asnumpy(g), w)


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


# ---------------------------------------------------------------- float math, tensor and embedding ops


def _op_model(tmp_path, op: str, ports: dict, attrs: dict | None = None, dtype: str = "float32") -> Path:
    """One node of op; ports maps port -> shape list (a run-time input named after the port) or array (stored)."""
    b = GraphBuilder()
    ins = {p: v if isinstance(v, np.ndarray) else b.input(p, dtype, v) for p, v in ports.items()}
    return _save(b, b.node(op, ins, attrs or {}, name="n"), tmp_path, f"{op}{len(list(tmp_path.iterdir()))}")


def _assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit (-0.0 and +0.0 differ), but any NaN matches any NaN: a GPU's NaN has one pattern."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    nan = np.isnan(want) if want.dtype.kind == "f" else np.zeros(want.shape, bool)
    assert np.array_equal(nan, np.isnan(got) if got.dtype.kind == "f" else nan)
    bits = np.dtype(f"u{want.dtype.itemsize}")
    g, w = got.view(bits)[~nan], want.view(bits)[~nan]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{bad.size} of {w.size} differ; first got {got[~nan][bad[0]]!r}, want {want[~nan][bad[0]]!r}"


def _compare(path: Path, inputs) -> None:
    want, got = _both(path, inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        _assert_same_bits(g, w)


def _values(shape: tuple, scale: float = 4.0) -> np.ndarray:
    """Normal values with large, small, subnormal, signed-zero and infinite ones spread through."""
    x = (RNG.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1)
    special = np.array([0.0, -0.0, 1e-40, -3e-39, 1e-30, 88.5, -88.5, 104.0, -104.0, 3e38, -3e38, np.inf,
                        -np.inf, 1e-7, -20.0, 20.0, 0.625, -0.625], np.float32)
    at = RNG.choice(flat.size, min(flat.size, special.size * 3), replace=False)
    flat[at] = np.resize(special, at.size)
    return x


UNARY_CASES = [("relu", {}), ("sigmoid", {}), ("tanh", {}), ("silu", {}), ("gelu", {}),
               ("gelu", {"approximate": "tanh"}), ("sqrt", {}), ("rsqrt", {}), ("log", {}),
               ("sin", {}), ("cos", {}), ("ceil", {}), ("floor", {})]


@needs_gpu
@pytest.mark.parametrize(("op", "attrs"), UNARY_CASES)
def test_float_unary_ops(tmp_path, op, attrs):
    """Every function over a dense grid (to the subnormals and past each formula switch), at odd sizes."""
    path = _op_model(tmp_path, op, {"x": [None, None]}, attrs)
    grid = np.concatenate([np.linspace(-120, 120, 200003), np.geomspace(1e-45, 1e3, 20000),
                           -np.geomspace(1e-45, 1e3, 20000), [np.nan, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    _compare(path, grid.reshape(1, -1))
    _compare(path, _values((3, 1037)))


BROADCASTS = [((3, 5, 7), (3, 5, 7)), ((3, 5, 7), (7,)), ((7,), (3, 5, 7)), ((3, 1, 7), (1, 5, 1)),
              ((1,), (4, 3)), ((2, 3, 1, 5), (3, 4, 1)), ((1, 1), (1, 1)), ((257, 1), (1, 300)),
              ((2, 1, 3, 1, 2, 1, 2, 1), (1, 2, 1, 3, 1, 2, 1, 2))]


@needs_gpu
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize(("sa", "sb"), BROADCASTS)
def test_float_binary_broadcasting(tmp_path, op, sa, sb):
    path = _op_model(tmp_path, op, {"a": list(sa), "b": list(sb)})
    a, b = _values(sa), _values(sb)
    _compare(path, [a, b])
    # subnormal and overflowing results: tiny times tiny, tiny over huge, huge over tiny
    _compare(path, [np.full(sa, 3e-20, np.float32), np.full(sb, -7e-20, np.float32)])
    _compare(path, [np.full(sa, 1e-30, np.float32), np.full(sb, 3e8, np.float32)])
    _compare(path, [np.full(sa, 3e38, np.float32), np.full(sb, 1e-3, np.float32)])


@needs_gpu
def test_float_binary_stored_operand_and_bad_shapes(tmp_path):
    path = _op_model(tmp_path, "mul", {"a": [None, 300], "b": _values((300,))})
    for batch in (1, 5):
        _compare(path, _values((batch, 300)))
    path = _op_model(tmp_path, "sub", {"a": [None, 3], "b": [None, 3]})
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    a, b = np.ones((2, 3), np.float32), np.ones((3, 3), np.float32)
    with pytest.raises(ValueError) as want:
        cpu.run([a, b])
    with pytest.raises(ValueError) as got:
        cuda.run([a, b])
    assert str(got.value) == str(want.value)


SOFTMAX_CASES = [((None, 1037), 1), ((None, 1), 1), ((None, 7, 5), 1), ((None, 600, 3), 1), ((None, 3, 513), 2),
                 ((None, 5, 2, 4), 0), ((None, 256), 1), ((None, 257, 1), 1)]


@needs_gpu
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("spec", "dim"), SOFTMAX_CASES)
def test_softmax(tmp_path, op, spec, dim):
    """Rows longer than the 256-element blocks, reduced dims that are and are not the last, batch 1 and more."""
    path = _op_model(tmp_path, op, {"x": list(spec)}, {"dim": dim})
    for batch in (1, 4):
        x = (RNG.standard_normal((batch, *spec[1:])) * 30).astype(np.float32)
        x.reshape(-1)[:: 11] = -np.inf  # exp gives 0, log_softmax -inf
        x.reshape(-1)[5 :: 13] = RNG.standard_normal(x.reshape(-1)[5 :: 13].size) * 1e-40
        _compare(path, x)


REDUCE_CASES = [((None, 517, 3), [1]), ((None, 517, 3), [0, 2]), ((None, 5, 300), [1, 2]), ((None, 5, 300), [2]),
                ((None, 7), [0, 1]), ((None, 2, 3, 129), [1, 3]), ((None, 4, 1030), [2]), ((None, 3, 0), [2])]


@needs_gpu
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize(("spec", "dims"), REDUCE_CASES)
def test_sum_mean(tmp_path, op, keepdim, spec, dims):
    path = _op_model(tmp_path, op, {"x": list(spec)}, {"dims": dims, "keepdim": keepdim})
    for batch in (1, 3):
        x = _values((batch, *spec[1:]))
        x[np.isinf(x)] = 1e30  # finite: inf - inf would make NaN
        _compare(path, x)
        _compare(path, (RNG.standard_normal(x.shape) * 1e-39).astype(np.float32))  # subnormal sums


@needs_gpu
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
@pytest.mark.parametrize(("spec", "k"), [((None, 1000), 1), ((None, 7), 1), ((None, 3, 5, 67), 2), ((None, 1), 1)])
def test_layer_norm(tmp_path, affine, spec, k):
    tail = tuple(spec[len(spec) - k :])
    ports: dict = {"x": list(spec)}
    if affine in ("weight", "both"):
        ports["weight"] = _values(tail, 2.0)
    if affine in ("bias", "both"):
        ports["bias"] = _values(tail, 2.0)
    for p in ("weight", "bias"):
        if p in ports:
            ports[p][~np.isfinite(ports[p])] = 1.5
    path = _op_model(tmp_path, "layer_norm", ports, {"normalized_dims": k, "eps": 1e-5})
    for batch in (1, 6):
        x = (RNG.standard_normal((batch, *spec[1:])) * RNG.choice([1e-3, 1.0, 1e4])).astype(np.float32)
        x.reshape(-1)[::17] = 1e-40
        _compare(path, x)


@needs_gpu
@pytest.mark.parametrize("spec", [(None, 37), (None, 1), (None, 5, 67), (None, 3, 4, 5)])
def test_batch_norm(tmp_path, spec):
    """Channels alone ([batch, C]) and with positions after them; subnormal inputs and terms (no flush to zero)."""
    channels = spec[1]
    var = np.abs(_values((channels,), 2.0))
    var[~np.isfinite(var)] = 0.5
    ports: dict = {"x": list(spec), "var": var}
    for p in ("mean", "weight", "bias"):
        ports[p] = _values((channels,), 2.0)
        ports[p][~np.isfinite(ports[p])] = 1.5
    ports["bias"][::3] = 1e-40
    path = _op_model(tmp_path, "batch_norm", ports, {"eps": 1e-5})
    for batch in (1, 6):
        x = (RNG.standard_normal((batch, *spec[1:])) * RNG.choice([1e-3, 1.0, 1e4])).astype(np.float32)
        x.reshape(-1)[::17] = 1e-40
        _compare(path, x)


TENSOR_CASES = [
    ("select", {"dim": 1, "index": -1}, [None, 3, 5]),
    ("select", {"dim": 2, "index": 2}, [None, 3, 5]),
    ("slice", {"dim": 1, "start": 1, "end": None, "step": 2}, [None, 7, 5]),
    ("slice", {"dim": 2, "start": -4, "end": -1, "step": 1}, [None, 7, 5]),
    ("reshape", {"shape": [0, 5, -1]}, [None, 3, 5]),
    ("permute", {"perm": [2, 0, 1]}, [None, 3, 5]),
    ("squeeze", {"dims": [1]}, [None, 1, 5]),
    ("unsqueeze", {"dim": 1}, [None, 3, 5]),
    ("flatten", {"start_dim": 0, "end_dim": 2}, [None, 3, 5]),
]


@needs_gpu
@pytest.mark.parametrize(("op", "attrs", "spec"), TENSOR_CASES)
def test_tensor_ops(tmp_path, op, attrs, spec):
    """Moves of bits: NaN payloads and -0.0 kept."""
    path = _op_model(tmp_path, op, {"x": spec}, attrs)
    for batch in (1, 4):
        x = _values((batch, *spec[1:]))
        x.reshape(-1)[0] = np.array(0x7FC01234, np.uint32).view(np.float32)
        want, got = _both(path, x)
        assert got.flags.c_contiguous and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@needs_gpu
@pytest.mark.parametrize("op", ["cat", "stack"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat_stack(tmp_path, op, dim):
    sizes = (2, 5, 1) if op == "cat" else (3, 3, 3)
    specs = {f"x{i}": [None, 3, 4] if op == "stack" or dim == 0 else
             ([None, s, 4] if dim == 1 else [None, 3, s]) for i, s in enumerate(sizes)}
    path = _op_model(tmp_path, op, specs, {"dim": dim})
    batches = (1, 2, 3) if op == "cat" and dim == 0 else (2, 2, 2)
    xs = [_values((b, *[s if s is not None else 0 for s in spec[1:]]))
          for b, spec in zip(batches, specs.values())]
    want, got = _both(path, xs)
    assert got.tobytes() == want.tobytes() and got.shape == want.shape
    if op == "stack":  # shapes that disagree: the CPU's message
        bad = [xs[0], xs[1][:1], xs[2]]
        with pytest.raises(ValueError) as w:
            qrt.load(path).run(bad)
        with pytest.raises(ValueError) as g:
            qrt.load(path, device="cuda").run(bad)
        assert str(g.value) == str(w.value)


def _embedding_table(bits: int, num: int, dim: int) -> tuple[dict, dict]:
    if bits == 32:
        w = _values((num, dim))
        w[~np.isfinite(w)] = 2.0
        return {"weight": w}, {}
    width = dim if bits == 8 else (dim + 1) // 2
    dtype = np.float32 if bits == 8 else np.float16
    table = {"weight": RNG.integers(0, 256, (num, width), dtype=np.uint8),
             "weight_scale": RNG.uniform(1e-3, 0.5, num).astype(dtype),
             "weight_bias": RNG.uniform(-3, 3, num).astype(dtype)}
    return table, {"bits": bits, "dim": dim} if bits == 4 else {"bits": bits}


@needs_gpu
@pytest.mark.parametrize("bits", [32, 8, 4])
@pytest.mark.parametrize("dim", [1, 7, 300])
def test_embedding(tmp_path, bits, dim):
    table, attrs = _embedding_table(bits, 23, dim)
    b = GraphBuilder()
    y = b.node("embedding", {"indices": b.input("indices", "int64", [None, 3]), **table}, attrs, name="e")
    path = _save(b, y, tmp_path)
    for batch in (1, 5):
        _compare(path, RNG.integers(0, 23, (batch, 3)))


@needs_gpu
@pytest.mark.parametrize("bits", [32, 8, 4])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dim", [3, 301])
def test_embedding_bag(tmp_path, bits, mode, dim):
    """Bags with offsets (an empty one, a long one, the last to the end) and as rows of a 2-D input."""
    table, attrs = _embedding_table(bits, 23, dim)
    attrs = {**attrs, "mode": mode}
    b = GraphBuilder()
    y = b.node("embedding_bag", {"indices": b.input("indices", "int32", [None]),
                                 "offsets": b.input("offsets", "int64", [None]), **table}, attrs, name="e")
    path = _save(b, y, tmp_path, "offsets")
    _compare(path, [RNG.integers(0, 23, 40).astype(np.int32), np.array([0, 3, 3, 10, 11, 25])])
    _compare(path, [RNG.integers(0, 23, 4).astype(np.int32), np.array([0])])
    b = GraphBuilder()
    y = b.node("embedding_bag", {"indices": b.input("indices", "int64", [None, 5]), **table}, attrs, name="e")
    path = _save(b, y, tmp_path, "rows")
    for batch in (1, 6):
        _compare(path, RNG.integers(0, 23, (batch, 5)))


BAD_BAGS = [([3, 0, 1, 99, 2, -1], [0, 2]), ([3, 0, 1], [1, 2]), ([3, 0, 1, 2], [0, 3, 2]), ([3, 0, 1], [0, 1, 9])]


@needs_gpu
@pytest.mark.parametrize(("indices", "offsets"), BAD_BAGS)
def test_embedding_bad_indices_and_offsets(tmp_path, indices, offsets):
    """Out-of-range indices and bad offsets raise the CPU's ValueError, node named, and read no row."""
    table, attrs = _embedding_table(8, 23, 4)
    b = GraphBuilder()
    y = b.node("embedding_bag", {"indices": b.input("indices", "int64", [None]),
                                 "offsets": b.input("offsets", "int64", [None]), **table}, attrs, name="e")
    path = _save(b, y, tmp_path)
    args = [np.array(indices), np.array(offsets)]
    with pytest.raises(ValueError) as want:
        qrt.load(path).run(args)
    with pytest.raises(ValueError) as got:
        qrt.load(path, device="cuda").run(args)
    assert str(got.value) == str(want.value)
    b = GraphBuilder()
    y = b.node("embedding", {"indices": b.input("indices", "int64", [None]), **table}, attrs, name="e")
    path = _save(b, y, tmp_path, "rows")
    if max(indices) >= 23:
        with pytest.raises(ValueError) as want:
            qrt.load(path).run(np.array(indices))
        with pytest.raises(ValueError) as got:
            qrt.load(path, device="cuda").run(np.array(indices))
        assert str(got.value) == str(want.value)


@needs_gpu
@pytest.mark.parametrize("k, n, rows", [(37, 29, 1), (300, 70, 5), (64, 128, 64)])
def test_per_row_symmetric_linear_matches_cpu(tmp_path, k, n, rows):
    """linear_dynamic with activation per_row_symmetric (torchao's Int8Tensor linear): the CPU's bits,
    a zero row (scale at the 2^-23 floor) included."""
    w = RNG.integers(-127, 128, (n, k)).astype(np.int8)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, k])
    ports = {"x": x, "weight": w, "weight_scale": (RNG.random(n) * 0.01).astype(np.float32),
             "weight_zero_point": np.zeros(n, np.int32), "bias": RNG.standard_normal(n).astype(np.float32)}
    g.output(g.node("linear_dynamic", ports, {"reduce_range": False, "activation": "per_row_symmetric"}))
    g.save(tmp_path / "m.qrt")
    xs = (RNG.standard_normal((rows, k)) * 3).astype(np.float32)
    xs[0, : k // 2] = 0
    if rows > 1:
        xs[1] = 0
    expected = qrt.run(tmp_path / "m.qrt", {"x": xs})
    np.testing.assert_array_equal(qrt.load(tmp_path / "m.qrt", device="cuda").run({"x": xs}), expected)
