"""Every kernel variant this CPU runs against the scalar oracles, and against each other: bit-exact.

The oracles (gemm_u8s8_reference, gemm_f32_chain_reference) are the plain
loops the kernels replaced; the op-level tests hold them to torch. Here each
variant of the build (qrt/kernels/variant_*.c) that this CPU can run, not only
the one dispatch picks, must reproduce them exactly at sizes that are not
multiples of the vector or tile widths, at the u8 x s8 saturation corners,
with extreme zero points, and for any number of threads; whole layers and
recurrent steps must give the portable variant's bits.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import qrt
from qrt import _kernels as K

# (m, n, k): K = 1, M = 0 and 1, sizes just off multiples of 4, 16 and 64, more rows than one tile; one row
# read as it is (k a multiple of 4) or packed, over one K slice or several; buffers past the stack's
# (SCRATCH_BYTES: packed x of many k); many panels at one row; one row over weights of at most 32 KiB
# (the one-row passes: whole passes and every smaller one, across panels), over more (a strip at a time, to
# 1 MiB) and over more than 1 MiB (panel tiles); a last tile of one row; two blocks of rows (I8_MC), the last
# too short for AVX2's widened weights (I8_WIDE), over two K slices
SHAPES = [(0, 5, 3), (1, 1, 1), (1, 7, 1), (3, 1, 5), (1, 65, 4), (5, 17, 3), (7, 63, 65), (13, 130, 129),
          (6, 64, 256), (19, 33, 1030), (2, 200, 7), (1, 130, 1032), (1, 33, 1030), (1, 2100, 12), (7, 5, 1500),
          (1, 500, 61), (1, 257, 128), (7, 300, 64), (1, 1100, 1030), (98, 20, 300)]
# amx-int8's row tiles of 16 (blocks of 32 rows, a lone 16, a short last tile on AMX or left to avx512-vnni's
# registers) over whole blocks of 64 k and a partial last one (k < 64 only that), panels cut after 1 and 3
# strips (n = 10, 97); two groups of panels (I8_AMX_GROUP_BYTES: 15 of 1100 k), each over two blocks of rows,
# a panel's epilogue running during the next panel's product, across blocks of rows and groups
ROW_TILE_SHAPES = [(16, 64, 64), (17, 10, 64), (20, 50, 3), (35, 97, 200), (48, 130, 129), (70, 65, 256),
                   (40, 1030, 1100)]


RUNNABLE = [name for name, ok in K.kernel_variants().items() if ok]



def _u8s8(x, x_zp, w, w_zp):
    m, n = x.shape[0], w.shape[0]
    want = np.empty((m, n), np.int32)
    K.gemm_u8s8_reference(x, x_zp, w, w_zp, want)
    got = np.full((m, n), 12345, np.int32)
    K.PackedS8(w, w_zp)(x, x_zp, got)
    return got, want


@pytest.mark.parametrize("m,n,k", SHAPES + ROW_TILE_SHAPES)
@pytest.mark.parametrize("x_zp", [0, 128, 255, -7])
@pytest.mark.parametrize("x_max", [255, 128], ids=["x8bit", "x7bit"])  # x <= 128 takes the u7 flavour (AVX2)
def test_u8s8_random(m, n, k, x_zp, x_max, threads, variant):
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    x = rng.integers(0, x_max + 1, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w_zp = rng.integers(-128, 128, n).astype(np.int32)
    got, want = _u8s8(x, x_zp, w, w_zp)
    np.testing.assert_array_equal(got, want)
    got, want = _u8s8(x, x_zp, w, np.zeros(n, np.int32))  # symmetric weights: no rowsum(x) term
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xv,wv", [(255, -128), (255, 127), (0, -128), (128, -128)])
@pytest.mark.parametrize("k", [1, 4, 255, 1027])
@pytest.mark.parametrize("m", [7, 20])  # register tiles; AMX's
def test_u8s8_saturation_corners(xv, wv, k, m, threads, variant):
    """Where vpmaddubsw would saturate int16 (255 * -128 * 2): the kernels must not."""
    n = 70
    x = np.full((m, k), xv, np.uint8)
    w = np.full((n, k), wv, np.int8)
    for x_zp, w_zp in ((0, 0), (255, 127), (-255, -128)):
        got, want = _u8s8(x, x_zp, w, np.full(n, w_zp, np.int32))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("m", [2, 20])  # register tiles; AMX's
def test_u8s8_wraps_like_int32(m, threads, variant):
    """Sums beyond int32 wrap modulo 2**32 in both, whatever the order of the additions."""
    n, k = 20, 70000
    x = np.full((m, k), 255, np.uint8)
    w = np.full((n, k), -128, np.int8)
    got, want = _u8s8(x, 2**31 - 1, w, np.full(n, 100, np.int32))
    np.testing.assert_array_equal(got, want)


def _f16_weights(rng, n, k):
    w = rng.standard_normal((n, k)).astype(np.float16)
    if w.size:
        w.flat[0] = np.float16(65504)
        w.flat[-1] = np.float16(6e-8)  # subnormal
    return w


# ... and more row tiles than one block (16 tiles of near-equal height)
@pytest.mark.parametrize("m,n,k", SHAPES + [(3, 70, 513), (9, 32, 1100), (4, 31, 512), (2, 95, 1537), (1, 600, 700),
                                   (131, 40, 70)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("half", [True, False], ids=["float16", "float32"])
def test_float_chain(m, n, k, bias, half, threads, variant):
    """float16 weights (dynamic linear) and float32 weights (linear_float): one chain order."""
    _check_float_chain(m, n, k, bias, half, K.PackedFloat)


def _check_float_chain(m, n, k, bias, half, pack):
    """The product of the weights packed by pack(w, half=half) against the scalar oracle, bit for bit."""
    rng = np.random.default_rng(m * 31 + n * 7 + k)
    w = _f16_weights(rng, n, k).astype(np.float32)
    if not half:
        w *= np.float32(1 + 2**-20)  # values float16 cannot hold
    x = rng.standard_normal((m, k)).astype(np.float32) * np.float32(100)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    want = np.empty((m, n), np.float32)
    K.gemm_f32_chain_reference(x, w, b, want)
    got = np.full((m, n), np.nan, np.float32)
    pack(w, half=half)(x, b, got)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))  # bits: -0.0 and NaN too


# row tiles enough for a block to widen its float16 panels (F_WIDEN_TILES: 4 tiles of every variant's rows): k
# below one slice and over several with a partial last one, a tail-quirk panel beside widened ones (n = 70,
# k > 512), two blocks of rows that both widen, and a last block of one tile, too short to widen
@pytest.mark.parametrize("m,n,k", [(98, 20, 300), (131, 40, 70), (40, 70, 1100), (200, 33, 260), (33, 64, 129)])
@pytest.mark.parametrize("widen", [0, 3, K.F16_WIDEN_MAX], ids=["as_stored", "widen3", "widen_max"])
def test_float16_widened_chain(m, n, k, widen, variant):
    """float16 weights widened to float32 a slice of k at a time, each chain going on across slices (gemm_f16.h):
    the same bits as read where they lie."""

    def pack(w, half):
        before = K._set_fp_widen(widen)
        try:
            layer = K.PackedFloat(w, half=half)
        finally:
            K._set_fp_widen(before)
        assert layer.widen == widen
        return layer

    _check_float_chain(m, n, k, True, True, pack)


def test_fp_widen_setting():
    for bad in (-2, K.F16_WIDEN_MAX + 1):
        with pytest.raises(ValueError, match=f"widening slice must be between -1 and {K.F16_WIDEN_MAX}, got {bad}"):
            K._set_fp_widen(bad)


def test_f16_signed_zero_and_specials(variant):
    """Exact bits for -0.0 sums, infinities and NaN, in plain and tail (k > 512) columns."""
    m, n, k = 2, 40, 600
    w = np.zeros((n, k), np.float16)
    w[:, 0] = -1
    x = np.zeros((m, k), np.float32)
    x[0, 0] = 0.0
    x[1, :] = np.inf
    want = np.empty((m, n), np.float32)
    K.gemm_f32_chain_reference(x, w.astype(np.float32), None, want)
    got = np.empty((m, n), np.float32)
    K.PackedFloat(w)(x, None, got)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_threads_setting():
    before = qrt.get_num_threads()
    assert before >= 1
    qrt.set_num_threads(1)
    assert qrt.get_num_threads() == 1
    for bad in (0, -1, K.MAX_THREADS + 1, 2**31, 2**64):
        with pytest.raises(ValueError, match=f"number of threads must be between 1 and {K.MAX_THREADS}, got {bad}"):
            qrt.set_num_threads(bad)
    for not_int in (2.5, 2.0, "3", None):  # a float was cut short to an int
        with pytest.raises(TypeError):
            qrt.set_num_threads(not_int)
    qrt.set_num_threads(np.int64(3))
    assert qrt.get_num_threads() == 3
    qrt.set_num_threads(before)


def test_variants_and_dispatch():
    """The best runnable variant is active unless QRT_KERNELS says otherwise; portable always runs."""
    variants = K.kernel_variants()
    assert variants["portable"] and list(variants)[-1] == "portable"
    if not os.environ.get("QRT_KERNELS"):
        assert K.kernel_variant() == RUNNABLE[0]
    assert K.kernel_variant_info()["variant"] == K.kernel_variant() == qrt.kernel_variant()
    with pytest.raises(ValueError, match="no kernel variant 'sse9'"):
        K._use_variant("sse9")
    for name, ok in variants.items():
        if not ok:
            with pytest.raises(ValueError, match="cannot run on this CPU"):
                K._use_variant(name)


@pytest.mark.parametrize("forced", ["portable", "sse9"])
def test_qrt_kernels_environment_variable(forced):
    env = {**os.environ, "QRT_KERNELS": forced}
    r = subprocess.run([sys.executable, "-c", "import qrt; print(qrt.kernel_variant())"], env=env,
                       capture_output=True, text=True, timeout=60)
    if forced == "portable":
        assert r.returncode == 0 and r.stdout.strip() == "portable", r.stderr
    else:
        assert r.returncode != 0 and "QRT_KERNELS=sse9: no kernel variant 'sse9'" in r.stderr


def _layers(rng, m, k, n):
    """A dynamic int8, a dynamic float16 and a static layer with inputs and output dtypes."""
    w8 = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    return [
        (K.DynamicLinear(w8, scale, np.zeros(n, np.int32), bias), rng.standard_normal((m, k)).astype(np.float32),
         np.float32),
        (K.DynamicLinear(rng.standard_normal((n, k)).astype(np.float16), None, None, bias),
         rng.standard_normal((m, k)).astype(np.float32), np.float32),
        (K.StaticLinear(w8, scale, rng.integers(-3, 4, n).astype(np.int32), bias, np.float32(0.02), 128,
                        np.float32(0.3), 60, True), rng.integers(0, 256, (m, k), dtype=np.uint8), np.uint8),
    ]


def test_layers_identical_for_any_thread_count(variant):
    """Whole layers (quantization, GEMM, epilogues) give the same bits on 1, 2 and 3 threads."""
    m, k, n = 37, 300, 200
    layers = _layers(np.random.default_rng(5), m, k, n)
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    try:
        for layer, x, dtype in layers:
            outs = []
            for threads in (1, 2, 3):
                qrt.set_num_threads(threads)
                y = np.empty((m, n), dtype)
                layer(x, y)
                outs.append(y.view(np.uint8))
            np.testing.assert_array_equal(outs[0], outs[1])
            np.testing.assert_array_equal(outs[0], outs[2])
    finally:
        K._set_min_work(*floors)
        qrt.set_num_threads(before)


def _outputs_of(name: str, make, run) -> list:
    """run(make()) with the objects made under variant `name`, as raw bytes."""
    before = K._use_variant(name)
    try:
        objects = make()
    finally:
        K._use_variant(before)
    return [np.ascontiguousarray(y).view(np.uint8) for y in run(objects)]


@pytest.mark.parametrize("variant_name", [v for v in RUNNABLE if v != "portable"])
def test_layers_identical_to_portable(variant_name):
    """Whole layers, dynamic quantization included, on 3 threads: every variant gives portable's bits."""
    m, k, n = 45, 257, 131
    before, floors = qrt.get_num_threads(), K._set_min_work(1, 1, 1)
    qrt.set_num_threads(3)

    def run(layers):
        outs = []
        for layer, x, dtype in layers:
            y = np.empty((m, n), dtype)
            layer(x, y)
            outs.append(y)
        return outs

    def make():
        return _layers(np.random.default_rng(9), m, k, n)

    try:
        pairs = list(zip(_outputs_of(variant_name, make, run), _outputs_of("portable", make, run)))
    finally:
        K._set_min_work(*floors)
        qrt.set_num_threads(before)
    for got, want in pairs:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variant_name", [v for v in RUNNABLE if v != "portable"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", ["none", "normal", "huge"])
