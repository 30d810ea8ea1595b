"""What torch's CPU kernels compute on this machine, and exact numpy references for qrt's ops.

torch's x86 engine (fbgemm) picks its kernels by CPU at run time, and two of its results depend on
the pick (docs/NUMERICS.md, "Where torch depends on the CPU"):

- int8 GEMM: every kernel before AVX-512 VNNI multiplies with ``vpmaddubsw``, which saturates each
  sum of two adjacent products to int16. With 7-bit activations no pair can saturate; with full
  8-bit activations some do. ``TORCH_INT8_SATURATES`` says which kernel runs here and
  ``u8s8_accumulate(..., saturate_pairs=True)`` reproduces it exactly.
- float16-weight GEMM: the 512-bit kernels (AVX512, AVX512_E1) accumulate in the order qrt
  implements; the 256-bit ones (AVX2, AVX512_256, AVX512_E1_256) in another.
  ``TORCH_FP16_ORDER_IS_QRTS`` says which runs here.

The pick follows fbgemm's own rule (``fbgemmInstructionSet`` in fbgemm/src/Utils.cc): the best of
AVX512_E1 (VNNI), AVX512 (F, BW, DQ, VL), AVX2 the CPU has, lowered by ``FBGEMM_ENABLE_INSTRUCTIONS``
when the CPU supports the requested set, and the 256-bit AVX-512 variants when
``FBGEMM_ENABLE_AVX512_256`` is set on a one-package machine. ``test_torch_kernels.py`` checks the
rule against torch itself, so a wrong guess fails loudly instead of weakening other tests.
"""

from __future__ import annotations

import os
import platform

import numpy as np

# ---------------------------------------------------------------- which kernels torch runs here

_FORCED = {
    "AVX2": "avx2",
    "AVX512": "avx512",
    "AVX512_E1": "avx512_vnni",
    "AVX512_256": "avx512_ymm",
    "AVX512_E1_256": "avx512_vnni_ymm",
}
# fbgemm's isaSupportMap: which forced sets a detected set may be lowered (or moved) to
_ALLOWED = {
    "avx2": {"avx2"},
    "avx512": {"avx512", "avx512_ymm", "avx2"},
    "avx512_vnni": {"avx512_vnni", "avx512_vnni_ymm", "avx512", "avx512_ymm", "avx2"},
}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def fbgemm_isa() -> str:
    """The instruction set of the kernels fbgemm runs in this process ('none' off x86)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "none"
    flags = _cpu_flags()
    if "avx512_vnni" in flags:
        detected = "avx512_vnni"
    elif {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        detected = "avx512"
    elif "avx2" in flags:
        detected = "avx2"
    else:
        return "none"
    if detected != "avx2" and os.environ.get("FBGEMM_ENABLE_AVX512_256", "").lower() in ("1", "true"):
        # fbgemm treats a one-package machine as a Xeon D; these CI machines have one package
        detected += "_ymm"
    forced = _FORCED.get(os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper())
    if forced is not None and forced in _ALLOWED[detected.removesuffix("_ymm")]:
        return forced
    return detected


FBGEMM_ISA = fbgemm_isa()
TORCH_INT8_SATURATES = FBGEMM_ISA not in ("avx512_vnni", "avx512_vnni_ymm")
TORCH_FP16_ORDER_IS_QRTS = FBGEMM_ISA in ("avx512", "avx512_vnni")

# ---------------------------------------------------------------- exact references

U = 2.0**-24  # unit roundoff of float32


def u8s8_accumulate(x: np.ndarray, x_zp: int, w: np.ndarray, w_zp: np.ndarray, saturate_pairs: bool = False
                    ) -> np.ndarray:
    """acc[m, n] = sum_k (x - x_zp)(w - w_zp[n]) in exact integers.

    With saturate_pairs, the raw products x*w are summed in adjacent pairs of k clamped to int16
    first, as fbgemm's vpmaddubsw kernels do; the zero-point terms are exact in both.
    """
    x64, w64 = x.astype(np.int64), w.astype(np.int64)
    k = x64.shape[1]
    raw = x64[:, None, :] * w64[None, :, :]
    if saturate_pairs:
        if k % 2:
            raw = np.concatenate([raw, np.zeros(raw.shape[:2] + (1,), np.int64)], axis=2)
        raw = np.clip(raw[:, :, 0::2] + raw[:, :, 1::2], -(2**15), 2**15 - 1)
    w_zp = np.broadcast_to(np.asarray(w_zp, np.int64), (w64.shape[0],))
    return raw.sum(-1) - x_zp * w64.sum(1) - np.outer(x64.sum(1), w_zp) + k * x_zp * w_zp


def fma32(a, b, c) -> np.ndarray:
    """float32 fma(a, b, c), correctly rounded.

    a*b is exact in float64; the sum hi + lo is exact (two-sum); rounding it to float64 with
    round-to-odd keeps enough bits that the final rounding to float32 is the correct one.
    """
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    hi = p + c
    bb = hi - p
    lo = (p - (hi - bb)) + (c - bb)
    even = (hi.view(np.int64) & 1) == 0
    hi = np.where((lo != 0) & even, np.nextafter(hi, np.where(lo > 0, np.inf, -np.inf)), hi)
    return hi.astype(np.float32)


def static_linear(acc: np.ndarray, x_scale, w_scale, bias, y_scale, y_zp: int, relu: bool) -> np.ndarray:
    """quint8 output of torch's static quantized Linear (+ReLU) from its int32 sums (NUMERICS.md)."""
    f32 = np.float32
    n = acc.shape[1]
    per_channel = np.ndim(w_scale) == 1
    a_w = np.broadcast_to(f32(x_scale) * np.asarray(w_scale, f32), (n,)).astype(f32)
    mult = a_w / f32(y_scale)
    accf = acc.astype(f32)
    b = np.zeros(n, f32) if bias is None else np.asarray(bias, f32)
    if per_channel:
        v = accf + b / a_w
    else:
        v = fma32(b, (1.0 / a_w.astype(np.float64)).astype(f32), accf)
    r = np.rint(v * mult).astype(np.int64)
    q = np.clip(r, -(2**15), 2**15 - 1) + y_zp
    return np.clip(q, y_zp if relu else 0, 255).astype(np.uint8)


def reorder_bound(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Most by which two float32 evaluations of x @ w.T + bias can differ, whatever their orders.

    Each is within gamma_{K+1} * sum_k |x_k w_k| (+ |bias|) of the exact value (K products and a
    bias, any order, fma or not; gamma_j = j u / (1 - j u)), so two of them within twice that.
    """
    k = x.shape[-1] + 1
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    if bias is not None:
        magnitude += np.abs(bias.astype(np.float64))
    return 2 * (k * U / (1 - k * U)) * magnitude
