"""The float32 math ops against float64 references and torch, with the bound each one holds.

Notation: u = 2^-24 (the unit roundoff of float32), gamma(k) = k u / (1 - k u), ulp(y) the spacing of float32
at |y| (2^-23 relative at most, 2^-24 at least). Errors are measured against the exact function of the
float32 input, computed in float64.

- Elementwise functions, over a dense grid (2^20 points across [-20, 20], every 1024th float32 in between
  down to the subnormals, 2^20 points across [-120, 120], every float32 around each formula switch): each
  within its qrt bound in ulp wherever the exact result is a normal float above 2^-120, and within 2^-126
  absolute below (where formulas such as 1 / (1 + e^-x) underflow to 0, torch's too). The bounds follow
  from the formulas (qrt/kernels/float_math.h) and are the maxima over every float32 of a range, measured
  once in C, rounded up: qrt's exp is within 1.0 ulp; sigmoid = 1 / (1 + e), whose sum rounds by up to
  1 ulp of the result, then the division 0.5: 2.5 (2.48 over [-110, 30]); silu the same (2.40); tanh 1.35
  (1.33 over [0, 10]: cancellation in 1 - 2 / (e^2x + 1) just above the switch at 0.625); gelu_tanh 3 (the
  exp of a rounded argument corrected to first order, 0.5 more: 2.92 over [-30, 30]). gelu (erf form) is
  torch's own function (oneDNN's polynomials, qrt/kernels/torch_gelu.h; bit for bit with torch in
  test_ops_torch_bits.py): within 5 ulp + 5.5 |x| u of the exact function (4.65 ulp above 0; below, 1 + erf
  cancels, 5.33 units of |x| u). Against torch the bound is qrt's plus torch's own error, measured the same
  way on every ATen CPU capability (default, avx2, avx512): 3 ulp, plus where torch's formulas lose: its
  sigmoid and silu give 0 below -88.7 (2^-126 |x| covers what it loses), its tanh form's 1 + tanh(u) cancels
  (1.25 |x| u); its gelu is qrt's on AVX-512 CPUs, and oneDNN's other polynomial on others (measured with
  ONEDNN_MAX_CPU_ISA=AVX2: 7.6 ulp + 1.6 |x| u, so 8 ulp + 5.5 |x| u covers both).
- Reductions: summed in one fixed order (blocks of 256 added in order; in each, 16 lanes, element j in
  lane j % 16, lanes folded in halves), so a sum of n terms is within gamma(depth(n)) sum|x| of the exact
  sum, depth(n) = ceil(min(n, 256) / 16) + 3 + ceil(n / 256) - 1; torch's order is its own, within
  gamma(n - 1) sum|x| (any order of pairwise or recursive summation). sum and mean are also held bit for
  bit to a numpy model of that order (float32 numpy arithmetic is exact IEEE), which proves the order is the
  documented one; softmax and log_softmax (qrt's exp inside) are held to their derived bounds. layer_norm is
  torch's own order (Welford in 8 lanes, qrt/kernels/torch_layer_norm.h): bit for bit with torch's, and
  within the bound torch's steps hold.
- add, sub, mul, div: one IEEE operation per element, bit for bit with torch, broadcasting included.
- gelu, gelu_tanh, sigmoid, tanh, silu, log, sin, cos: every build's vector loop is the scalar function (float_math.h,
  torch_gelu.h: the oracle, also the GPU's code) bit for bit, on every float32 near each switch of formula
  and millions more.
- sin and cos (format version 12) are correctly rounded, held to numpy's float64 sin and cos rounded once
  (within half an ulp plus 2^-40 relative) on every 128th float32 of the whole range, and within 1 ulp of
  torch's (99.2% and 98.9% bit-equal there); NaN at infinities.
- ceil and floor (format version 13) are exact: bit for bit torch's on every 64th float32 of either sign and on
  zeros of both signs, infinities and the halves around them, on every build.
- log (format version 12) is msun's logf (qrt_logf, log_softmax's): within 1 ulp of the exact log on every
  positive float of a grid over the whole range, subnormals included (measured 0.87 ulp), and within 1 ulp of
  torch's log (Sleef's u10 on AVX-512 and AVX2, libm's on the default capability: 99.6% bit-equal over 2
  million values); 0, negatives, infinities and NaN as torch gives them.
- Every result is the same bits from a second call, from a non-contiguous copy of the input, at any thread
  count, from both builds of the kernels (plain C and AVX2 + FMA on x86-64), and for a reduction, from a
  transposed layout of the same values.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import qrt
from qrt import _kernels as K
from qrt.builder import GraphBuilder
from qrt.errors import FormatError

F = torch.nn.functional
U = 2.0**-24
SMALLEST_NORMAL = 2.0**-126
RELATIVE_FROM = 2.0**-120  # ulp bounds hold for exact results at least this large
RNG = np.random.default_rng(14)
_count = itertools.count()


def gamma(k) -> np.ndarray:
    k = np.asarray(k, np.float64)
    return k * U / (1 - k * U)


def _model(tmp_path, op: str, inputs: dict, attrs: dict | None = None) -> qrt.Model:
    """One node of op; inputs maps port -> shape list (a run-time input) or array (a stored tensor)."""
    b = GraphBuilder()
    ports = {p: v if isinstance(v, np.ndarray) else b.input(p, "float32", v) for p, v in inputs.items()}
    b.output(b.node(op, ports, attrs or {}))
    path = tmp_path / f"m{next(_count)}.qrt"
    b.save(path)
    return qrt.load(path)


def _free(rank: int) -> list:
    return [None] * rank


def _ulp(ref: np.ndarray) -> np.ndarray:
    _, e = np.frexp(np.maximum(np.abs(ref), RELATIVE_FROM))
    return np.ldexp(1.0, e - 24)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, except that any NaN matches any NaN (NaN payloads are outside the contract)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.array_equal(a.view(np.int32)[~both_nan], b.view(np.int32)[~both_nan]))


def _under(variant: str, fn):
    before = K._use_variant(variant)
    try:
        return fn()
    finally:
        K._use_variant(before)


# ------------------------------------------------------------ elementwise functions


def _grid() -> np.ndarray:
    top = int(np.float32(20).view(np.int32))
    spread = np.arange(0, top, 1024, dtype=np.int32).view(np.float32)
    gelu_one = float(np.uint32(0x40B15CEE).view(np.float32))  # gelu's erf is 1 from here; polynomials change at 1, 2, 4
    switches = [0.625, 1.0, 2.0, 4.0, gelu_one]
    around = [
        (np.float32(s).view(np.int32) + np.arange(-4096, 4096, dtype=np.int32)).view(np.float32) for s in switches
    ]
    parts = [np.linspace(-20, 20, 1 << 20, dtype=np.float32), spread, -spread,
             np.linspace(-120, 120, 1 << 20, dtype=np.float32), *around, *(-a for a in around)]
    return np.unique(np.concatenate(parts))


GRID = _grid()


def _sigmoid64(x):
    return 1 / (1 + np.exp(-x))


def _gelu64(x):
    return x * 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-x / math.sqrt(2))


def _gelu_tanh64(x):
    # x/2 (1 + tanh(u)) = x sigmoid(2u): the same function, without float64's own cancellation
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# op, attrs, float64 reference, torch, qrt's error and torch's own: (ulp, per |x| beyond it)
UNARY = {
    "sigmoid": ({}, _sigmoid64, torch.sigmoid, (2.5, 0.0), (3.0, SMALLEST_NORMAL)),
    "tanh": ({}, np.tanh, torch.tanh, (1.35, 0.0), (1.0, 0.0)),
    "silu": ({}, lambda x: x * _sigmoid64(x), F.silu, (2.5, 0.0), (3.0, SMALLEST_NORMAL)),
    "gelu": ({}, _gelu64, F.gelu, (5.0, 5.5 * U), (8.0, 5.5 * U)),
    "gelu_tanh": ({"approximate": "tanh"}, _gelu_tanh64, lambda t: F.gelu(t, approximate="tanh"), (3.0, 0.0),
                  (3.0, 1.25 * U)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_elementwise_functions_on_a_dense_grid(tmp_path, name, every_build):
    attrs, ref64, torch_fn, (bound, per_x), (torch_ulps, torch_per_x) = UNARY[name]
    op = "gelu" if name.startswith("gelu") else name
    x = GRID
    runs = {build: _under(v, lambda: _model(tmp_path, op, {"x": [None]}, attrs).run(x))
            for build, v in every_build.items()}
    y = runs[K.FloatOps().name]
    for build, other in runs.items():
        assert _same_bits(other, y), f"the {build} build differs"
    ref = ref64(x.astype(np.float64))
    err = np.abs(y.astype(np.float64) - ref)
    relative = np.abs(ref) >= RELATIVE_FROM
    ulps = (err - per_x * np.abs(x)) / _ulp(ref)
    print(f"{name}: max {ulps[relative].max():.3f} ulp beyond {per_x / U} |x| u (bound {bound}), "
          f"below 2^-120 max abs {err[~relative].max(initial=0):.3g}")
    assert ulps[relative].max() <= bound, x[relative][np.argmax(ulps[relative])]
    assert np.all(err[~relative] <= SMALLEST_NORMAL + per_x * np.abs(x[~relative]))
    t = torch_fn(torch.from_numpy(x)).numpy().astype(np.float64)
    allowed = ((bound + torch_ulps) * _ulp(ref) + (per_x + torch_per_x) * np.abs(x)
               + SMALLEST_NORMAL * ~relative)
    gap = np.abs(y - t)
    print(f"{name}: |qrt - torch| max {gap.max():.3g}, at most {(gap / allowed).max():.3f} of the bound")
    assert np.all(gap <= allowed), x[np.argmax(gap / allowed)]


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 3e38, -3e38, 88.8, -88.8,
                    104.0, -104.0, 200.0, -200.0], np.float32)


@pytest.mark.parametrize("name", list(UNARY))
def test_elementwise_special_values(tmp_path, name):
    """NaN in, NaN out; infinities and zeros as torch gives them, signed zeros included (gelu's erf form is
    torch's: NaN at either infinity, inf where x (1 + erf) overflows above 1.7e38); the rest within the bounds
    above."""
    attrs, _, torch_fn, (bound, per_x), (torch_ulps, torch_per_x) = UNARY[name]
    op = "gelu" if name.startswith("gelu") else name
    got = _model(tmp_path, op, {"x": [None]}, attrs).run(SPECIAL)
    want = torch_fn(torch.from_numpy(SPECIAL)).numpy()
    exact = np.isnan(want) | np.isinf(want) | np.isinf(SPECIAL) | (SPECIAL == 0)
    assert _same_bits(got[exact], want[exact]), (SPECIAL[exact], got[exact], want[exact])
    rest = ~exact
    allowed = ((bound + torch_ulps) * np.spacing(np.abs(want[rest]))
               + (per_x + torch_per_x) * np.abs(SPECIAL[rest]))
    assert np.all(np.abs(got[rest] - want[rest]) <= allowed + SMALLEST_NORMAL), (SPECIAL[rest], got[rest], want[rest])


def _cubic_root(v: float) -> float:
    """The x where gelu_tanh's argument 2u = sqrt(8/pi) (x + 0.044715 x^3) is v."""
    roots = np.roots([0.071354816272600248776, 0, 1.5957691216057307117, -v])
    return float(roots[np.abs(roots.imag) < 1e-9].real[0])


def _switches() -> list[float]:
    """The inputs where the scalar functions change formula or clamp, as x: gelu's polynomials (each from |x|'s
    bits 0x3de00001 + k 2^21, and 1 from 0x40b15cee), exp's clamps (-104, 87, 89), tanh's 0.625, x * sigmoid's
    tail (-80), gelu_tanh's clamp and tail (2u = 200, -80)."""
    gelu = np.array([0x3DE00001 + (k << 21) for k in range(25)] + [0x40B15CEE], np.uint32).view(np.float32)
    return ([float(v) for v in gelu] + [104.0, 87.0, 89.0, 43.5, 44.5, 52.0, 0.625, 80.0]
            + [_cubic_root(200.0), _cubic_root(80.0)])


def _oracle_inputs() -> np.ndarray:
    """Every float32 within 2^14 ulps of each switch, either sign; the subnormals' ends and a spread of them;
    signed zeros, infinities, NaN; 2^21 random bit patterns and 2^20 normal values scaled to the switches."""
    rng = np.random.default_rng(38)
    near = [(np.float32(s).view(np.int32) + np.arange(-(1 << 14), 1 << 14, dtype=np.int32)).view(np.float32)
            for s in _switches()]
    subnormal = np.concatenate([np.arange(1, 4096, dtype=np.int32), np.arange(0x7ff000, 0x800100, dtype=np.int32),
                                rng.integers(1, 0x800000, 1 << 14, dtype=np.int32)]).view(np.float32)
    special = np.array([0.0, np.inf, np.nan, np.finfo(np.float32).max], np.float32)
    bits = rng.integers(0, 1 << 32, 1 << 21, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = rng.standard_normal(1 << 20).astype(np.float32) * np.float32(8)
    half = np.concatenate([*near, subnormal, special, normal])
    return np.concatenate([half, -half, bits])


def test_log_within_an_ulp(tmp_path, every_build):
    """The log op against float64's log and torch's, on every 64th positive float (subnormals to the largest)."""
    x = np.arange(1, 0x7F800000, 64, dtype=np.int32).view(np.float32)
    runs = {build: _under(v, lambda: _model(tmp_path, "log", {"x": [None]}).run(x)) for build, v in every_build.items()}
    y = runs[K.FloatOps().name]
    for build, other in runs.items():
        assert _same_bits(other, y), f"the {build} build differs"
    ref = np.log(x.astype(np.float64))
    ulps = np.abs(y - ref) / _ulp(ref)
    print(f"log: max {ulps.max():.3f} ulp")
    assert ulps.max() < 1.0, x[np.argmax(ulps)]
    t = torch.log(torch.from_numpy(x)).numpy()
    apart = np.abs(y.view(np.int32).astype(np.int64) - t.view(np.int32))
    print(f"log: {np.mean(apart == 0):.4f} bit-equal to torch, max {apart.max()} ulp apart")
    assert apart.max() <= 1


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_correctly_rounded(tmp_path, name, every_build):
    """Every 128th float32 of either sign, subnormals to the largest: within half an ulp of float64's sin / cos
    (glibc's, reduced exactly) plus 2^-40 of the value, on every build alike; within 1 ulp of torch's."""
    half = np.arange(0, 0x7F800000, 128, dtype=np.int32).view(np.float32)
    x = np.concatenate([half, -half, np.float32([16367173 * 2.0**72, 3.4e38, np.pi / 4, 0.7853982])])
    runs = {build: _under(v, lambda: _model(tmp_path, name, {"x": [None]}).run(x)) for build, v in every_build.items()}
    y = runs[K.FloatOps().name]
    for build, other in runs.items():
        assert _same_bits(other, y), f"the {build} build differs"
    ref = getattr(np, name)(x.astype(np.float64))
    gap = np.abs(y - ref) - np.abs(ref) * 2.0**-40
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    print(f"{name}: max {(np.abs(y - ref) / ulp).max():.4f} ulp")
    assert np.all(gap <= ulp / 2), x[np.argmax(gap / ulp)]
    t = getattr(torch, name)(torch.from_numpy(x)).numpy()
    apart = np.abs(y.view(np.int32).astype(np.int64) - t.view(np.int32))
    print(f"{name}: {np.mean(apart == 0):.4f} bit-equal to torch, max {apart.max()} ulp apart")
    assert apart.max() <= 1


@pytest.mark.parametrize("name", ["ceil", "floor"])
def test_ceil_and_floor_are_torchs(tmp_path, name, every_build):
    """Every 64th float32 of either sign (subnormals, the integers' edge at 2^23 and past it), zeros of both
    signs, values just inside (-1, 0) and (0, 1), halves, infinities and NaN: torch's bits on every build
    (-0.0 where torch gives it: ceil of -0.5)."""
    half = np.arange(0, 0x7F800000, 64, dtype=np.int32).view(np.float32)
    edges = np.float32([0.5, 1.5, 2.5, 1 - 2**-24, 2**23 - 0.5, 2**23 + 1, 2**24 + 2, 1e-45, np.inf, np.nan])
    x = np.concatenate([half, -half, edges, -edges])
    want = getattr(torch, name)(torch.from_numpy(x)).numpy()
    for build, v in every_build.items():
        got = _under(v, lambda: _model(tmp_path, name, {"x": [None]}).run(x))
        assert _same_bits(got, want), build


@pytest.mark.parametrize("name", ["log", "sin", "cos"])
def test_log_sin_cos_special_values(tmp_path, name):
    """Zeros, infinities, NaN, negatives (log) and subnormals as torch gives them, bit for bit."""
    x = np.array([0.0, -0.0, -1e-45, -1.0, -np.inf, np.inf, np.nan, 1.0, 1e-45, 3e-39], np.float32)
    if name != "log":
        x = x[np.isin(x, [0.0, np.inf, -np.inf]) | np.isnan(x) | (np.abs(x) < 1e-38)]
    got, want = _model(tmp_path, name, {"x": [None]}).run(x), getattr(torch, name)(torch.from_numpy(x)).numpy()
    assert _same_bits(got, want), (got, want)


@pytest.mark.parametrize("name", [*UNARY, "log", "sin", "cos"])
def test_vector_loops_are_the_scalar_functions(name, every_build):
    """Each build's loop (gelu_tanh in two passes, SIMD where the build has it) against the scalar function of
    one element, bit for bit, on ~4.3 million inputs dense at every
    switch of formula."""
    x = _oracle_inputs()
    want = np.empty_like(x)
    K.float_unary_oracle(name, x, want)
    for build, variant in every_build.items():
        got = np.empty_like(x)
        _under(variant, lambda got=got: K.FloatOps().unary(name, x, got))
        differ = ~((got.view(np.int32) == want.view(np.int32)) | (np.isnan(got) & np.isnan(want)))
        assert not differ.any(), (build, x[differ][:8], got[differ][:8], want[differ][:8])


@pytest.mark.parametrize("name", [*UNARY, "log", "sin", "cos"])
def test_vector_loops_tails_are_the_scalar_functions(name, every_build):
    """Rows of every length 1 to 40 (the tails after vectors of 16 and of 8, alone and after whole vectors), their
    elements the switches' neighbours, NaN, infinities, zeros and subnormals: each element bit for bit the scalar
    function's, and nothing written past the row (its next element keeps its sentinel)."""
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-39], np.float32)
    pool = np.concatenate([specials, np.float32(_switches()), -np.float32(_switches())])
    x = np.resize(pool, 41).astype(np.float32)
    want = np.empty_like(x)
    K.float_unary_oracle(name, x, want)
    for build, variant in every_build.items():
        for n in range(1, 41):
            for start in (0, 1):  # the specials in every lane
                xs = np.roll(x, -start)[:n].copy()
                got = np.full(n + 1, 7.0, np.float32)
                _under(variant, lambda xs=xs, got=got, n=n: K.FloatOps().unary(name, xs, got[:n]))
                ref = np.roll(want, -start)[:n]
                same = (got[:n].view(np.int32) == ref.view(np.int32)) | (np.isnan(got[:n]) & np.isnan(ref))
                assert same.all() and got[n] == 7.0, (build, name, n, start)


