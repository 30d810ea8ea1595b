"""engine="qnnpack": torch's qnnpack numerics (docs/NUMERICS.md section 9) against torch run with
torch.backends.quantized.engine = "qnnpack", and the x86 engine beside it in the same models.

Tolerances:
- dynamic Linear, static Linear (+ReLU), relu RNN cells: bit for bit. qnnpack's products are exact
  (no int16 pair saturation on any CPU) and its float steps are the same on x86 and ARM; the one
  CPU-dependent corner, a requantized value past 2^31, is tested against the scalar oracle only.
- tanh RNN, LSTM and GRU cells, one step from the same state: 3e-7 absolute (torch's tanh and
  sigmoid are not correctly rounded, as under the x86 engine: test_ops_rnn.py).
- whole sequences, free running: 2e-2 (a last-bit difference in h can move the next step's
  activation parameters and flip one rounding, as under the x86 engine: test_convert_recurrent.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from qrt_testing import cell_model_file, dynamic_linear_file, qparams, quantized_copy

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from qrt.errors import FormatError

RUNNABLE = [name for name, ok in K.kernel_variants().items() if ok]
SIZES = [(1, 1), (7, 5), (33, 17), (100, 31), (257, 65)]  # (in_features, out_features), odd on purpose
BATCHES = (1, 3, 40)
f32 = np.float32


@pytest.fixture
def qnnpack() -> Iterator[None]:
    """torch's quantized engine set to qnnpack for the test (its prepacks and kernels follow it)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def _arm_quantize(x: np.ndarray, scale: float, zero_point: int, lo: int = 0, hi: int = 255) -> np.ndarray:
    """torch's quantization on aarch64 (NUMERICS.md section 9): rne(fl(x * fl(1 / s))), then the zero point."""
    return np.clip(np.rint(x * (f32(1) / f32(scale))).astype(np.float64) + zero_point, lo, hi).astype(np.int64)


def _off_ties(x: np.ndarray) -> np.ndarray:
    """x with each value that x86 torch and ARM torch quantize differently (near a rounding tie of its dynamic
    activation parameters, about 1 value in 10^5) moved one float towards 0, until none is left: there torch's
    qnnpack on this x86 machine gives ARM's results, which the files reproduce (ties: test_arm_torch_*)."""
    x = x.copy()
    s_x, zp_x = torch._choose_qparams_per_tensor(torch.from_numpy(x), False)
    while True:
        x86 = torch.quantize_per_tensor(torch.from_numpy(x), s_x, zp_x, torch.quint8).int_repr().numpy()
        apart = x86 != _arm_quantize(x, s_x, zp_x)
        if not apart.any():
            return x
        assert not np.isin(x[apart], (x.min(), x.max())).any()  # the range, and so the parameters, stay
        x[apart] = np.nextafter(x[apart], f32(0))


def _dynamic_oracle(x: np.ndarray, w: np.ndarray, w_scale, w_zp, bias) -> np.ndarray:
    """qnnpack's dynamic Linear, step by step (NUMERICS.md): activation parameters over 0..255 (torch's own
    choice), x quantized as torch on ARM quantizes, the exact product, then fl(fl(acc) * fl(s_x * s_w)) + bias."""
    s_x, zp_x = torch._choose_qparams_per_tensor(torch.from_numpy(x), False)
    q = _arm_quantize(x, s_x, zp_x)
    acc = (q.astype(np.int64) - zp_x) @ (w.astype(np.int64) - np.asarray(w_zp).reshape(-1, 1)).T
    m = (np.asarray(w_scale, f32) * f32(s_x)).astype(f32)
    y = (acc.astype(f32) * m).astype(f32)
    return y if bias is None else (y + bias).astype(f32)


