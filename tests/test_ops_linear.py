"""Static and dynamic quantized linear against torch's own quantized modules and exact references.

Tolerance: none wherever torch computes the same bits on every CPU. The integer accumulation is
exact and every float step is the one torch's x86/fbgemm engine performs (docs/NUMERICS.md), so
the stored integers (static) and the float32 outputs (dynamic) must be identical, at odd sizes,
K = 1, batch 1 and more, tiny to large inputs.

Where torch depends on the CPU (tests/reference.py says which kernels it runs here):
- static Linear with full-range 8-bit activations: qrt must equal the exact reference
  (reference.static_linear over exact int32 sums); torch is held to that reference too, or, on
  kernels before VNNI, to the same reference over its saturated int16 pair sums. The 7-bit
  cases (every model torch's x86 qconfigs produce) are checked against torch directly.
- float16 weights: qrt must equal its scalar oracle (the AVX-512 kernel's order) bit for bit;
  torch equals it bit for bit where it runs that kernel, and is within reference.reorder_bound
  (the most any two summation orders can differ) where it runs a 256-bit one.
"""

import numpy as np
import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
from qrt_testing import dynamic_linear_file, dynamic_weight, qparams, quantized_copy
from reference import TORCH_FP16_ORDER_IS_QRTS, TORCH_INT8_SATURATES, reorder_bound, static_linear, u8s8_accumulate

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder

SIZES = [(1, 1), (1, 7), (37, 13), (300, 65), (64, 64), (129, 33)]
RANGES = ["normal", "tiny", "minute", "large", "positive", "zeros", "constant"]


def _activations(shape, kind, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    return {
        "normal": x,
        "tiny": x * np.float32(1e-5),  # a scale below torch's SMALL_SCALE (6.1e-5): the range is widened
        "minute": x * np.float32(1e-37),  # 1 / fl(scale) overflows: torch takes 0.1 (every x still quantizes to zp)
        "large": x * np.float32(1e3),
        "positive": np.abs(x) + np.float32(0.5),
        "zeros": np.zeros(shape, np.float32),
        "constant": np.full(shape, -0.75, np.float32),
    }[kind]


def _dynamic_model(path, qlinear, in_features):
    dynamic_linear_file(path, qlinear, in_features)
    return qrt.load(path)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("in_features,out_features", SIZES)
def test_dynamic_linear_int8(tmp_path, in_features, out_features, per_channel, bias):
    torch.manual_seed(in_features * 1000 + out_features)
    ref = quantized_copy(torch.nn.Linear(in_features, out_features, bias=bias), torch.qint8, per_channel)
    model = _dynamic_model(tmp_path / "m.qrt", ref, in_features)
    rng = np.random.default_rng(in_features + out_features)
    for m in (1, 5, 64):
        for kind in RANGES:
            x = _activations((m, in_features), kind, rng)
            want = ref(torch.from_numpy(x)).detach().numpy()
            np.testing.assert_array_equal(model.run(x), want, err_msg=f"m={m} {kind}")


@pytest.mark.parametrize("in_features,out_features", [(300, 33), (65, 97)])
def test_dynamic_linear_quantizes_into_row_tiles(tmp_path, in_features, out_features, variant, threads):
    """x quantized straight into the product's row tiles (symmetric weights) on every variant, split by rows
    alone (33 outputs: one panel) and by rows and panels: rows ending in a whole, a short and a one-row tile
    (amx-int8's 16-row tiles; the register tiles of 6, 4 and 3), k of whole and partial 64-k blocks and
    256-k chunks (300), all torch's bits."""
    torch.manual_seed(in_features)
    ref = quantized_copy(torch.nn.Linear(in_features, out_features), torch.qint8, False)
    model = _dynamic_model(tmp_path / "m.qrt", ref, in_features)
    rng = np.random.default_rng(in_features)
    for m in (16, 17, 35):
        x = _activations((m, in_features), "normal", rng)
        np.testing.assert_array_equal(model.run(x), ref(torch.from_numpy(x)).detach().numpy(), err_msg=f"m={m}")


@pytest.mark.parametrize(
    "in_features,out_features",
    SIZES + [(600, 37), (1100, 70), (513, 32), (1024, 65)],  # K > 512 with a partial block of 32 columns
)
def test_dynamic_linear_float16(tmp_path, in_features, out_features):
    torch.manual_seed(in_features + out_features)
    float_linear = torch.nn.Linear(in_features, out_features)
    with torch.no_grad():
        float_linear.weight[0, 0] = 1e6  # beyond float16: clamped to 65504 as torch does
    ref = quantized_copy(float_linear, torch.float16, False)
    model = _dynamic_model(tmp_path / "m.qrt", ref, in_features)
    w, b = ref.weight().detach().numpy(), ref.bias().detach().numpy()  # float16 values, widened
    rng = np.random.default_rng(in_features)
    for m in (1, 3, 20):
        for kind in ("normal", "large", "tiny"):
            x = _activations((m, in_features), kind, rng)
            got = model.run(x)
            oracle = np.empty_like(got)
            K.gemm_f32_chain_reference(x, w, b, oracle)
            np.testing.assert_array_equal(got.view(np.int32), oracle.view(np.int32), err_msg=f"m={m} {kind}")
            want = ref(torch.from_numpy(x)).detach().numpy()
            if TORCH_FP16_ORDER_IS_QRTS:
                np.testing.assert_array_equal(got, want, err_msg=f"m={m} {kind}")
            else:
                assert np.all(np.abs(got - want) <= reorder_bound(x, w, b)), f"m={m} {kind}"


def test_dynamic_linear_keeps_leading_dimensions(tmp_path):
    ref = quantized_copy(torch.nn.Linear(19, 5), torch.qint8, False)
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 3, 19])
    b.output(b.node("linear_dynamic", {"x": x, **dynamic_weight(ref.weight(), ref.bias())}))
    b.save(tmp_path / "m.qrt")
    x = np.random.default_rng(0).standard_normal((4, 3, 19)).astype(np.float32)
    np.testing.assert_array_equal(qrt.run(tmp_path / "m.qrt", x), ref(torch.from_numpy(x)).detach().numpy())