@pytest.mark.parametrize("relu", [False, True])
def test_requantization_identical_to_portable(variant_name, per_channel, bias, relu):
    """The static epilogue (vector forms on x86) against portable's C loop: per-tensor and per-channel
    folded bias or none, ReLU's lower clamp, results saturating at both ends of int16 and of uint8
    (biases of +-1e6 and +-inf over a_w of about 1e-5), and whole and partial vectors of columns."""
    m, k, n = 7, 21, 131  # AVX-512's 64-column panels: 2 whole and 3 columns; AVX2's 16: 8 and 3
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w_scale = (rng.random(n) * 1e-3 + 1e-4).astype(np.float32) if per_channel else np.float32(5e-4)
    b = None
    if bias != "none":
        b = rng.standard_normal(n).astype(np.float32)
        if bias == "huge":
            b[::4] = 1e6
            b[1::4] = -1e6
            b[2] = np.inf
            b[5] = -np.inf

    def make():
        return K.StaticLinear(w, w_scale, np.zeros(n, np.int32), b, np.float32(0.02), 3, np.float32(0.05), 70, relu)

    def run(layer):
        y = np.empty((m, n), np.uint8)
        layer(x, y)
        return [y]

    got, want = _outputs_of(variant_name, make, run), _outputs_of("portable", make, run)
    np.testing.assert_array_equal(got[0], want[0])
    ends = {70 if relu else 0, 255}  # uint8's range, from the zero point up under ReLU
    assert bias != "huge" or ends <= set(np.unique(want[0]).tolist())  # both saturated ends were reached