def _static_oracle(acc: np.ndarray, x_scale: float, w_scale, bias, y_scale: float, y_zp: int, relu: bool) -> np.ndarray:
    """qnnpack's static requantization (NUMERICS.md): int32 bias rne(fl(b * fl(1 / a_w))) added to the sums,
    multiplier fl(a_w * fl(1 / s_y)), rne, saturation (ARM's, past 2^31 too), zero point, clamp."""
    a_w = (np.asarray(w_scale, f32) * f32(x_scale)).astype(f32)
    if bias is not None:
        acc = acc + np.rint((bias * (f32(1) / a_w)).astype(f32)).astype(np.int64)
    mult = (a_w * (f32(1) / f32(y_scale))).astype(f32)
    r = np.clip(np.rint((acc.astype(f32) * mult).astype(f32)), -32768, 32767) + y_zp
    return np.clip(r, y_zp if relu else 0, 255).astype(np.uint8)


def _linear_dynamic_model(path, qlinear, in_features: int, engine: str) -> qrt.Model:
    dynamic_linear_file(path, qlinear, in_features, engine)
    return qrt.load(path)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("in_features,out_features", SIZES)
def test_dynamic_linear_both_engines(tmp_path, in_features, out_features, per_channel, bias):
    """Each engine's file gives its torch engine's bits; qnnpack's differ from x86's (the range, the epilogue)."""
    torch.manual_seed(in_features * 100 + out_features)
    float_linear = torch.nn.Linear(in_features, out_features, bias=bias)
    rng = np.random.default_rng(in_features)
    xs = [_off_ties((rng.standard_normal((m, in_features)) * 3 + 0.5).astype(f32)) for m in BATCHES]
    got, want = {}, {}
    for engine, torch_engine in (("x86", "x86"), ("qnnpack", "qnnpack")):
        before = torch.backends.quantized.engine
        torch.backends.quantized.engine = torch_engine
        try:
            ref = quantized_copy(float_linear, torch.qint8, per_channel)
            model = _linear_dynamic_model(tmp_path / f"{engine}.qrt", ref, in_features, engine)
            want[engine] = [ref(torch.from_numpy(x)).detach().numpy() for x in xs]
        finally:
            torch.backends.quantized.engine = before
        got[engine] = [model.run(x) for x in xs]
        for x, g, w in zip(xs, got[engine], want[engine]):
            np.testing.assert_array_equal(g.view(np.int32), w.view(np.int32), err_msg=f"{engine} m={len(x)}")
    if in_features > 1:
        assert any(not np.array_equal(a, b) for a, b in zip(got["x86"], got["qnnpack"]))


@pytest.mark.parametrize("variant", RUNNABLE)
@pytest.mark.parametrize("in_features,out_features", [(7, 5), (64, 40), (257, 65), (1030, 33)])
@pytest.mark.parametrize("zero_points", [True, False], ids=["w_zp", "symmetric"])
def test_dynamic_linear_every_variant_against_the_oracle(in_features, out_features, variant, zero_points):
    """Every kernel variant (fused register epilogues included) gives the oracle's bits, with weight zero points
    (x quantized, then packed) and without (x quantized straight into the row tiles)."""
    rng = np.random.default_rng(in_features)
    w = rng.integers(-128, 128, (out_features, in_features), dtype=np.int8)
    w_scale = rng.uniform(1e-3, 2e-2, out_features).astype(f32)
    w_zp = rng.integers(-4, 5, out_features).astype(np.int32) * zero_points
    bias = rng.standard_normal(out_features).astype(f32)
    before = K.kernel_variant()
    try:
        K._use_variant(variant)
        for with_bias in (bias, None):
            layer = K.DynamicLinear(w, w_scale, w_zp, with_bias, True, True)
            for m, relu in zip(BATCHES + BATCHES, (False,) * 3 + (True,) * 3):
                x = (rng.standard_normal((m, in_features)) * 2 - 0.3).astype(f32)
                y = np.empty((m, out_features), f32)
                layer(x, y, relu)  # relu after the add, as torch's linear_relu_dynamic
                want = _dynamic_oracle(x, w, w_scale, w_zp, with_bias)
                want = np.where(want <= 0, f32(0), want) if relu else want
                np.testing.assert_array_equal(y.view(np.int32), want.view(np.int32), err_msg=f"m={m} relu={relu}")
    finally:
        K._use_variant(before)