# ------------------------------------------------------------ reductions: a numpy model of qrt's order


def lane_sum(x: np.ndarray) -> np.ndarray:
    """Sum of the last axis in qrt's order, in float32: blocks of 256; in each, element j in lane j % 16,
    lanes folded in halves; the blocks' sums added in order."""
    total = np.zeros(x.shape[:-1], np.float32)
    for j0 in range(0, x.shape[-1], 256):
        block = x[..., j0 : j0 + 256]
        n = block.shape[-1]
        padded = np.zeros(x.shape[:-1] + (-(-n // 16) * 16,), np.float32)  # adding +0 changes no lane
        padded[..., :n] = block
        acc = np.zeros(x.shape[:-1] + (16,), np.float32)
        for j in range(0, n, 16):
            acc = acc + padded[..., j : j + 16]
        half = 8
        while half:
            acc = acc[..., :half] + acc[..., half : 2 * half]
            half //= 2
        total = total + acc[..., 0]
    return total


def depth(n: int) -> int:
    """The most roundings any term of a sum of n goes through in qrt's order (the first add, 0 + x, is exact
    but counted)."""
    return -(-min(n, 256) // 16) + 3 + max(-(-n // 256) - 1, 0)


# torch's layer_norm kernel with fma (its AVX2 one, which its AVX512 capability runs too): qrt gives its bits
TORCH_LN_FMA = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def torch_layer_norm(x: np.ndarray, w, b, eps: float) -> np.ndarray:
    """torch's layer_norm over the last axis."""
    w, b = (None if a is None else torch.from_numpy(a) for a in (w, b))
    return F.layer_norm(torch.from_numpy(x), x.shape[-1:], w, b, eps).numpy()


def layer_norm_bound(x: np.ndarray, w, b, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(the exact function of the float32 inputs, the bound torch's steps hold against it) over the last axis: k
    the roundings a term of its sums may go through (n - 1, any order),

    mu with |mu - mean| <= e_mu = gamma(k + 1) sum|x| / n; d_j = x_j - mu: |d_j - (x_j - mean)| <= e_mu (1 + u) +
    u |x_j - mean|; var: the e_mu terms cancel to first order (sum of x_j - mean is 0), so var is within
    (2 u + gamma(k + 2)) var + e_mu^2; r = 1 / sqrt(var + eps) then within rel_r = 3.5 u + gamma(k + 2) / 2 + the
    e_mu^2 term; y_j: within |w| (r |d_j - dx_j| + |dx_j| r (rel_r + 2 u)) + u |y|, plus 2 u (|x_j| + |mu|) r |w|
    for a product of x_j and r formed before the centring."""
    n = x.shape[-1]
    xd = x.astype(np.float64)
    mean = xd.mean(-1, keepdims=True)
    dx = xd - mean
    var = (dx * dx).mean(-1, keepdims=True)
    r = 1 / np.sqrt(var + np.float64(np.float32(eps)))
    wd = np.ones(n) if w is None else w.astype(np.float64)
    bd = np.zeros(n) if b is None else b.astype(np.float64)
    ref = dx * r * wd + bd
    k = n - 1
    e_mu = gamma(k + 1) * np.abs(xd).sum(-1, keepdims=True) / n
    rel_r = 3.5 * U + gamma(k + 2) / 2 + e_mu**2 / (var + eps)
    steps = np.abs(wd) * (r * (e_mu * (1 + U) + U * np.abs(dx)) + np.abs(dx) * r * (rel_r + 2 * U)) + U * np.abs(ref)
    return ref, steps + 2 * U * (np.abs(xd) + np.abs(mean)) * r * np.abs(wd)


def assert_torchs_layer_norm(got: np.ndarray, x: np.ndarray, w, b, eps: float) -> None:
    """got is torch's layer_norm over the last axis: its bits where torch runs its fma kernel; under its
    `default` capability (the same steps without fma), both within layer_norm_bound of the exact function."""
    want = torch_layer_norm(x, w, b, eps)
    if TORCH_LN_FMA:
        assert _same_bits(got, want)
    else:
        ref, bound = layer_norm_bound(x, w, b, eps)
        assert np.all(np.abs(got - ref) <= bound) and np.all(np.abs(want - ref) <= bound)


SHAPES = [(1, 1), (1, 7), (3, 33), (2, 5, 17), (4, 257, 3), (1, 4099), (2, 3, 2, 5)]


def _data(shape: tuple, kind: str) -> np.ndarray:
    x = RNG.standard_normal(shape)
    if kind == "offset":  # mean far from 0: sums cancel, layer_norm centres
        x = x + 1000
    elif kind == "wide":
        x = x * np.exp(RNG.uniform(-10, 10, shape))
    return x.astype(np.float32)


@pytest.mark.parametrize("kind", ["normal", "offset", "wide"])
@pytest.mark.parametrize("shape", SHAPES)
def test_sum_and_mean(tmp_path, shape, kind):
    x = _data(shape, kind)
    for dims in [[d] for d in range(len(shape))] + [list(range(len(shape)))] + ([[0, 2]] if len(shape) > 2 else []):
        for op, keepdim in itertools.product(("sum", "mean"), (False, True)):
            got = _model(tmp_path, op, {"x": _free(len(shape))}, {"dims": dims, "keepdim": keepdim}).run(x)
            want = getattr(torch, op)(torch.from_numpy(x), dims, keepdim=keepdim).numpy()
            assert got.shape == want.shape and got.dtype == np.float32
            # the numpy model: the reduced dimensions moved last, in order, flattened
            kept = [d for d in range(len(shape)) if d not in dims]
            flat = np.ascontiguousarray(x.transpose(kept + dims)).reshape([shape[d] for d in kept] + [-1])
            n = flat.shape[-1]
            model = np.asarray(lane_sum(flat) if op == "sum" else lane_sum(flat) / np.float32(n))
            assert _same_bits(got.reshape(model.shape), model), (dims, op)
            # bounds: qrt's order, and any order for torch (mean: one more rounding on each side)
            scale = np.abs(flat.astype(np.float64)).sum(-1) / (1 if op == "sum" else n)
            exact = flat.astype(np.float64).sum(-1) / (1 if op == "sum" else n)
            extra = 0 if op == "sum" else 1
            ours = gamma(depth(n) + extra) * scale
            assert np.all(np.abs(got.reshape(exact.shape) - exact) <= ours)
            assert np.all(np.abs(got.reshape(exact.shape) - want.reshape(exact.shape)) <=
                          ours + gamma(max(n - 1, 0) + extra) * scale)


def test_sum_and_mean_of_an_empty_dimension(tmp_path):
    x = np.zeros((3, 0, 2), np.float32)
    for op in ("sum", "mean"):
        got = _model(tmp_path, op, {"x": [None, None, 2]}, {"dims": [1]}).run(x)
        want = getattr(torch, op)(torch.from_numpy(x), 1).numpy()
        assert _same_bits(got, want), (op, got, want)


@pytest.mark.parametrize("kind", ["normal", "offset", "wide"])
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[-1] > 1] + [(5, 1)])
def test_layer_norm(tmp_path, shape, affine, kind):
    """torch's layer_norm (qrt runs its steps: test_ops_torch_bits.py holds it to torch's bits at many more
    sizes), and within the bound torch's steps hold against the exact function (layer_norm_bound)."""
    x = _data(shape, kind)
    n = shape[-1]
    w = RNG.standard_normal(n).astype(np.float32) if affine != "none" else None
    b = RNG.standard_normal(n).astype(np.float32) if affine == "both" else None
    eps = 1e-5
    inputs = {"x": [None] + list(shape[1:]), **({"weight": w} if w is not None else {}),
              **({"bias": b} if b is not None else {})}
    got = _model(tmp_path, "layer_norm", inputs, {"eps": eps}).run(x)
    assert_torchs_layer_norm(got, x, w, b, eps)
    ref, bound = layer_norm_bound(x, w, b, eps)
    assert np.all(np.abs(got - ref) <= bound)


def test_layer_norm_of_a_sum_is_the_layer_norm_of_the_add(every_build):
    """FloatOps.layer_norm(x, ..., add=r) (the plan's residual add fused into layer_norm) is layer_norm of x + r as
    the add gives it (one IEEE addition, numpy's), bit for bit on every build: row lengths across the 8-lane and
    16-value chunks' tails and a long row, row counts across the 8-row groups, weight and bias or not, inf and NaN
    in the sums."""
    rng = np.random.default_rng(38)
    for build, variant in every_build.items():
        ops = _under(variant, K.FloatOps)
        for n, rows in [(1, 3), (7, 9), (8, 1), (37, 13), (129, 17), (384, 8), (5000, 2)]:
            x, r = (rng.standard_normal((2, rows, n)) * 3).astype(np.float32)
            x[0, 0], r[-1, -1] = np.inf, np.nan
            w, b = rng.standard_normal((2, n)).astype(np.float32)
            for weight, bias in [(w, b), (None, b), (w, None), (None, None)]:
                want, got = np.empty_like(x), np.empty_like(x)
                ops.layer_norm(x + r, weight, bias, 1e-5, want)
                ops.layer_norm(x, weight, bias, 1e-5, got, add=r)
                assert _same_bits(got, want), (build, n, rows, weight is None, bias is None)
        with pytest.raises(ValueError, match="shape mismatch"):
            ops.layer_norm(x, w, b, 1e-5, np.empty_like(x), add=r[:1])


def test_layer_norm_of_several_dims_and_free_dims(tmp_path):
    x = _data((2, 3, 4, 5), "normal")
    w = RNG.standard_normal((4, 5)).astype(np.float32)
    m = _model(tmp_path, "layer_norm", {"x": [None, None, 4, 5], "weight": w}, {"normalized_dims": 2, "eps": 0.1})
    got = m.run(x)
    assert_torchs_layer_norm(got.reshape(2, 3, 20), x.reshape(2, 3, 20), w.reshape(20), None, 0.1)
    free = _model(tmp_path, "layer_norm", {"x": [None, None]}, {})  # no weight: any width
    for width in (1, 6, 100):
        x = _data((3, width), "normal")
        assert_torchs_layer_norm(free.run(x), x, None, None, 1e-5)
    weighted = _model(tmp_path, "layer_norm", {"x": [None, None], "weight": w[0]}, {})
    with pytest.raises(ValueError, match=r"last 1 dimension\(s\) are \[4\], expected \[5\] \(the weight's shape\)"):
        weighted.run(np.zeros((2, 4), np.float32))


def _softmax_reference(x: np.ndarray, dim: int) -> tuple[np.ndarray, ...]:
    xd = x.astype(np.float64)
    m = xd.max(dim, keepdims=True)
    d = xd - m
    e = np.exp(d)
    s = e.sum(dim, keepdims=True)
    return d, e / s, np.log(s), (e * np.abs(d)).sum(dim, keepdims=True) / s


@pytest.mark.parametrize("kind", ["normal", "wide"])
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_and_log_softmax(tmp_path, shape, kind):
    """Bounds derived from qrt's steps, d_j = fl(x_j - max), e_j = exp(d_j), S = lane sum, y_j = e_j / S:

    relative to the exact softmax y_j, e_j is off by u |d_j| (the rounding of d_j) and 2 u (exp, 1 ulp),
    S by the e-weighted mean of those, u (D + 2) with D = sum e_j |d_j| / S, plus gamma(depth(n)), and the
    division by u: |qrt - y_j| <= y_j (u (|d_j| + D + 5) + gamma(depth(n))).
    log_softmax y_j = fl(d_j - fl(log S)): within u |d_j| + (S's relative error) + 2 u log S + u |y_j|.
    Against torch, which rounds d_j the same way: the two exps (2 u each), the two sums (gamma(depth(n)) and
    gamma(n - 1)) and the final steps (u and 2 u): y_j (11 u + both sums), and for log_softmax
    4 u + both sums + 4 u log S + 2 u |y_j|. 2^-126 absolute covers results near underflow.
    """
    x = _data(shape, kind)
    for dim in range(len(shape)):
        n = shape[dim]
        d, y, log_s, big_d = _softmax_reference(x, dim)
        sums = gamma(depth(n)) + gamma(max(n - 1, 0))
        for op in ("softmax", "log_softmax"):
            got = _model(tmp_path, op, {"x": _free(len(shape))}, {"dim": dim}).run(x).astype(np.float64)
            want = getattr(torch, op)(torch.from_numpy(x), dim).numpy().astype(np.float64)
            if op == "softmax":
                ref = y
                ours = y * (U * (np.abs(d) + big_d + 5) + gamma(depth(n))) + SMALLEST_NORMAL
                theirs = y * (11 * U + sums) + SMALLEST_NORMAL
            else:
                ref = d - log_s
                ours = U * (np.abs(d) + big_d + 4 + 2 * log_s + np.abs(ref)) + gamma(depth(n))
                theirs = U * (4 + 4 * log_s + 2 * np.abs(ref)) + sums
            assert np.all(np.abs(got - ref) <= ours), (op, dim, np.max(np.abs(got - ref) / ours))
            assert np.all(np.abs(got - want) <= theirs), (op, dim, np.max(np.abs(got - want) / theirs))


def test_softmax_rows_with_infinities_and_nan_are_torchs(tmp_path):
    """A row holding +inf or NaN, or only -inf, is NaN throughout (x - max is NaN somewhere), as in torch;
    -inf elements of an otherwise finite row give 0 (log_softmax -inf)."""
    inf, nan = np.inf, np.nan
    x = np.array([[inf, 1, 2], [-inf, -inf, -inf], [nan, 0, 1], [-inf, 0, 1], [3e38, -3e38, 0], [inf, inf, 1]],
                 np.float32)
    for op in ("softmax", "log_softmax"):
        got = _model(tmp_path, op, {"x": [None, 3]}, {"dim": 1}).run(x)
        want = getattr(torch, op)(torch.from_numpy(x), 1).numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        assert np.allclose(got[finite], want[finite], rtol=1e-6, atol=1e-30)


def test_long_rows_with_infinities_nan_and_signed_zeros(tmp_path, every_build):
    """Rows of 37: 32 elements go through the vectorised lanes, 5 through the tail. A NaN or +inf in either
    part makes a softmax row NaN, only -inf makes it NaN, -inf elsewhere gives 0; a sum of -0.0 and +0.0 is
    the lane order's (+0.0), as the numpy model gives; every build the same bits."""
    inf, nan = np.inf, np.nan
    rows = []
    for at in (3, 20, 31, 32, 36):  # lane 3 and 4 of the first and second vector, the last vector lane, the tail
        for special in (nan, inf, -inf):
            row = RNG.standard_normal(37).astype(np.float32)
            row[at] = special
            rows.append(row)
    rows += [np.full(37, -inf, np.float32), np.full(37, -0.0, np.float32),
             np.where(np.arange(37) % 2, -0.0, 0.0).astype(np.float32)]
    x = np.stack(rows)
    def run(op: str, attrs: dict) -> dict:  # each build's result: a model loaded under its variant
        return {build: _under(variant, lambda: _model(tmp_path, op, {"x": [None, 37]}, attrs).run(x))
                for build, variant in every_build.items()}

    for op in ("softmax", "log_softmax"):
        got = run(op, {"dim": 1})
        want = getattr(torch, op)(torch.from_numpy(x), 1).numpy()
        for build, y in got.items():
            assert np.array_equal(np.isnan(y), np.isnan(want)), (op, build)
            assert np.array_equal(np.isinf(y), np.isinf(want)), (op, build)
            finite = np.isfinite(want)
            assert np.allclose(y[finite], want[finite], rtol=1e-6, atol=1e-30), (op, build)
            assert _same_bits(y, next(iter(got.values()))), (op, build)
    for build, got in run("sum", {"dims": [1], "keepdim": False}).items():
        assert _same_bits(got, lane_sum(x)), build
        assert not np.any(np.signbit(got[-2:])), build  # +0.0 + -0.0 is +0.0


@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 94, 301])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_rows_read_and_write_past_a_row_only_into_the_next(every_build, n, log):
    """A row with rows after it reads its reductions' last lanes past its end (masked off) and writes
    log_softmax's last block into the next row, which writes it again: the same bits as each row alone
    (no row after it, every tail lane by lane), and nothing written past the last row."""
    x = (RNG.standard_normal((35, n, 1)) * 4).astype(np.float32)
    x[3, n // 2] = -np.inf

    def run():
        ops = K.FloatOps()
        y = np.full((36, n, 1), 7.0, np.float32)  # a row past the output, which nothing may write
        ops.softmax(log, x, y[:35])
        alone = np.empty_like(x)
        for r in range(35):
            ops.softmax(log, x[r : r + 1], alone[r : r + 1])
        return y, alone

    for build, variant in every_build.items():
        y, alone = _under(variant, run)
        assert (y[35] == 7.0).all(), build
        assert _same_bits(y[:35], alone), build


# ------------------------------------------------------------ add, sub, mul, div


BROADCASTS = [
    ((3, 5), (3, 5)),
    ((1,), (7,)),
    ((4, 1, 6), (5, 1)),
    ((2, 3, 17), (17,)),
    ((1, 9), (8, 1)),
    ((), (2, 3)),
    ((6, 1, 1, 2), (1, 3, 4, 1)),
]
ARITH = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def _operand(shape: tuple) -> np.ndarray:
    a = np.asarray(RNG.standard_normal(shape) * 1e3, np.float32)
    if a.size >= 6:  # IEEE corners: signed zeros, infinities, NaN, the subnormals and overflow
        a.flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]
        a.flat[-1] = 3e38
    return a


@pytest.mark.parametrize("op", list(ARITH))
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
def test_arithmetic_is_torchs_bit_for_bit(tmp_path, op, a_shape, b_shape):
    a, b = _operand(a_shape), _operand(b_shape)
    want = ARITH[op](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for swap in (False, True):
        aa, bb = (b, a) if swap else (a, b)
        w = ARITH[op](torch.from_numpy(aa), torch.from_numpy(bb)).numpy() if swap else want
        free = _model(tmp_path, op, {"a": _free(aa.ndim), "b": _free(bb.ndim)})
        fixed = _model(tmp_path, op, {"a": list(aa.shape), "b": list(bb.shape)})
        assert fixed.outputs[0].shape == w.shape
        for model in (free, fixed):
            got = model.run({"a": aa, "b": bb})
            assert _same_bits(got, w), (op, aa.shape, bb.shape)
        stored = _model(tmp_path, op, {"a": list(aa.shape), "b": bb})  # a constant operand: x * 0.5
        assert _same_bits(stored.run(aa), w)


def test_division_by_zero_and_scalars(tmp_path):
    x = np.array([1, -1, 0, -0.0, np.inf, np.nan, 3], np.float32)
    for divisor in (0.0, -0.0, 3.0, np.inf):
        m = _model(tmp_path, "div", {"a": [None], "b": np.array(divisor, np.float32)})
        assert _same_bits(m.run(x), (torch.from_numpy(x) / divisor).numpy())
    half = _model(tmp_path, "mul", {"a": [None], "b": np.array(0.5, np.float32)})
    assert _same_bits(half.run(x), (torch.from_numpy(x) * 0.5).numpy())
    one_minus = _model(tmp_path, "sub", {"a": np.array(1, np.float32), "b": [None]})
    assert _same_bits(one_minus.run(x), (1 - torch.from_numpy(x)).numpy())


def test_broadcast_shapes_at_load_and_run(tmp_path):
    m = _model(tmp_path, "add", {"a": [None, 1, 4], "b": [3, None]})
    assert m.outputs[0].shape == (None, 3, 4)  # free against 1 stays free; a free one against 4 is 4
    assert m.run({"a": np.ones((2, 1, 4), np.float32), "b": np.ones((3, 1), np.float32)}).shape == (2, 3, 4)
    with pytest.raises(ValueError, match=r"node .*a has shape \[2, 1, 4\] and b has shape \[3, 5\]"):
        m.run({"a": np.ones((2, 1, 4), np.float32), "b": np.ones((3, 5), np.float32)})
    with pytest.raises(FormatError, match=r"do not broadcast: 4 against 5 at dimension 1"):
        _model(tmp_path, "mul", {"a": [2, 4], "b": [5]})


# ------------------------------------------------------------ the bits depend on nothing but the values


def _every_op(tmp_path, shape: tuple) -> dict:
    rank = len(shape)
    models = {name: _model(tmp_path, "gelu" if name.startswith("gelu") else name, {"x": _free(rank)}, UNARY[name][0])
              for name in UNARY}
    for op, dim in itertools.product(("softmax", "log_softmax"), range(rank)):
        models[f"{op}{dim}"] = _model(tmp_path, op, {"x": _free(rank)}, {"dim": dim})
    for op, dim in itertools.product(("sum", "mean"), range(rank)):
        models[f"{op}{dim}"] = _model(tmp_path, op, {"x": _free(rank)}, {"dims": [dim]})
    models["layer_norm"] = _model(tmp_path, "layer_norm", {"x": _free(rank)}, {})
    models["mul"] = _model(tmp_path, "mul", {"a": _free(rank), "b": [shape[-1]]})
    return models


def _run(model, x):
    return model.run({"a": x, "b": np.linspace(-2, 2, x.shape[-1], dtype=np.float32)}) if "a" in [
        s.name for s in model.inputs] else model.run(x)


def test_results_depend_on_the_values_only(tmp_path):
    shape = (37, 129, 33)  # 157k elements: calls split across 3 threads by rows (or elements)
    x = _data(shape, "wide")
    models = _every_op(tmp_path, shape)
    first = {name: _run(m, x) for name, m in models.items()}
    strided = np.empty(shape + (2,), np.float32)[..., 0]  # a non-contiguous copy of x
    strided[...] = x
    old = K.get_num_threads()
    try:
        for threads in (1, 3):
            K.set_num_threads(threads)
            for name, m in models.items():
                assert _same_bits(_run(m, x), first[name]), (name, threads)
                assert _same_bits(_run(m, strided), first[name]), (name, "non-contiguous")
    finally:
        K.set_num_threads(old)


@pytest.mark.parametrize("op", list(ARITH))
def test_binary_ops_split_across_threads_past_leading_ones(op):
    """The threads split the first output dimension that is not 1 (here 300 rows of 257, both operands
    broadcast in turn): every split is the same elements, and each is one IEEE operation, numpy's."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1, 300, 257)).astype(np.float32)
    cases = [(a, rng.standard_normal((300, 1)).astype(np.float32)), (rng.standard_normal(257).astype(np.float32), a),
             (a, rng.standard_normal((1, 1, 300, 257)).astype(np.float32))]
    numpy_op = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    old = K.get_num_threads()
    try:
        for threads in (1, 2, 3):
            K.set_num_threads(threads)
            for x, z in cases:
                want = numpy_op(x, z)
                got = np.empty_like(want)
                K.FloatOps().binary(op, x, z, got)
                assert _same_bits(got, want), (op, threads, x.shape, z.shape)
    finally:
        K.set_num_threads(old)


def test_reductions_do_not_depend_on_the_layout(tmp_path):
    """The reduced dimension first or last in memory, or split: the same order, the same bits."""
    x = _data((23, 301), "wide")
    xt = np.ascontiguousarray(x.T)
    for op in ("sum", "mean", "softmax", "log_softmax"):
        attrs = (lambda d: {"dims": [d]}) if op in ("sum", "mean") else (lambda d: {"dim": d})
        last = _model(tmp_path, op, {"x": [None, None]}, attrs(1)).run(x)
        first = _model(tmp_path, op, {"x": [None, None]}, attrs(0)).run(xt)
        assert _same_bits(last, first.T if first.ndim == 2 else first), op
    z = x.reshape(23, 7, 43)
    split = _model(tmp_path, "sum", {"x": [None, None, None]}, {"dims": [1, 2]}).run(z)
    assert _same_bits(split, _model(tmp_path, "sum", {"x": [None, None]}, {"dims": [1]}).run(x))
    apart = _model(tmp_path, "sum", {"x": [None, None, None]}, {"dims": [0, 2]}).run(z)
    moved = np.ascontiguousarray(z.transpose(1, 0, 2))  # [7, 23, 43]: the reduced dims adjacent, in order
    assert _same_bits(apart, _model(tmp_path, "sum", {"x": [None, None, None]}, {"dims": [1, 2]}).run(moved))


def test_every_build_gives_the_same_bits(tmp_path, every_build):
    """Plain C (libm's correctly rounded fmaf), AVX2 + FMA and AVX-512 code, each where the CPU runs it."""
    x = _data((5, 67, 3), "wide")
    results = {}
    for build, variant in every_build.items():
        results[build] = _under(variant, lambda: {n: _run(m, x) for n, m in _every_op(tmp_path, x.shape).items()})
    for build, res in results.items():
        for name in res:
            assert _same_bits(res[name], results[K.FloatOps().name][name]), (build, name)


# ------------------------------------------------------------ load-time checks


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "message"),
    [
        ("softmax", {"x": [2, 3]}, {"dim": 2}, "dim 2 is out of range"),
        ("softmax", {"x": [2, 3]}, {}, "missing attribute 'dim'"),
        ("gelu", {"x": [2]}, {"approximate": "erf"}, "must be one of"),
        ("sum", {"x": [2, 3]}, {"dims": []}, "at least one"),
        ("mean", {"x": [2, 3]}, {"dims": [1, 1]}, "must not repeat"),
        ("mean", {"x": [2, 3]}, {"dims": [True]}, "list of integers"),
        ("sum", {"x": [2, 3]}, {"dims": [2]}, "out of range"),
        ("layer_norm", {"x": [2, 3]}, {"normalized_dims": 3}, r"normalized_dims must lie in \[1, 2\]"),
        ("layer_norm", {"x": [2, 3]}, {"eps": -1.0}, "eps must be a finite float32 value >= 0"),
        ("layer_norm", {"x": [2, 3]}, {"eps": 1e39}, "eps must be a finite float32 value >= 0"),
        ("layer_norm", {"x": [2, 3], "weight": np.ones(4, np.float32)}, {}, "weight must have the shape"),
    ],
)
def test_bad_nodes_are_format_errors(tmp_path, op, inputs, attrs, message):
    with pytest.raises(FormatError, match=message):
        _model(tmp_path, op, inputs, attrs)


def _stats(*lengths: int) -> dict:
    return {p: np.ones(n, np.float32) for p, n in zip(("mean", "var", "weight", "bias"), lengths)}


@pytest.mark.parametrize(
    ("x", "stats", "attrs", "message"),
    [
        ([5], _stats(5, 5, 5, 5), {}, r"x must have a batch and a channel dimension \(rank 2 or more\), got "
                                      r"float32\[5\]"),
        ([2, 3], _stats(4, 3, 3, 3), {}, r"mean must have one value per channel of x \(dimension 1\), float32\[3\]"),
        ([2, 3, 7], _stats(3, 3, 3, 7), {}, r"bias must have one value per channel"),
        ([2, None], _stats(3, 3, 4, 3), {}, r"mean, var, weight and bias must have the same shape"),
        ([2, 3], _stats(3, 3, 3, 3), {"eps": -1e-5}, "eps must be a finite float32 value >= 0"),
        ([2, 3], _stats(3, 3, 3, 3), {"eps": 1e39}, "eps must be a finite float32 value >= 0"),
    ],
)
def test_bad_batch_norms_are_format_errors(tmp_path, x, stats, attrs, message):
    with pytest.raises(FormatError, match=message):
        _model(tmp_path, "batch_norm", {"x": x, **stats}, attrs)


def test_batch_norm_channels_checked_at_run_time(tmp_path):
    """x's channels free in the graph: a call with other than the stored count is a ValueError naming both."""
    model = _model(tmp_path, "batch_norm", {"x": [None, None], **_stats(3, 3, 3, 3)})
    assert model.run(np.ones((2, 3), np.float32)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"x has 4 channels \(dimension 1 of \[2, 4\]\), expected 3"):
        model.run(np.ones((2, 4), np.float32))


def test_layer_norm_weight_and_bias_must_agree(tmp_path):
    """x's free dims let each fit alone; the kernel reads them in one layout, so they must match."""
    g = GraphBuilder()
    x = g.input("x", "float32", [None, None, None])
    ports = {"x": x, "weight": np.ones((2, 3), np.float32), "bias": np.zeros((3, 2), np.float32)}
    g.output(g.node("layer_norm", ports, {"normalized_dims": 2}))
    with pytest.raises(FormatError, match=r"weight and bias must have the same shape"):
        g.save(tmp_path / "ln.qrt")