@pytest.mark.parametrize("variant_name", [v for v in RUNNABLE if v != "portable"])
@pytest.mark.parametrize("m,k,n", [(35, 64, 256), (35, 64, 94), (7, 300, 131), (2, 5, 48), (40, 1100, 1030)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("relu", [False, True], ids=["linear", "relu"])
def test_dynamic_epilogue_identical_to_portable(variant_name, m, k, n, bias, relu):
    """The dynamic linear's epilogue applied to a tile's registers (avx512-vnni, avx-vnni, neon-dotprod) against
    portable's C loop over stored sums: panels of whole strips and cut ones (n = 94: 64 + 30 on avx512-vnni, the
    last register's first 14 lanes stored), over one K slice and over two (k = 300), a tile of one row (m = 7 on
    6-row tiles), both signs of zero (a no-bias layer's -0.0 where a sum is 0 and a weight scale negative), ReLU
    at 0; on amx-int8, two groups of panels over two blocks of rows (40 x 1100 x 1030), each panel's epilogue
    run during the next panel's product; and nothing written past the output."""
    rng = np.random.default_rng(11)
    w8 = rng.integers(-128, 128, (n, k), dtype=np.int8)
    scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32) * rng.choice([-1, 1], n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) * 0.01 if bias else None
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[1] = 0.0  # sums of exactly 0: +-0.0 by the sign of the scale without bias

    def make():
        return K.DynamicLinear(w8, scale, np.zeros(n, np.int32), b)

    def run(layer):
        y = np.full((m + 1, n), 7.0, np.float32)  # a row past the output, which nothing may write
        layer(x, y[:m], relu)
        assert (y[m] == 7.0).all()
        return [y[:m]]

    got, want = _outputs_of(variant_name, make, run), _outputs_of("portable", make, run)
    np.testing.assert_array_equal(got[0], want[0])
    if not bias and not relu:  # the sign of zero is part of what is compared
        zeros = want[0].view(np.float32)[want[0].view(np.float32) == 0]
        assert np.signbit(zeros).any() and not np.signbit(zeros).all()


@pytest.mark.parametrize("k", [1, 7, 16, 33, 100, 300])
def test_dynamic_quantization_refuses_nan_and_infinity_anywhere(k, variant):
    """Each variant's range (qrt_min_max: order keys, or the ISA's float compares, isa/range_*.h) finds a NaN of
    either sign or an infinity wherever it lies: first, last, in each of the unrolled loop's accumulators (16
    floats apart on AVX-512, 8 on AVX2), the masked or scalar tail; the same input with a finite value there
    quantizes."""
    rng = np.random.default_rng(k)
    layer = K.DynamicLinear(rng.integers(-128, 128, (5, k), dtype=np.int8), np.float32(0.01), np.zeros(5, np.int32))
    y = np.empty((2, 5), np.float32)
    for at in sorted({0, k // 2, 2 * k - 1, *(a for a in (9, 17, 25, 40, 63, 590) if a < 2 * k)}):
        for special in (np.nan, -np.nan, np.inf, -np.inf):
            x = rng.standard_normal((2, k)).astype(np.float32)
            x.flat[at] = special
            with pytest.raises(ValueError, match="NaN or infinity"):
                layer(x, y)
            x.flat[at] = -0.0
            layer(x, y)


@pytest.mark.parametrize("variant_name", [v for v in RUNNABLE if v != "portable"])
def test_dynamic_quantization_range_edges_identical_to_portable(variant_name):
    """The range that picks the scale gives portable's bits on every variant (whose range may be the ISA's float
    compares where portable takes order keys): the row's largest or smallest value at every position of 203
    floats (every lane of the unrolled loop's accumulators, the masked or scalar tail), every value zero of either
    sign, all negative, all positive, the largest finite floats, subnormals; rows of 1 to 203 floats."""
    k, n = 203, 19
    rng = np.random.default_rng(36)
    w8 = rng.integers(-128, 128, (n, k), dtype=np.int8)
    big, tiny = np.finfo(np.float32).max, np.float32(1e-40)
    rows = [
        np.where(rng.random(k) < 0.5, -0.0, 0.0),
        -np.abs(rng.standard_normal(k)) - 0.5,
        np.abs(rng.standard_normal(k)) + 0.5,
        rng.choice([big, -big, 1.0, -0.0], k),
        rng.choice([tiny, -tiny, 0.0], k),
    ]
    for at in range(k):
        for extreme in (7.0, -7.0):
            row = np.full(k, 1.5) if extreme > 0 else np.full(k, -1.5)
            row[at] = extreme
            rows.append(row)
    x = np.ascontiguousarray(rows, np.float32)

    def outputs(name: str, m: int) -> np.ndarray:
        def make():
            return K.DynamicLinear(w8[:, :m], np.float32(0.02), np.zeros(n, np.int32))

        def run(layer):
            y = np.empty((len(x), n), np.float32)
            for r in range(len(x)):  # one row a call: each its own range
                layer(np.ascontiguousarray(x[r : r + 1, :m]), y[r : r + 1])
            return [y]

        return _outputs_of(name, make, run)[0]

    for m in (1, 15, 64, 203):
        np.testing.assert_array_equal(outputs(variant_name, m), outputs("portable", m))


@pytest.mark.parametrize("variant_name", [v for v in RUNNABLE if v != "portable"])
@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm", "gru"])
def test_recurrent_steps_identical_to_portable(variant_name, kind):
    """Gates (exp, sigmoid, tanh as vector code) over a wide range of pre-activations: portable's bits."""
    gates = {"lstm": 4, "gru": 3}.get(kind, 1)
    b, i, h = 3, 29, 77
    rng = np.random.default_rng(len(kind))
    x = (rng.standard_normal((b, i)) * 4).astype(np.float32)
    h0 = np.tanh(rng.standard_normal((b, h))).astype(np.float32)
    c0 = (rng.standard_normal((b, h)) * 3).astype(np.float32)

    def make():
        w_ih = rng.integers(-128, 128, (gates * h, i), dtype=np.int8)
        w_hh = rng.integers(-128, 128, (gates * h, h), dtype=np.int8)
        s = np.full(gates * h, 0.02, np.float32)
        zp = np.zeros(gates * h, np.int32)
        bias = (rng.standard_normal(gates * h) * 5).astype(np.float32)
        return K.Recurrent(kind, K.DynamicLinear(w_ih, s, zp, bias), K.DynamicLinear(w_hh, s, zp, bias))

    def run(cell):
        h1, c1 = np.empty((b, h), np.float32), np.empty((b, h), np.float32)
        cell.step(x, h0, c0, h1, c1)
        return [h1, c1] if kind == "lstm" else [h1]

    state = rng.bit_generator.state
    got = _outputs_of(variant_name, make, run)
    rng.bit_generator.state = state  # the same weights for the portable run
    want = _outputs_of("portable", make, run)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _run_bench_c(tmp_path, name: str, *args: str) -> str:
    """bench/<name>.c built against the kernel sources (it links the variants directly) and run; its output."""
    root = pathlib.Path(__file__).resolve().parent.parent
    exe = tmp_path / name
    kernels = sorted(str(p) for p in (root / "qrt" / "kernels").glob("*.c"))
    subprocess.run(["cc", "-O2", "-ffp-contract=off", "-std=c11", "-I", str(root / "qrt" / "kernels"),
                    str(root / "bench" / f"{name}.c"), *kernels, "-o", str(exe), "-pthread", "-lm"], check=True,
                   capture_output=True)
    return subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_gemv_floor_benchmark_builds_and_runs(tmp_path):
    """bench/gemv_floor.c links the kernel variants directly: keep it compiling as they change."""
    out = _run_bench_c(tmp_path, "gemv_floor", "37", "70")
    assert "qrt one-row product" in out and f"variant {RUNNABLE[0]}" in out


@pytest.mark.skipif(shutil.which("cc") is None or not K.kernel_variants().get("amx-int8", False),
                    reason="no C compiler, or no amx-int8 variant that runs here")
def test_amx_product_benchmark_builds_and_runs(tmp_path):
    """bench/amx_product.c calls the amx-int8 table entry directly: keep it compiling and running as it changes."""
    out = _run_bench_c(tmp_path, "amx_product", "37", "100", "70", "32", "2")
    assert "qrt 37 x 100 x 70, tasks of 32 rows, 2 weight copies" in out
    assert "tdpbusd, 2 x 2 tiles, loads from L1" in out and "tdpbusd, 2 x 2 tiles, registers" in out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_range_pass_benchmark_builds_and_runs(tmp_path):
    """bench/range_pass.c calls every runnable variant's min_max: keep it compiling, and its range right."""
    out = _run_bench_c(tmp_path, "range_pass", "37")
    for name in RUNNABLE:
        line = next(s for s in out.splitlines() if s.split()[0] == name)
        lo, hi = (float(v) for v in line.split("[")[1].rstrip("]").split(","))
        assert -0.3 <= lo < hi <= 0.7