def _static_module(in_features: int, out_features: int, per_channel: bool, relu: bool, bias: bool, seed: int):
    import torch.ao.nn.intrinsic.quantized as nniq
    import torch.ao.nn.quantized as nnq

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * 0.2
    if per_channel:
        scales = (torch.rand(out_features, generator=g) * 0.01 + 1e-3).float().double()
        qw = torch.quantize_per_channel(w, scales, torch.randint(-5, 6, (out_features,), generator=g), 0, torch.qint8)
    else:
        qw = torch.quantize_per_tensor(w, float(f32(0.004)), 3, torch.qint8)
    b = torch.randn(out_features, generator=g) * 2 if bias else None
    module = (nniq.LinearReLU if relu else nnq.Linear)(in_features, out_features)
    module.set_weight_bias(qw, b)
    module.scale = float(f32(0.05 + 0.3 * torch.rand(1, generator=g).item()))
    module.zero_point = int(torch.randint(0, 256, (1,), generator=g))
    return module, qw, b


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("relu", [False, True], ids=["linear", "linear_relu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("in_features,out_features", SIZES)
def test_static_linear(tmp_path, qnnpack, in_features, out_features, per_channel, relu, bias):
    """Full 8-bit activations (qnnpack's qconfig): bit for bit with torch and with the oracle."""
    seed = in_features * 7 + out_features
    ref, qw, b = _static_module(in_features, out_features, per_channel, relu, bias, seed)
    wq, w_q = qw.int_repr().numpy(), qparams(qw, "weight_")
    rng = np.random.default_rng(seed)
    for x_scale, x_zp in ((0.02, 128), (0.1, 0), (1e-3, 250)):
        x_scale = float(f32(x_scale))
        g = GraphBuilder()
        inputs = {
            "x": g.input("x", "uint8", [None, in_features]),
            "x_scale": np.asarray(x_scale, f32),
            "x_zero_point": np.asarray(x_zp, np.int32),
            "weight": wq,
            **w_q,
            "bias": None if b is None else b.numpy(),
            "y_scale": np.asarray(ref.scale, f32),
            "y_zero_point": np.asarray(ref.zero_point, np.int32),
        }
        g.output(g.node("linear", inputs, {"relu": relu, "engine": "qnnpack"}))
        g.save(tmp_path / "m.qrt")
        model = qrt.load(tmp_path / "m.qrt")
        for m in BATCHES:
            xq = rng.integers(0, 256, (m, in_features), dtype=np.uint8)
            got = model.run(xq)
            acc = (xq.astype(np.int64) - x_zp) @ (wq.astype(np.int64) - w_q["weight_zero_point"].reshape(-1, 1)).T
            oracle = _static_oracle(acc, x_scale, w_q["weight_scale"], inputs["bias"], ref.scale, ref.zero_point, relu)
            np.testing.assert_array_equal(got, oracle, err_msg=f"oracle m={m} x_zp={x_zp}")
            want = ref(torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), x_scale, x_zp)).int_repr()
            np.testing.assert_array_equal(got, want.numpy(), err_msg=f"torch m={m} x_zp={x_zp}")


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_static_bias_quantized_at_ties(qnnpack, per_channel):
    """Biases on and next to the half-integer ties of b / a_w pin the rounding of qnnpack's int32 bias:
    rne(fl(b * fl(1 / a_w))) (fl(b / a_w) and the double quotient each miss hundreds here, NUMERICS.md)."""
    import torch.ao.nn.quantized as nnq

    rng = np.random.default_rng(11)
    n, x_scale = 4000, f32(0.0123)
    w_scale = rng.uniform(1e-3, 2e-2, n).astype(f32) if per_channel else np.full(n, f32(0.0071))
    a_w = (w_scale * x_scale).astype(f32)
    ties = rng.integers(-100, 100, n) + 0.5 + rng.choice([-1, 0, 1], n) * rng.uniform(0, 3e-6, n)
    bias = (ties * a_w).astype(f32)
    w = torch.zeros(n, 1)
    if per_channel:
        qw = torch.quantize_per_channel(w, torch.from_numpy(w_scale).double(), torch.zeros(n, dtype=torch.long), 0,
                                        torch.qint8)
    else:
        qw = torch.quantize_per_tensor(w, float(w_scale[0]), 0, torch.qint8)
    ref = nnq.Linear(1, n)
    ref.set_weight_bias(qw, torch.from_numpy(bias))
    ref.scale, ref.zero_point = float(a_w[0]), 128  # multipliers near 1: the output shows the int32 bias
    x = torch._make_per_tensor_quantized_tensor(torch.full((1, 1), 7, dtype=torch.uint8), float(x_scale), 7)
    layer = K.StaticLinear(qw.int_repr().numpy(), w_scale if per_channel else w_scale[0], np.zeros(n, np.int32),
                           bias, x_scale, 7, f32(a_w[0]), 128, False, True)
    y = np.empty((1, n), np.uint8)
    layer(x.int_repr().numpy(), y)
    np.testing.assert_array_equal(y, ref(x).int_repr().numpy())


