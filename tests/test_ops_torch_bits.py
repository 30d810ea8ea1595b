"""layer_norm, batch_norm and gelu (erf form) give torch 2.13's CPU bits, on every kernel build this CPU runs.

- layer_norm: torch registers its CPU kernel for the AVX2 capability only, which its AVX512 capability runs too
  (docs/NUMERICS.md, section 8), so torch's bits are the same under ATEN_CPU_CAPABILITY=avx2 and avx512; its
  `default` capability (CPUs without AVX2) compiles the same code without fma, and is held to the bound of
  test_ops_float.py's test_layer_norm instead. Checked bit for bit at row lengths that reach every part of its
  order: the scalar tail alone (n < 8), one to many chunks of 16 vectors of 8 (8 to 70000: cascades up to 10
  levels deep), BERT's rows of 384 and 1536, eps 1e-12 and 1e-5, with and without weight and bias; rows far
  from 0, of wide range, and holding infinities, NaN and signed zeros at the sizes that reach each part.
- batch_norm (inference): torch's kernel collects alpha = fl(1 / sqrt(var + eps)) * weight and beta =
  fma(-mean, alpha, bias) per channel, then fma(x, alpha, beta) an element, where its build contracts (its AVX2
  and AVX512 capabilities; docs/NUMERICS.md section 8): bit for bit there, at [batch, channels] and with
  positions after the channels (BatchNorm2d), batch 1 and more, thread splits included, eps from 1e-12 to 0.1,
  zero variances, affine and not, inputs with infinities, NaN, subnormals and signed zeros. torch's `default`
  capability rounds the products and sums separately: held to the bound below instead.
- gelu: torch hands float tensors of two or more elements to oneDNN, whose kernel on AVX-512 CPUs is the one qrt
  computes (checked on all 2^32 floats once, see qrt/kernels/torch_gelu.h; here on every float within 2^12 ulps of
  each of its switches of polynomial, subnormals, infinities, NaN, the largest floats and 2^20 random bit
  patterns). Where oneDNN does not run its AVX-512 kernel (no AVX-512, or ONEDNN_MAX_CPU_ISA below it), torch's
  gelu is oneDNN's Abramowitz-Stegun form: measured within 8 ulp + 6.5 |x| u of qrt over test_ops_float.py's grid
  (ONEDNN_MAX_CPU_ISA=AVX2), the bound the finite inputs are held to there (that form gives +inf at +inf).
"""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
import torch
from test_ops_float import TORCH_LN_FMA, U, _model, _same_bits, _ulp, _under

from qrt import _kernels as K

F = torch.nn.functional
RNG = np.random.default_rng(57)


def _onednn_runs_avx512() -> bool:
    """Whether oneDNN picks its AVX-512 kernels here: an x86-64 CPU with AVX-512 F, BW, VL and DQ, not capped
    below by ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA)."""
    if platform.machine() not in ("x86_64", "AMD64") or not os.path.exists("/proc/cpuinfo"):
        return False
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags) and (cap == "ALL" or "AVX512" in cap)


def _gelu_inputs() -> np.ndarray:
    switches = np.array([0x3DE00001 + (k << 21) for k in range(25)] + [0x40B15CEE], np.int32)
    near = (switches[:, None] + np.arange(-(1 << 12), 1 << 12, dtype=np.int32)).ravel()
    subnormal = np.concatenate([np.arange(0, 1 << 12, dtype=np.int32), RNG.integers(1, 0x800000, 1 << 12)])
    special = np.array([0x7F800000, 0x7FC00000, 0x7F7FFFFF, 0x7F000000, 0x3F000000, 0x3F800000], np.int32)
    half = np.concatenate([near, subnormal.astype(np.int32), special]).view(np.float32)
    bits = RNG.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([half, -half, bits])


def test_gelu_is_torchs(tmp_path, every_build):
    x = _gelu_inputs()
    want = F.gelu(torch.from_numpy(x)).numpy()
    model = _model(tmp_path, "gelu", {"x": [None]})
    for build, variant in every_build.items():
        got = _under(variant, lambda: model.run(x))
        if _onednn_runs_avx512():
            assert _same_bits(got, want), build
        else:
            finite = np.isfinite(x) & np.isfinite(want)
            gap = np.abs(got[finite].astype(np.float64) - want[finite])
            ref = want[finite].astype(np.float64)
            assert np.all(gap <= 8 * _ulp(ref) + 6.5 * U * np.abs(x[finite]) + 2.0**-126), build


def _rows(rows: int, n: int, kind: str) -> np.ndarray:
    x = RNG.standard_normal((rows, n)).astype(np.float32)
    if kind == "offset":  # mean far from the spread: Welford's merges carry large m1
        x += np.float32(1000)
    elif kind == "wide":
        x *= np.exp2(RNG.integers(-20, 20, (rows, n))).astype(np.float32)
    elif kind == "special":  # one row each: +inf, NaN, signed zeros only, a single huge value
        x[0, n // 2] = np.inf
        x[1 % rows, 0] = np.nan
        x[2 % rows] = np.where(np.arange(n) % 2, np.float32(0.0), np.float32(-0.0))
        x[3 % rows, -1] = np.float32(3e38)
    return x


LN_SIZES = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 100, 127, 128, 129, 136, 255, 256, 257, 384, 385, 1000, 1536, 2049,
            4099]
