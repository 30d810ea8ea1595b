"""The linear ops on the device: static and dynamic int8 (GEMV by dp4a or tensor-core MMA), float16
weights in fbgemm's order, and float32 in the CPU's fixed order.

Integers and the floats of the epilogues are bit-identical to the CPU backend (qrt/cuda/gemm_s8.cu,
linear_chain.cu).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..cpu.types import Prepare, Step
from ..graph import Node
from .quantize import dq_workspace, quantize_dynamic, row_sums
from .runtime import check_size, cupy, dev, device_limits, has_mma, kernel, opt_in_shared, qparams_array, round_up

KP_ALIGN = 64  # inner size padding: the MMA kernel's k tile
NP_ALIGN = 128  # weight rows padding: the MMA kernel's n tile
GEMV_MAX_ROWS = 8  # GEMM path for more rows (when the device has integer MMA)
GV_THREADS = 768  # gemv_dynamic.cu's block: one per SM
GV_SMEM = 128 * 1024  # most shared memory for q_x (MB x Kp bytes) in gemv_dynamic.cu; the old gemv beyond
DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a kernel gets without opting in
GEMM_SMEM = 4 * 2 * 128 * 80  # gemm_s8.cu's MMA kernel: STAGES x (x and w tiles of 128 rows of 80 bytes)
# The fused kernel reads the whole float x once per block (one block per SM), from L2: chosen when those
# reads are at most this fraction of the weight bytes, or this many bytes (L2 serves them in about a
# microsecond), else quantize_dynamic then gemv_q (x read once). Measured on an H100 (bench_gpu.py
# --graph-only, docs/PERFORMANCE.md): at 4096x4096 and 8192x8192, batch 1, 4 and 8, the fused kernel was
# as fast or faster in every case (batch 8 at 4096: 23.4 against 27.3 us), where x's reads were up to
# 1.03 times the weights' bytes; beyond 1.25 times (not measured) x is quantized once first.
FUSED_MAX_X_SHARE = 1.25
FUSED_MAX_X_BYTES = 4 << 20

# None: choose per call. "gemv" or "mma" forces gemm_s8.cu's kernels (tests compare the paths);
# "fused" (dynamic linear: quantization and GEMV in one kernel) and "gemv_q" (the same GEMV over a
# quantized x) force gemv_dynamic.cu's kernels wherever they apply (m <= 8, q_x fits GV_SMEM).
GEMM_PATH: str | None = None
PATHS = (None, "gemv", "mma", "fused", "gemv_q")


class Int8Weights:
    """A qint8 weight set on the device: padded to [Np, Kp], row sums, scales, bias."""

    def __init__(self, weight: np.ndarray, scale: Any, zero_point: Any, bias: Any) -> None:
        cp = cupy()
        n, k = weight.shape
        self.n, self.k = n, k
        self.kp = round_up(k, KP_ALIGN)
        padded = np.zeros((round_up(n, NP_ALIGN), self.kp), np.int8)
        padded[:n, :k] = weight
        self.w = cp.asarray(padded)
        self.wsum = cp.asarray(np.asarray(weight).sum(axis=1, dtype=np.int32))
        zp = np.ascontiguousarray(np.broadcast_to(np.asarray(zero_point, np.int32), (n,)))
        self.has_wzp = bool(np.any(zp != 0))
        self.wzp = cp.asarray(zp)
        self.s_w = cp.asarray(np.ascontiguousarray(np.broadcast_to(np.asarray(scale, np.float32), (n,))))
        self.has_bias = bias is not None
        self.bias = cp.asarray(np.ascontiguousarray(bias, np.float32)) if bias is not None else cp.zeros(1, cp.float32)
        self.dummy_i32 = cp.zeros(1, cp.int32)
        self.dummy_f32 = cp.zeros(1, cp.float32)

    def xsum(self, q: Any, sums: Any = None) -> Any:
        return row_sums(q, sums) if self.has_wzp else self.dummy_i32

    def float_epilogue(self, xsum: Any, params: Any) -> tuple:
        """Kernel arguments of the EPI_FLOAT epilogue (gemm_common.cuh Epilogue)."""
        i32, f = np.int32, self.dummy_f32
        return (i32(self.k), self.wsum, self.wzp, xsum, i32(self.has_wzp), params, self.s_w, self.bias,
                i32(self.has_bias), f, f, np.float32(0), i32(0), i32(0))


def _mb(m: int) -> int:
    """Rows per GEMV kernel: the smallest of 1, 2, 4, 8 that holds m."""
    return 1 if m == 1 else 2 if m == 2 else 4 if m <= 4 else 8


def _limits() -> tuple[int, int]:
    """(SMs, shared memory for q_x in gemv_dynamic.cu): GV_SMEM, or what the device allows a block by
    opting in, less 1 KB for the kernels' static shared memory (sm_86 and sm_89 allow 99 KB)."""
    sms, smem = device_limits()
    return sms, min(GV_SMEM, smem - 1024)