@pytest.mark.parametrize("variant", RUNNABLE)
def test_static_linear_saturates_as_on_arm(variant):
    """A requantized value past 2^31 saturates (ARM NEON's vcvtnq); torch's x86 SSE2 kernel gives
    0x80000000 there instead (NUMERICS.md). Every variant gives the oracle's bits, the huge bias too."""
    rng = np.random.default_rng(5)
    n, k = 37, 19
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    bias = rng.standard_normal(n).astype(f32) * 50
    bias[:4] = [1e3, -1e3, 1e30, -1e30]  # a_w = 1e-6: int32 biases of +-1e9 and the clamped +-2^31
    zp = np.zeros(n, np.int32)
    before = K.kernel_variant()
    try:
        K._use_variant(variant)
        layer = K.StaticLinear(w, f32(1e-4), zp, bias, f32(1e-2), 7, f32(1e-9), 128, False, True)
        for m in BATCHES:
            xq = rng.integers(0, 256, (m, k), dtype=np.uint8)
            y = np.empty((m, n), np.uint8)
            layer(xq, y)
            a_w = f32(1e-4) * f32(1e-2)
            bq = np.clip(np.rint((bias * (f32(1) / a_w)).astype(f32)).astype(np.float64), -(2**31), 2**31 - 1)
            acc = (xq.astype(np.int64) - 7) @ w.astype(np.int64).T + bq.astype(np.int64)
            acc = ((acc + 2**31) % 2**32) - 2**31  # qnnpack's int32 sums wrap
            np.testing.assert_array_equal(y, _static_oracle(acc, 1e-2, f32(1e-4), None, 1e-9, 128, False))
            assert (y[:, 0] == 255).all() and (y[:, 1] == 0).all()  # fl(acc) * mult about +-1e12
    finally:
        K._use_variant(before)


def _cell(kind: str, input_size: int, hidden: int, per_channel: bool) -> torch.nn.Module:
    torch.manual_seed(input_size * 10 + hidden)
    float_cell = {"rnn_tanh": lambda: torch.nn.RNNCell(input_size, hidden),
                  "rnn_relu": lambda: torch.nn.RNNCell(input_size, hidden, nonlinearity="relu"),
                  "lstm": lambda: torch.nn.LSTMCell(input_size, hidden),
                  "gru": lambda: torch.nn.GRUCell(input_size, hidden)}[kind]()
    return quantized_copy(float_cell, torch.qint8, per_channel)


def _cell_file(path, kind: str, qcell, engine: str) -> qrt.Model:
    cell_model_file(path, kind, qcell, engine)
    return qrt.load(path)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("kind", ["rnn_relu", "rnn_tanh", "lstm", "gru"])
