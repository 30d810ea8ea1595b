"""layer_norm and gelu (erf form) give torch 2.13's CPU bits, on every kernel build this CPU runs.

- layer_norm: torch registers its CPU kernel for the AVX2 capability only, which its AVX512 capability runs too
  (docs/NUMERICS.md, section 8), so torch's bits are the same under ATEN_CPU_CAPABILITY=avx2 and avx512; its
  `default` capability (CPUs without AVX2) compiles the same code without fma, and is held to the bound of
  test_ops_float.py's test_layer_norm instead. Checked bit for bit at row lengths that reach every part of its
  order: the scalar tail alone (n < 8), one to many chunks of 16 vectors of 8 (8 to 70000: cascades up to 10
  levels deep), BERT's rows of 384 and 1536, eps 1e-12 and 1e-5, with and without weight and bias; rows far
  from 0, of wide range, and holding infinities, NaN and signed zeros at the sizes that reach each part.
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