def _gv_fits(m: int, w: Int8Weights) -> bool:
    """Whether gemv_dynamic.cu's kernels take m rows over these weights (q_x in shared memory)."""
    return 0 < m <= GEMV_MAX_ROWS and _mb(m) * w.kp <= _limits()[1]


def _gv_grid(m: int, w: Int8Weights) -> int:
    """The persistent grid of gemv_dynamic.cu: one block per SM, or one per column group if fewer."""
    per_warp = 2 if _mb(m) >= 4 else 1  # gemv_dynamic.cu GvShape::CPW
    return min(_limits()[0], -(-w.n // per_warp))


def _launch(source: str, name: str, grid: tuple, block: tuple, args: tuple, smem: int) -> None:
    """Launch with ``smem`` bytes of dynamic shared memory (opted in above the default 48 KB)."""
    fn = kernel(source, name)
    if smem > DEFAULT_SMEM:
        opt_in_shared(fn)
    fn(grid, block, args, shared_mem=smem)


def _gv_launch(name: str, m: int, w: Int8Weights, args: tuple) -> None:
    """Launch gemv_dynamic.cu's ``name``: one block per SM, q_x in shared memory."""
    _launch("gemv_dynamic.cu", name, (_gv_grid(m, w),), (GV_THREADS,), args, _mb(m) * w.kp)


def gemm(x_q: Any, m: int, w: Int8Weights, y: Any, epilogue: tuple, requant: bool) -> None:
    """y[m, n] = epilogue(exact int32 q_x @ q_w.T), by GEMV (dp4a) or tensor-core MMA."""
    if GEMM_PATH not in PATHS:
        raise ValueError(f"GEMM_PATH must be one of {PATHS}, got {GEMM_PATH!r}")
    path = GEMM_PATH if GEMM_PATH in ("gemv", "mma") else None
    if path is None:
        path = "gemv_q" if _gv_fits(m, w) else "gemv" if m <= GEMV_MAX_ROWS or not has_mma() else "mma"
    kind = "requant" if requant else "float"
    args = (x_q, np.int32(m), np.int32(w.kp), w.w, np.int32(w.n), y) + epilogue
    if path == "gemv_q":
        _gv_launch(f"gemv_q_{kind}_{_mb(m)}", m, w, args)
    elif path == "gemv":
        mb = _mb(m)
        grid = (-(-w.n // 8), min(-(-m // mb), 65535))
        kernel("gemm_s8.cu", f"gemv_{kind}_{mb}")(grid, (256,), args)
    elif path == "mma":
        if -(-m // 128) > 65535:
            raise ValueError(f"{m} rows is more than the CUDA GEMM's grid allows")
        grid = (w.w.shape[0] // 128, -(-m // 128))
        _launch("gemm_s8.cu", f"gemm_{kind}", grid, (256,), args, GEMM_SMEM)


class DynamicLinearInt8:
    """Dynamic quantized linear with qint8 weights, x quantized on the device per call."""

    def __init__(self, weight: np.ndarray, scale: Any, zero_point: Any, bias: Any, reduce_range: bool) -> None:
        self.w = Int8Weights(weight, scale, zero_point, bias)
        self.qmax = 127 if reduce_range else 255
        self.in_features, self.out_features = self.w.k, self.w.n

    def fused(self, m: int) -> bool:
        """Whether m rows take gemv_dynamic.cu's gemv_dq (quantization and product in one kernel)."""
        if GEMM_PATH not in (None, "fused") or self.w.k == 0 or not _gv_fits(m, self.w):
            return False
        x_reads = _gv_grid(m, self.w) * m * self.w.k * 4  # every block reads all of x
        return GEMM_PATH == "fused" or x_reads <= max(FUSED_MAX_X_BYTES, FUSED_MAX_X_SHARE * self.w.n * self.w.kp)

    def workspace(self, m: int) -> tuple:
        """Buffers for calls on m rows, so that a time loop allocates nothing per step."""
        cp = cupy()
        if self.fused(m):
            return None, None
        return dq_workspace(m, self.w.kp), cp.empty(m, cp.int32) if self.w.has_wzp else None

    def __call__(self, x: Any, y: Any = None, ws: tuple | None = None) -> Any:
        """y[m, n] (written into y when given, a C-contiguous float32 array) from float x[m, k]
        (C-contiguous)."""
        cp = cupy()
        m = x.shape[0]
        y = cp.empty((m, self.w.n), cp.float32) if y is None else y
        if m == 0 or self.w.n == 0:
            return y
        if self.fused(m):
            w = self.w
            epilogue = w.float_epilogue(w.dummy_i32, w.dummy_i32)  # xsum and QParams: the kernel's own
            args = (x, np.int32(m), np.int32(w.kp), w.w, np.int32(w.n), y, np.int32(self.qmax)) + epilogue
            _gv_launch(f"gemv_dq_{_mb(m)}", m, w, args)
            return y
        dq_ws, sums = ws if ws is not None else (None, None)
        q, params = quantize_dynamic(x, self.w.kp, self.qmax, dq_ws)
        gemm(q, m, self.w, y, self.w.float_epilogue(self.w.xsum(q, sums), params), requant=False)
        return y


class RowSymmetricLinear:
    """linear_dynamic with activation "per_row_symmetric" (torchao's Int8Tensor linear): x quantized a row at a
    time to symmetric int8, the exact product and torchao's epilogue (linear_rows.cu), as the CPU computes them."""

    def __init__(self, weight: np.ndarray, scale: Any, bias: Any) -> None:
        self.w = Int8Weights(weight, scale, np.int32(0), bias)
        self.in_features, self.out_features = self.w.k, self.w.n

    def workspace(self, m: int) -> None:
        return None

    def __call__(self, x: Any, y: Any = None, ws: Any = None) -> Any:
        cp = cupy()
        m, w = x.shape[0], self.w
        y = cp.empty((m, w.n), cp.float32) if y is None else y
        if m == 0 or w.n == 0:
            return y
        check_size("the quantized input", m * w.kp)
        q, s_x = cp.empty((m, w.kp), cp.uint8), cp.empty(m, cp.float32)
        i32 = np.int32
        rows = (x, i32(m), i32(w.k), i32(w.kp), s_x, q)
        kernel("linear_rows.cu", "dq_rows_symmetric")((min(m, 65535),), (256,), rows)
        kernel("linear_rows.cu", "linear_rows_symmetric")(
            (-(-w.n // 8), min(m, 65535)), (256,),
            (q, i32(m), i32(w.kp), w.w, i32(w.n), w.wsum, s_x, w.s_w, w.bias, i32(w.has_bias), y),
        )
        return y


class ChainLinear:
    """Float linear as fbgemm's fp16 kernel rounds it (fma chains, the 512-block tail quirk): float16
    weights for a dynamic linear, float32 weights (half=False) for linear_float, as the CPU's
    K.PackedFloat."""

    def __init__(self, weight: np.ndarray, bias: Any, half: bool = True) -> None:
        cp = cupy()
        n, k = weight.shape
        self.in_features, self.out_features = k, n
        dtype = np.float16 if half else np.float32
        w_t = np.ascontiguousarray(np.asarray(weight, dtype).T)  # [k, n]: a warp's loads at each k are contiguous
        self.w_t = cp.asarray(w_t.view(np.uint16) if half else w_t)
        self.entry = "linear_fp16" if half else "linear_f32"
        self.has_bias = bias is not None
        self.bias = cp.asarray(np.ascontiguousarray(bias, np.float32)) if bias is not None else cp.zeros(1, cp.float32)

    def workspace(self, m: int) -> None:
        return None  # one kernel, no temporaries

    def __call__(self, x: Any, y: Any = None, ws: Any = None) -> Any:
        cp = cupy()
        m, k = x.shape
        n = self.out_features
        y = cp.empty((m, n), cp.float32) if y is None else y
        if m and n:
            i32 = np.int32
            kernel("linear_chain.cu", self.entry)(
                (-(-n // 128), min(m, 65535)), (128,),
                (x, i32(m), i32(k), self.w_t, i32(n), self.bias, i32(self.has_bias), y),
            )
        return y


def dynamic_linear(c: Mapping[str, np.ndarray], reduce_range: bool, prefix: str = "",
                   activation: str = "per_tensor") -> Any:
    """The device layer for a dynamic linear weight set (prefix: 'ih_', 'hh_', ...)."""
    w = c[f"{prefix}weight"]
    if activation == "per_row_symmetric":  # int8 weights, zero points 0 (qrt/ops.py)
        return RowSymmetricLinear(w, c[f"{prefix}weight_scale"], c.get(f"{prefix}bias"))
    if w.dtype == np.int8:
        return DynamicLinearInt8(
            w, c[f"{prefix}weight_scale"], c[f"{prefix}weight_zero_point"], c.get(f"{prefix}bias"), reduce_range
        )
    return ChainLinear(w, c.get(f"{prefix}bias"))


class StaticLinear:
    """Static quantized linear (+ReLU), requantized in the GEMM epilogue as the CPU does."""

    def __init__(self, c: Mapping[str, np.ndarray], relu: bool) -> None:
        cp = cupy()
        w_scale = c["weight_scale"]
        bias = c.get("bias")
        self.w = Int8Weights(c["weight"], w_scale, c["weight_zero_point"], None)
        n = self.w.n
        x_scale, y_scale = np.float32(c["x_scale"]), np.float32(c["y_scale"])
        # The same float32 host arithmetic as qrt._kernels.StaticLinear.
        a_w = (x_scale * np.broadcast_to(np.asarray(w_scale, np.float32), (n,))).astype(np.float32)
        b = np.ascontiguousarray(bias if bias is not None else np.zeros(n), dtype=np.float32)
        self.mult = cp.asarray(np.ascontiguousarray(a_w / y_scale, dtype=np.float32))
        self.bias = cp.asarray(b)
        self.bias_q = cp.asarray((b / a_w).astype(np.float32))
        self.bias_inv = np.float32(1.0 / np.float64(a_w[0])) if n else np.float32(0)
        self.bias_mode = 0 if bias is None else (2 if np.ndim(w_scale) == 1 else 1)
        self.params = cp.asarray(qparams_array(x_scale, int(c["x_zero_point"])))
        self.y_zp = int(c["y_zero_point"])
        self.lo = self.y_zp if relu else 0  # ReLU is the lower clamp at the zero point
        self.in_features, self.out_features = self.w.k, n

    def __call__(self, x: Any) -> Any:
        cp = cupy()
        m, k = x.shape
        y = cp.empty((m, self.w.n), cp.uint8)
        if m == 0 or self.w.n == 0:
            return y
        if k != self.w.kp:  # the kernels read whole 64-byte k tiles: pad with zeros
            check_size("the padded input", m * self.w.kp)
            padded = cp.zeros((m, self.w.kp), cp.uint8)
            padded[:, :k] = x
            x = padded
        i32, w = np.int32, self.w
        epilogue = (i32(w.k), w.wsum, w.wzp, w.xsum(x), i32(w.has_wzp), self.params, w.dummy_f32, self.bias,
                    i32(self.bias_mode), self.mult, self.bias_q, self.bias_inv, i32(self.y_zp), i32(self.lo))
        gemm(x, m, w, y, epilogue, requant=True)
        return y


def _rows(layer: Any, x_dtype: Any) -> Step:
    """Apply a [rows, in] -> [rows, out] layer to x of any rank >= 1."""

    def step(x):
        x = dev(x, x_dtype)
        lead = x.shape[:-1]
        y = layer(x.reshape(-1, layer.in_features))
        return (y.reshape(lead + (layer.out_features,)),)

    return step


def _linear(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    return _rows(StaticLinear(c, node.attrs["relu"]), np.uint8)


def _linear_dynamic(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    return _rows(dynamic_linear(c, node.attrs["reduce_range"], activation=node.attrs["activation"]), np.float32)


def _linear_float(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    """Float32 linear in the CPU's fixed fma order (not cuBLAS, whose order is its own)."""
    layer = ChainLinear(c["weight"], c.get("bias"), half=False)
    rows = _rows(layer, np.float32)

    def step(x):
        if x.shape[-1] != layer.in_features:
            raise ValueError(f"x has {x.shape[-1]} features, expected {layer.in_features}")
        return rows(x)

    return step


IMPLEMENTATIONS: dict[str, Prepare] = {
    "linear": _linear,
    "linear_dynamic": _linear_dynamic,
    "linear_float": _linear_float,
}