@pytest.mark.parametrize("input_size,hidden", [(1, 1), (7, 5), (37, 13), (64, 129)])
def test_cells_one_step(tmp_path, qnnpack, kind, input_size, hidden, per_channel):
    qcell = _cell(kind, input_size, hidden, per_channel)
    model = _cell_file(tmp_path / "cell.qrt", kind, qcell, "qnnpack")
    atol = 0.0 if kind == "rnn_relu" else 3e-7
    rng = np.random.default_rng(hidden)
    for batch in BATCHES:
        x = _off_ties(rng.standard_normal((batch, input_size)).astype(f32))
        states = [_off_ties(rng.uniform(-1, 1, (batch, hidden)).astype(f32)) for _ in range(2 if kind == "lstm" else 1)]
        t_states = tuple(torch.from_numpy(s) for s in states)
        want = qcell(torch.from_numpy(x), t_states if kind == "lstm" else t_states[0])
        want = [w.detach().numpy() for w in (want if kind == "lstm" else (want,))]
        got = model.run({"x": x, **dict(zip(("h", "c"), states))})
        for g, w in zip(got if kind == "lstm" else (got,), want):
            np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=f"batch={batch}")


@pytest.mark.parametrize("factory,shape,classes", [
    ("make_lstm_classifier", (2, 15, 12), {torch.nn.LSTM, torch.nn.Linear}),
    ("make_gru_classifier", (15, 2, 9), {torch.nn.GRU, torch.nn.Linear}),
])
def test_sequences_converted_under_qnnpack(tmp_path, qnnpack, factory, shape, classes, capsys):
    """The converter takes the engine in force, says so, and writes it on every int8 node; the free-running
    sequence then follows torch's qnnpack results within the drift bound, its head bit for bit given h."""
    import models

    from tools.convert import main

    torch.save(getattr(models, factory)().state_dict(), tmp_path / "m.pt")
    argv = [str(tmp_path / "m.pt"), "-o", str(tmp_path / "m.qrt"), "--model", f"models:{factory}",
            "--input-shape", ",".join(map(str, shape)), "-q"]
    assert main(argv) == 0
    assert "engine qnnpack" in capsys.readouterr().out
    model = qrt.load(tmp_path / "m.qrt")
    assert model.metadata["converter.engine"] == "qnnpack"
    assert all(n.attrs["engine"] == "qnnpack" for n in model.graph.nodes if "engine" in n.attrs)
    want = torch.ao.quantization.quantize_dynamic(getattr(models, factory)().eval(), classes, dtype=torch.qint8)
    x = np.random.default_rng(0).standard_normal(shape).astype(f32)
    logits, h = model.run(x)
    with torch.no_grad():
        want_logits, want_h = want(torch.from_numpy(x))
        np.testing.assert_array_equal(logits, want.head(torch.from_numpy(h)).numpy())
    np.testing.assert_allclose(h, want_h.numpy(), rtol=0, atol=2e-2)
    assert main(argv + ["--engine", "x86"]) == 0
    assert "engine x86" in capsys.readouterr().out
    assert all("engine" not in n.attrs or n.attrs["engine"] == "x86" for n in qrt.load(tmp_path / "m.qrt").graph.nodes)