LN_FEW = [3, 8, 17, 128, 129, 257, 384, 2049]  # tail only, one vector, one chunk, two, a cascade, BERT, a tail


@pytest.mark.skipif(not TORCH_LN_FMA, reason="torch's layer_norm kernel without fma here (test_ops_float's bound)")
@pytest.mark.parametrize("kind", ["normal", "offset", "wide", "special"])
def test_layer_norm_is_torchs(tmp_path, kind, every_build):
    sizes = LN_SIZES + [70000] if kind == "normal" else LN_FEW
    for n in sizes:
        x = _rows(5 if n < 10000 else 2, n, kind)
        w, b = RNG.standard_normal((2, n)).astype(np.float32)
        for eps in (1e-12, 1e-5):
            for weight, bias in ((w, b), (None, None), (w, None), (None, b)):
                want = F.layer_norm(torch.from_numpy(x), (n,), None if weight is None else torch.from_numpy(weight),
                                    None if bias is None else torch.from_numpy(bias), eps).numpy()
                inputs = {"x": [None, n], **({"weight": weight} if weight is not None else {}),
                          **({"bias": bias} if bias is not None else {})}
                model = _model(tmp_path, "layer_norm", inputs, {"eps": eps})
                for build, variant in every_build.items():
                    got = _under(variant, lambda model=model, x=x: model.run(x))
                    assert _same_bits(got, want), (build, n, eps, weight is not None, bias is not None)


BN_SHAPES = [(1, 37), (6, 37), (4, 300), (5, 1), (3, 37, 11), (2, 19, 4, 3), (1, 8, 129)]


def _batch_norm_stats(channels: int) -> dict:
    mean, var, weight, bias = RNG.standard_normal((4, channels)).astype(np.float32) * np.float32(3)
    var = np.abs(var)
    var[::5] = 0.0  # sqrt(eps) alone
    mean[1::7] = 1e-40
    return {"mean": mean, "var": var, "weight": weight, "bias": bias}


def _batch_norm_input(shape: tuple) -> np.ndarray:
    x = (RNG.standard_normal(shape) * np.exp2(RNG.integers(-20, 20, shape))).astype(np.float32)
    flat = x.reshape(-1)
    flat[::13] = np.resize(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, -3e-39, 3e38], np.float32),
                           flat[::13].size)
    return x


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batch_norm_is_torchs(tmp_path, shape, affine, every_build):
    """Bit for bit where torch's build contracts; under its default capability within 2 ulp(|x alpha| + |beta|) +
    ulp(|mean alpha| + |bias|) of it: qrt's fma(x, alpha, beta) rounds once, torch's x * alpha + beta twice, and
    its beta likewise (one ulp of its terms each), alpha the same in both."""
    stats = _batch_norm_stats(shape[1])
    if not affine:  # torch's kernel then takes weight 1 and bias 0, as the converter stores them
        stats["weight"], stats["bias"] = np.ones(shape[1], np.float32), np.zeros(shape[1], np.float32)
    x = _batch_norm_input(shape)
    for eps in (1e-12, 1e-5, 0.1):
        t = {k: torch.from_numpy(v) for k, v in stats.items()}
        want = F.batch_norm(torch.from_numpy(x), t["mean"], t["var"], t["weight"] if affine else None,
                            t["bias"] if affine else None, False, 0.1, eps).numpy()
        model = _model(tmp_path, "batch_norm", {"x": [None, *shape[1:]], **stats}, {"eps": eps})
        view = (1, -1) + (1,) * (len(shape) - 2)
        alpha = (np.float32(1) / np.sqrt(stats["var"] + np.float32(eps)) * stats["weight"]).reshape(view)
        for build, variant in every_build.items():
            got = _under(variant, lambda model=model: model.run(x))
            if TORCH_LN_FMA:
                assert _same_bits(got, want), (build, eps)
                continue
            finite = np.isfinite(want)
            assert _same_bits(got[~finite], want[~finite]), (build, eps)  # infinities and NaN where torch's are
            terms = np.abs(stats["mean"].reshape(view) * alpha) + np.abs(stats["bias"].reshape(view))
            bound = 2 * _ulp(np.abs(x * alpha.astype(np.float64)) + terms) + _ulp(terms)
            assert np.all(np.abs(got[finite].astype(np.float64) - want[finite]) <= bound[finite]), (build, eps)


def test_batch_norm_split_across_threads(tmp_path):
    """Rows split across threads give the same bits as one thread (every float op's task is a whole row)."""
    stats = _batch_norm_stats(67)
    model = _model(tmp_path, "batch_norm", {"x": [None, 67, 5], **stats}, {"eps": 1e-5})
    x = _batch_norm_input((300, 67, 5))
    old, work = K.get_num_threads(), K._set_min_float_work(1)
    try:
        K.set_num_threads(1)
        one = model.run(x)
        for threads in (2, 3):
            K.set_num_threads(threads)
            assert _same_bits(model.run(x), one), threads
    finally:
        K.set_num_threads(old)
        K._set_min_float_work(work)