def _static_reference(in_features, out_features, per_channel, relu, bias, seed):
    """A torch quantized Linear (or LinearReLU) with random weights and output parameters."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * 0.2
    if per_channel:
        scales = (torch.rand(out_features, generator=g) * 0.01 + 1e-3).float().double()
        zps = torch.randint(-5, 6, (out_features,), generator=g)
        qw = torch.quantize_per_channel(w, scales, zps, 0, torch.qint8)
    else:
        qw = torch.quantize_per_tensor(w, float(np.float32(0.004)), 3, torch.qint8)
    b = torch.randn(out_features, generator=g) if bias else None
    module = (nniq.LinearReLU if relu else nnq.Linear)(in_features, out_features)
    module.set_weight_bias(qw, b)
    module.scale = float(np.float32(0.05 + 0.3 * torch.rand(1, generator=g).item()))
    module.zero_point = int(torch.randint(0, 256, (1,), generator=g))
    return module, qw, b


# (x_scale, x_zero_point, largest activation): full 8-bit activations, and the 7-bit ones of torch's x86 qconfigs
ACTIVATIONS = [(0.02, 128, 255), (0.1, 0, 255), (1e-3, 250, 255), (0.02, 64, 127), (0.1, 0, 127), (1e-3, 127, 127)]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("relu", [False, True], ids=["linear", "linear_relu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("in_features,out_features", SIZES)
def test_static_linear(tmp_path, in_features, out_features, per_channel, relu, bias):
    seed = in_features * 7 + out_features
    ref, qw, b = _static_reference(in_features, out_features, per_channel, relu, bias, seed)
    wq, w_q = qw.int_repr().numpy(), qparams(qw, "weight_")
    rng = np.random.default_rng(seed)
    for x_scale, x_zp, x_max in ACTIVATIONS:
        x_scale = float(np.float32(x_scale))
        g = GraphBuilder()
        x = g.input("x", "uint8", [None, in_features])
        inputs = {
            "x": x,
            "x_scale": np.asarray(x_scale, np.float32),
            "x_zero_point": np.asarray(x_zp, np.int32),
            "weight": wq,
            **w_q,
            "bias": None if b is None else b.numpy(),
            "y_scale": np.asarray(ref.scale, np.float32),
            "y_zero_point": np.asarray(ref.zero_point, np.int32),
        }
        g.output(g.node("linear", inputs, {"relu": relu}))
        g.save(tmp_path / "m.qrt")
        model = qrt.load(tmp_path / "m.qrt")
        for m in (1, 4, 33):
            where = f"m={m} x_scale={x_scale} x_zp={x_zp} x_max={x_max}"
            xq = rng.integers(0, x_max + 1, (m, in_features), dtype=np.uint8)
            got = model.run(xq)
            exact, torch_sums = (
                static_linear(u8s8_accumulate(xq, x_zp, wq, w_q["weight_zero_point"], saturate), x_scale,
                              w_q["weight_scale"], inputs["bias"], ref.scale, ref.zero_point, relu)
                for saturate in (False, TORCH_INT8_SATURATES)
            )
            np.testing.assert_array_equal(got, exact, err_msg=where)
            tx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(xq), x_scale, x_zp)
            want = ref(tx).int_repr().numpy()
            np.testing.assert_array_equal(want, torch_sums, err_msg=f"torch: {where}")
            if x_max <= 127:  # no pair of products can saturate: torch is exact on every CPU
                np.testing.assert_array_equal(got, want, err_msg=where)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_dynamic_linear_large_input_any_thread_count(tmp_path, threads):
    """Large inputs are quantized in parallel chunks: still bit-exact with torch for any thread count."""
    ref = quantized_copy(torch.nn.Linear(301, 67), torch.qint8, True)
    model = _dynamic_model(tmp_path / "m.qrt", ref, 301)
    x = _activations((333, 301), "normal", np.random.default_rng(threads))
    x[200, 5] = 40.0  # the extremes sit in different chunks
    x[3, 7] = -35.0
    old = qrt.get_num_threads()
    try:
        qrt.set_num_threads(threads)
        got = model.run(x)
    finally:
        qrt.set_num_threads(old)
    np.testing.assert_array_equal(got, ref(torch.from_numpy(x)).detach().numpy())