def test_whole_model_under_qnnpack_keeps_its_feature_width(tmp_path, qnnpack):
    """A quantize_dynamic model saved whole under qnnpack: its Linear's input width stays fixed. torch's qnnpack
    dynamic Linear runs on inputs of any width without a word, so the free-dimension search had found the
    features free too (x float32[?, ?])."""
    import models

    from tools.convert import convert

    model = torch.ao.quantization.quantize_dynamic(models.make_mlp().eval(), {torch.nn.Linear}, dtype=torch.qint8)
    torch.save(model, tmp_path / "m.pt")
    result = convert(tmp_path / "m.pt", tmp_path / "m.qrt", trust_checkpoint=True, input_shapes=["3,37"])
    assert result.shapes == {"x": "float32[?, 37]"}
    x = np.random.default_rng(4).standard_normal((5, 37)).astype(f32)
    with torch.no_grad():
        np.testing.assert_array_equal(qrt.load(tmp_path / "m.qrt").run(x), model(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("weights", ["per-tensor", "per-channel"])
def test_static_mlp_converted_for_qnnpack(tmp_path, qnnpack, weights):
    """--engine qnnpack in static mode: calibrated over the full 8-bit range as get_default_qconfig("qnnpack"),
    bit for bit with convert_fx's model of the same calibration run on torch's qnnpack engine."""
    import models

    from tools import qrt_backend
    from tools.compare import build_parser, compare_report
    from tools.convert import convert
    from tools.rules import DEFAULT_RULES

    torch.save(models.make_mlp().state_dict(), tmp_path / "mlp.pt")
    data = (np.random.default_rng(7).standard_normal((150, 37)) * 2).astype(f32)
    np.savez(tmp_path / "calib.npz", x=data)
    convert(tmp_path / "mlp.pt", tmp_path / "m.qrt", model="models:make_mlp", mode="static", weights=weights,
            calib=tmp_path / "calib.npz", calib_batch_size=40, engine="qnnpack")
    model = qrt.load(tmp_path / "m.qrt")
    linears = [n for n in model.graph.nodes if n.op == "linear"]
    assert len(linears) == 3 and all(n.attrs["engine"] == "qnnpack" for n in linears)
    prepared = qrt_backend.prepare(models.make_mlp(), DEFAULT_RULES, "static", "qint8", weights,
                                   [torch.zeros(1, 37)], "qnnpack")
    qrt_backend.calibrate(prepared, ([torch.from_numpy(data[i : i + 40])] for i in range(0, len(data), 40)))
    want = qrt_backend.to_native(prepared, DEFAULT_RULES, "qnnpack")
    rng = np.random.default_rng(2)
    for batch in BATCHES:
        x = (rng.standard_normal((batch, 37)) * 3).astype(f32)
        with torch.no_grad():
            np.testing.assert_array_equal(model.run(x), want(torch.from_numpy(x)).numpy(), err_msg=f"batch={batch}")
    # qrt-compare rebuilds torch's model for the engine the file names, whatever engine is in force
    torch.backends.quantized.engine = "x86"
    args = build_parser("qrt-compare").parse_args([str(tmp_path / "m.qrt"), "--checkpoint", str(tmp_path / "mlp.pt"),
                                                   "--model", "models:make_mlp", "--calib", str(tmp_path / "calib.npz"),
                                                   "--batch", "7"])
    report = compare_report(args)
    assert all(row["vs_torch_quantized"]["identical"] == 1.0 for row in report["layers"])


ARM_TORCH = Path(__file__).parent / "arm_torch" / "qnnpack_ties.npz"  # recorded by arm_torch/record.py


def _quantize_model(path, op: str, dtype: str, scale, zero_point, engine: str) -> qrt.Model:
    g = GraphBuilder()
    x = g.input("x", "float32", [2, None] if op == "quantize_per_channel" else [None])
    attrs = {"dtype": dtype, "engine": engine, **({"axis": 0} if op == "quantize_per_channel" else {})}
    g.output(g.node(op, {"x": x, "scale": scale, "zero_point": zero_point}, attrs))
    g.save(path)
    return qrt.load(path)


def test_arm_torch_quantize_at_ties(tmp_path):
    """quantize_per_tensor (every dtype) and quantize_per_channel with engine qnnpack give torch's aarch64 bits on
    and beside every rounding tie: rne(fl(x * fl(1 / s))) + zp; engine x86 keeps x86 torch's rule, which the same
    values tell apart (hundreds of them differ)."""
    ref = np.load(ARM_TORCH)
    for i in range(3):
        x, s, z = ref[f"quantize{i}_x"], float(ref[f"quantize{i}_scale"]), int(ref[f"quantize{i}_zero_point"])
        differ = 0
        for dtype, zero_point in (("quint8", z), ("qint8", z - 128), ("qint32", z)):
            want = ref[f"quantize{i}_{dtype}"]
            for engine in ("qnnpack", "x86"):
                model = _quantize_model(tmp_path / f"{engine}.qrt", "quantize_per_tensor", dtype, np.asarray(s, f32),
                                        np.asarray(zero_point, np.int32), engine)
                got = model.run(x)
                if engine == "qnnpack":
                    np.testing.assert_array_equal(got, want, err_msg=f"{dtype} scale={s} zp={zero_point}")
                else:
                    differ += int((got != want).sum())
        assert differ > 100
        scales, zps = ref[f"quantize{i}_per_channel_scale"], ref[f"quantize{i}_per_channel_zero_point"].astype(np.int32)
        model = _quantize_model(tmp_path / "c.qrt", "quantize_per_channel", "quint8", scales, zps, "qnnpack")
        np.testing.assert_array_equal(model.run(np.stack([x, x])), ref[f"quantize{i}_per_channel"])


def test_arm_torch_dynamic_linear_at_ties(tmp_path):
    """linear_dynamic with engine qnnpack gives torch's aarch64 outputs for inputs on the rounding ties of their
    own activation parameters (every element of y differs under x86 torch's rounding)."""
    ref = np.load(ARM_TORCH)
    for i in range(3):
        x, y = ref[f"linear{i}_x"], ref[f"linear{i}_y"]
        s_x, zp_x = torch._choose_qparams_per_tensor(torch.from_numpy(x), False)
        x86 = torch.quantize_per_tensor(torch.from_numpy(x), s_x, zp_x, torch.quint8).int_repr().numpy()
        assert (x86 != _arm_quantize(x, s_x, zp_x)).sum() > 50  # the ties the inputs sit on
        g = GraphBuilder()
        xin = g.input("x", "float32", [None, x.shape[1]])
        ports = {"x": xin, **{p: ref[f"linear{i}_{p}"] for p in ("weight", "weight_scale", "weight_zero_point",
                                                                  "bias")}}
        g.output(g.node("linear_dynamic", ports, {"engine": "qnnpack"}))
        g.save(tmp_path / "m.qrt")
        np.testing.assert_array_equal(qrt.load(tmp_path / "m.qrt").run(x).view(np.int32), y.view(np.int32))


def test_engine_attribute_rules(tmp_path):
    """engine is validated, needs format version 5 (written only where a node sets it; 6 on a quantize op), and
    older files load as x86 (tests/test_golden.py holds them to their bytes)."""
    w = np.ones((3, 4), np.int8)
    for engine, version in ((None, "4"), ("x86", "5"), ("qnnpack", "5")):
        g = GraphBuilder()
        x = g.input("x", "float32", [None, 4])
        attrs = {} if engine is None else {"engine": engine}
        g.output(g.node("linear_dynamic", {"x": x, "weight": w, "weight_scale": np.asarray(0.5, f32),
                                           "weight_zero_point": np.asarray(0, np.int32)}, attrs))
        g.save(tmp_path / "m.qrt")
        model = qrt.load(tmp_path / "m.qrt")
        assert model.metadata["qrt.version"] == version
        assert model.graph.nodes[0].attrs["engine"] == (engine or "x86")
    data = (tmp_path / "m.qrt").read_bytes()  # the qnnpack file, its version edited to 4 (same checksum)
    (tmp_path / "v4.qrt").write_bytes(data.replace(b'"qrt.version":"5"', b'"qrt.version":"4"', 1))
    with pytest.raises(FormatError, match=r"attribute 'engine' needs format version 5, the file says 4"):
        qrt.load(tmp_path / "v4.qrt")
    for engine, version in (("x86", "6"), ("qnnpack", "6")):  # on a quantize op: version 6
        model = _quantize_model(tmp_path / "q.qrt", "quantize_per_tensor", "quint8", np.asarray(0.5, f32),
                                np.asarray(3, np.int32), engine)
        assert model.metadata["qrt.version"] == version
    data = (tmp_path / "q.qrt").read_bytes()
    (tmp_path / "q5.qrt").write_bytes(data.replace(b'"qrt.version":"6"', b'"qrt.version":"5"', 1))
    with pytest.raises(FormatError, match=r"\(quantize_per_tensor\): attribute 'engine' needs format version 6, the "
                                          r"file says 5"):
        qrt.load(tmp_path / "q5.qrt")
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 4])
    with pytest.raises(FormatError, match=r"attribute 'engine' must be one of \['x86', 'qnnpack'\]"):
        g.node("linear_dynamic", {"x": x, "weight": w, "weight_scale": np.asarray(0.5, f32),
                                  "weight_zero_point": np.asarray(0, np.int32)}, {"engine": "onednn"})
        g.save(tmp_path / "bad.qrt")


def test_gpu_refuses_qnnpack(tmp_path, monkeypatch):
    """The CUDA kernels implement the x86 numerics only: a qnnpack model is refused by name, before any upload
    (here without a GPU: the check for one is skipped, and nothing may reach CuPy)."""
    gpu = pytest.importorskip("qrt.gpu")
    qcell = _cell("gru", 5, 3, False)
    _cell_file(tmp_path / "cell.qrt", "gru", qcell, "qnnpack")
    monkeypatch.setattr(gpu, "require_cuda", lambda: None)
    with pytest.raises(NotImplementedError, match=r"engine 'qnnpack' is implemented on the CPU only; nodes \['cell'\]"):
        qrt.load(tmp_path / "cell.qrt", device="cuda")
    gpu.refuse_unsupported(_cell_file(tmp_path / "x86.qrt", "gru", qcell, "x86").graph)


@pytest.mark.parametrize("engine, here, want, note", [
    (None, "x86", "x86", "x86, torch's engine in this process (a model quantized under qnnpack needs --engine "
                         "qnnpack)"),
    (None, "qnnpack", "qnnpack", "qnnpack, torch's engine in this process (a model quantized under x86 needs "
                                 "--engine x86)"),
    (None, "fbgemm", "x86", "x86, torch's engine in this process"),  # torch's older name of x86
    ("fbgemm", "qnnpack", "x86", ""),
    ("qnnpack", "x86", "qnnpack", ""),
    (None, "onednn", "torch's quantized engine here is 'onednn', whose numerics qrt does not follow: pass --engine "
                     "x86 or --engine qnnpack", None),
])
def test_engine_of_a_quantized_checkpoint(tmp_path, engine, here, want, note):
    """The checkpoint does not record the engine it was quantized under (a model quantized on ARM converted on x86):
    where the user does not name one, the converter takes torch's in force and says where it came from."""
    from tools.convert import ConvertError, convert

    net = torch.nn.Sequential(torch.nn.Linear(7, 5))
    torch.save(torch.ao.quantization.quantize_dynamic(net.eval(), {torch.nn.Linear}, dtype=torch.qint8),
               tmp_path / "m.pt")
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = here
    try:
        if note is None:
            with pytest.raises(ConvertError, match=want):
                convert(tmp_path / "m.pt", tmp_path / "m.qrt", engine=engine, input_shapes=["2,7"],
                        trust_checkpoint=True)
            return
        result = convert(tmp_path / "m.pt", tmp_path / "m.qrt", engine=engine, input_shapes=["2,7"],
                         trust_checkpoint=True)
    finally:
        torch.backends.quantized.engine = before
    assert result.metadata["converter.engine"] == want
    assert result.engine_note.startswith(note) if note else result.engine_note == ""
    assert [n.attrs.get("engine", "x86") for n in qrt.load(tmp_path / "m.qrt").graph.nodes] == [want]
