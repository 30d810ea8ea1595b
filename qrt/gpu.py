"""The CUDA backend: the CPU backend's ops as CuPy raw kernels (qrt/cuda/*.cu).

Same interface as ``qrt.cpu``: ``prepare(node, consts)`` runs once per node at
load time and uploads the node's weights; the step it returns takes the
node's run-time inputs (CuPy or NumPy arrays) and returns CuPy arrays.
It implements a subset of the registry (IMPLEMENTATIONS): ``check_graph``
refuses a model using any other op, naming them all, before anything is
uploaded.

Integers, and the floats of quantize, dequantize and the linear ops, are
bit-identical to the CPU backend: every float step in the kernels names its
rounding and the sources are compiled with ``--fmad=false``. The recurrent
cells' tanh and exp are the GPU's and may differ from the CPU's in the last
bit (<= 3e-7 per step; free-running sequences then drift by up to a
quantization step).

The dynamic quantization of activations stays on the device (parameters in
device memory, no synchronisation), so a NaN input cannot raise ValueError
as on the CPU: dynamic linear and RNN outputs become NaN, quantize stores
the type's minimum.

CuPy is imported only when a CUDA model is loaded; ``import qrt`` never does.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .graph import Graph, Node
from .ops import QUANT_DTYPES, flattened
from .recurrent import layer_runs, recurrent_kind, run_sequence

Step = Callable[..., tuple]

SOURCE_DIR = Path(__file__).parent / "cuda"
NVRTC_OPTIONS = ("--fmad=false", "-std=c++17")
KP_ALIGN = 64  # inner size padding: the MMA kernel's k tile
NP_ALIGN = 128  # weight rows padding: the MMA kernel's n tile
SMALL_QUANT = 1 << 16  # inputs up to this many values are quantized by one block
GEMV_MAX_ROWS = 8  # GEMM path for more rows (when the device has integer MMA)

# None: choose per call; "gemv" or "mma" forces a path (tests compare the two).
GEMM_PATH: str | None = None


class CUDAUnavailableError(RuntimeError):
    """device='cuda' was asked for but CuPy, the NVIDIA driver or a GPU is missing."""


def _cupy():
    import cupy

    return cupy


def require_cuda() -> None:
    """Raise CUDAUnavailableError saying what is missing, or return if a GPU is usable."""
    try:
        import cupy
    except ImportError as e:
        raise CUDAUnavailableError(
            "device='cuda' needs CuPy, which is not installed (pip install cupy-cuda12x); "
            f"import failed with: {e}"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, driver too old, no device
        text = str(e)
        if "NoDevice" in text or "no CUDA-capable device" in text:
            raise CUDAUnavailableError(f"device='cuda': no NVIDIA GPU found ({text})") from None
        raise CUDAUnavailableError(f"device='cuda': no usable NVIDIA driver ({text})") from None
    if count == 0:
        raise CUDAUnavailableError("device='cuda': no NVIDIA GPU found (CuPy sees 0 devices)")


# ---------------------------------------------------------------- arrays in and out


def array_module(a: Any) -> Any:
    """The array library owning ``a`` if this backend accepts it (numpy or cupy), else None."""
    if isinstance(a, np.ndarray):
        return np
    cp = _cupy()
    return cp if isinstance(a, cp.ndarray) else None


def outputs_like(outputs: Sequence[Any], inputs: Sequence[Any]) -> list:
    """Outputs in the inputs' array library: CuPy if any input is a CuPy array, else NumPy."""
    cp = _cupy()
    if any(isinstance(a, cp.ndarray) for a in inputs):
        return [cp.asarray(o) for o in outputs]
    return [cp.asnumpy(o) if isinstance(o, cp.ndarray) else o for o in outputs]


def _dev(a: Any, dtype: Any = None) -> Any:
    cp = _cupy()
    return cp.ascontiguousarray(cp.asarray(a, dtype=dtype))


# ---------------------------------------------------------------- kernel sources

_lock = threading.Lock()
_modules: dict[str, Any] = {}
_elementwise: dict[str, Any] = {}


def kernel_source(name: str) -> str:
    """A .cu file with its local #include "..." files inlined (each once).

    Inlined here rather than passed with -I so that CuPy's compile cache,
    keyed on the source text, sees header changes too.
    """
    seen: set[str] = set()

    def expand(file: str) -> str:
        if file in seen:
            return ""
        seen.add(file)
        text = re.sub(r"^#pragma once\s*$", "", (SOURCE_DIR / file).read_text(), flags=re.M)  # inlined once here
        return re.sub(r'^#include "([^"]+)"\s*$', lambda m: expand(m.group(1)), text, flags=re.M)

    return expand(name)


def _kernel(source: str, name: str) -> Any:
    with _lock:
        mod = _modules.get(source)
        if mod is None:
            mod = _modules[source] = _cupy().RawModule(code=kernel_source(source), options=NVRTC_OPTIONS)
    return mod.get_function(name)


def _has_mma() -> bool:
    """Integer mma.sync needs compute capability 8.0 or newer."""
    return int(_cupy().cuda.Device().compute_capability) >= 80


def _blocks(n: int, per_block: int = 256, cap: int = 4096) -> int:
    return max(1, min(cap, -(-n // per_block)))


def _round_up(v: int, a: int) -> int:
    return -(-max(v, 1) // a) * a


def _check_size(what: str, n: int) -> None:
    if n >= 2**31:
        raise ValueError(f"{what} has {n} elements; the CUDA kernels index with 32 bits")


def _qparams_array(scale: float, zero_point: int) -> np.ndarray:
    """A QParams struct (float scale, float inv, int zp, int nan) as 4 int32 words."""
    s = np.float32(scale)
    words = np.array([s, np.float32(1) / s], np.float32).view(np.int32)
    return np.array([words[0], words[1], zero_point, 0], np.int32)


# ---------------------------------------------------------------- dynamic quantization


MAX_PARTS = 1024  # dq_partial blocks at most


def dq_workspace(m: int, kp: int) -> tuple[Any, Any, Any]:
    """Buffers for quantize_dynamic of m rows (q, params, partials), for a time loop to reuse."""
    cp = _cupy()
    _check_size("the quantized input", m * kp)
    return cp.empty((m, kp), cp.uint8), cp.empty(4, cp.int32), cp.empty(3 * MAX_PARTS, cp.float32)


def quantize_dynamic(x: Any, kp: int, qmax: int, ws: tuple | None = None) -> tuple[Any, Any]:
    """quint8 q_x[m, kp] (zero-padded) and device QParams for float x[m, k].

    ws: buffers from dq_workspace(m, kp), reused instead of allocated (the
    kernels are stream-ordered, so reuse across steps is safe).
    """
    cp = _cupy()
    m, k = x.shape
    if ws is None:
        _check_size("the quantized input", m * kp)
        q, params, part = cp.empty((m, kp), cp.uint8), cp.empty(4, cp.int32), None
    else:
        q, params, part = ws
        assert q.shape == (m, kp), "workspace for another shape"
    n = m * k
    i32 = np.int32
    if n == 0:  # as the CPU: scale 0, zero point 0, and all-zero q_x
        q.fill(0)
        params.fill(0)
    elif n <= SMALL_QUANT:
        args = (x, i32(m), i32(k), i32(kp), params, q)
        _kernel("dynamic_quant.cu", "dq_small")((1,), (1024,), args + args + (i32(qmax),))
    else:
        parts = min(MAX_PARTS, -(-n // 2048))
        if part is None:
            part = cp.empty(3 * parts, cp.float32)
        _kernel("dynamic_quant.cu", "dq_partial")((parts,), (256,), (x, np.uint32(n), part))
        _kernel("dynamic_quant.cu", "dq_finish")(
            (_blocks(m * kp, 1024, 2048),), (256,), (x, i32(m), i32(k), i32(kp), part, i32(parts), i32(qmax), params, q)
        )
    return q, params


def quantize_dynamic_pair(x: Any, kx: int, h: Any, kh: int, qmax: int) -> tuple[Any, Any, Any, Any]:
    """quantize_dynamic of two small tensors (an RNN step's x and h) in one launch."""
    cp = _cupy()
    if not (0 < x.size <= SMALL_QUANT and 0 < h.size <= SMALL_QUANT):
        return (*quantize_dynamic(x, kx, qmax), *quantize_dynamic(h, kh, qmax))
    i32 = np.int32
    qx, px = cp.empty((x.shape[0], kx), cp.uint8), cp.empty(4, cp.int32)
    qh, ph = cp.empty((h.shape[0], kh), cp.uint8), cp.empty(4, cp.int32)
    _kernel("dynamic_quant.cu", "dq_small")(
        (2,),
        (1024,),
        (x, i32(x.shape[0]), i32(x.shape[1]), i32(kx), px, qx, h, i32(h.shape[0]), i32(h.shape[1]), i32(kh), ph, qh,
         i32(qmax)),
    )
    return qx, px, qh, ph


def _row_sums(q: Any, sums: Any = None) -> Any:
    cp = _cupy()
    m, kp = q.shape
    sums = cp.empty(m, cp.int32) if sums is None else sums
    _kernel("dynamic_quant.cu", "row_sums_u8")((_blocks(m, 1, 4096),), (256,), (q, np.int32(m), np.int32(kp), sums))
    return sums


# ---------------------------------------------------------------- layers


class Int8Weights:
    """A qint8 weight set on the device: padded to [Np, Kp], row sums, scales, bias."""

    def __init__(self, weight: np.ndarray, scale: Any, zero_point: Any, bias: Any) -> None:
        cp = _cupy()
        n, k = weight.shape
        self.n, self.k = n, k
        self.kp = _round_up(k, KP_ALIGN)
        padded = np.zeros((_round_up(n, NP_ALIGN), self.kp), np.int8)
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
        return _row_sums(q, sums) if self.has_wzp else self.dummy_i32

    def float_epilogue(self, xsum: Any, params: Any) -> tuple:
        """Kernel arguments of the EPI_FLOAT epilogue (gemm_common.cuh Epilogue)."""
        i32, f = np.int32, self.dummy_f32
        return (i32(self.k), self.wsum, self.wzp, xsum, i32(self.has_wzp), params, self.s_w, self.bias,
                i32(self.has_bias), f, f, np.float32(0), i32(0), i32(0))


def gemm(x_q: Any, m: int, w: Int8Weights, y: Any, epilogue: tuple, requant: bool) -> None:
    """y[m, n] = epilogue(exact int32 q_x @ q_w.T), by GEMV (dp4a) or tensor-core MMA."""
    path = GEMM_PATH or ("gemv" if m <= GEMV_MAX_ROWS or not _has_mma() else "mma")
    kind = "requant" if requant else "float"
    args = (x_q, np.int32(m), np.int32(w.kp), w.w, np.int32(w.n), y) + epilogue
    if path == "gemv":
        mb = 1 if m == 1 else 2 if m == 2 else 4 if m <= 4 else 8
        grid = (-(-w.n // 8), min(-(-m // mb), 65535))
        _kernel("gemm_s8.cu", f"gemv_{kind}_{mb}")(grid, (256,), args)
    elif path == "mma":
        if -(-m // 128) > 65535:
            raise ValueError(f"{m} rows is more than the CUDA GEMM's grid allows")
        _kernel("gemm_s8.cu", f"gemm_{kind}")((w.w.shape[0] // 128, -(-m // 128)), (256,), args)
    else:
        raise ValueError(f"GEMM_PATH must be None, 'gemv' or 'mma', got {path!r}")


class DynamicLinearInt8:
    """Dynamic quantized linear with qint8 weights, x quantized on the device per call."""

    def __init__(self, weight: np.ndarray, scale: Any, zero_point: Any, bias: Any, reduce_range: bool) -> None:
        self.w = Int8Weights(weight, scale, zero_point, bias)
        self.qmax = 127 if reduce_range else 255
        self.in_features, self.out_features = self.w.k, self.w.n

    def workspace(self, m: int) -> tuple:
        """Buffers for calls on m rows, so that a time loop allocates nothing per step."""
        cp = _cupy()
        return dq_workspace(m, self.w.kp), cp.empty(m, cp.int32) if self.w.has_wzp else None

    def __call__(self, x: Any, y: Any = None, ws: tuple | None = None) -> Any:
        """y[m, n] (written into y when given, a C-contiguous float32 array) from float x[m, k]."""
        cp = _cupy()
        m = x.shape[0]
        y = cp.empty((m, self.w.n), cp.float32) if y is None else y
        if m == 0 or self.w.n == 0:
            return y
        dq_ws, sums = ws if ws is not None else (None, None)
        q, params = quantize_dynamic(x, self.w.kp, self.qmax, dq_ws)
        gemm(q, m, self.w, y, self.w.float_epilogue(self.w.xsum(q, sums), params), requant=False)
        return y


class DynamicLinearFP16:
    """Float16-weight linear: fbgemm's fma chain order and 512-block tail quirk."""

    def __init__(self, weight: np.ndarray, bias: Any) -> None:
        cp = _cupy()
        n, k = weight.shape
        self.in_features, self.out_features = k, n
        bits = np.ascontiguousarray(np.asarray(weight, np.float16).T).view(np.uint16)
        self.w_t = cp.asarray(bits)  # [k, n]: a warp's loads at each k are contiguous
        self.has_bias = bias is not None
        self.bias = cp.asarray(np.ascontiguousarray(bias, np.float32)) if bias is not None else cp.zeros(1, cp.float32)

    def workspace(self, m: int) -> None:
        return None  # one kernel, no temporaries

    def __call__(self, x: Any, y: Any = None, ws: Any = None) -> Any:
        cp = _cupy()
        m, k = x.shape
        n = self.out_features
        y = cp.empty((m, n), cp.float32) if y is None else y
        if m and n:
            i32 = np.int32
            _kernel("linear_fp16.cu", "linear_fp16")(
                (-(-n // 128), min(m, 65535)), (128,),
                (x, i32(m), i32(k), self.w_t, i32(n), self.bias, i32(self.has_bias), y),
            )
        return y


def dynamic_linear(c: Mapping[str, np.ndarray], reduce_range: bool, prefix: str = "") -> Any:
    """The device layer for a dynamic linear weight set (prefix: 'ih_', 'hh_', ...)."""
    w = c[f"{prefix}weight"]
    if w.dtype == np.int8:
        return DynamicLinearInt8(
            w, c[f"{prefix}weight_scale"], c[f"{prefix}weight_zero_point"], c.get(f"{prefix}bias"), reduce_range
        )
    return DynamicLinearFP16(w, c.get(f"{prefix}bias"))


class StaticLinear:
    """Static quantized linear (+ReLU), requantized in the GEMM epilogue as the CPU does."""

    def __init__(self, c: Mapping[str, np.ndarray], relu: bool) -> None:
        cp = _cupy()
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
        self.params = cp.asarray(_qparams_array(x_scale, int(c["x_zero_point"])))
        self.y_zp = int(c["y_zero_point"])
        self.lo = self.y_zp if relu else 0  # ReLU is the lower clamp at the zero point
        self.in_features, self.out_features = self.w.k, n

    def __call__(self, x: Any) -> Any:
        cp = _cupy()
        m, k = x.shape
        y = cp.empty((m, self.w.n), cp.uint8)
        if m == 0 or self.w.n == 0:
            return y
        if k != self.w.kp:  # the kernels read whole 64-byte k tiles: pad with zeros
            _check_size("the padded input", m * self.w.kp)
            padded = cp.zeros((m, self.w.kp), cp.uint8)
            padded[:, :k] = x
            x = padded
        i32, w = np.int32, self.w
        epilogue = (i32(w.k), w.wsum, w.wzp, w.xsum(x), i32(w.has_wzp), self.params, w.dummy_f32, self.bias,
                    i32(self.bias_mode), self.mult, self.bias_q, self.bias_inv, i32(self.y_zp), i32(self.lo))
        gemm(x, m, w, y, epilogue, requant=True)
        return y


class RNNCell:
    """One dynamic Elman RNN step; int8 weights run as two launches (quantize x and h, fused step)."""

    def __init__(self, ih: Any, hh: Any, relu: bool) -> None:
        self.ih, self.hh = ih, hh
        self.act = "relu" if relu else "tanh"
        self.fused = isinstance(ih, DynamicLinearInt8) and isinstance(hh, DynamicLinearInt8)

    def __call__(self, x: Any, h: Any) -> Any:
        cp = _cupy()
        b, hidden = h.shape
        out = cp.empty((b, hidden), cp.float32)
        if b == 0 or hidden == 0:
            return out
        if not self.fused:
            gate_update(f"rnn_{self.act}", self.ih(x), self.hh(h), h, h, out, out)
            return out
        wi, wh = self.ih.w, self.hh.w
        qx, px, qh, ph = quantize_dynamic_pair(x, wi.kp, h, wh.kp, self.ih.qmax)
        mb = 1 if b == 1 else 2 if b == 2 else 4 if b <= 4 else 8
        args = ()
        for q, p, w in ((qx, px, wi), (qh, ph, wh)):
            args += (q, np.int32(w.kp), w.w, np.int32(w.k), w.wsum, w.wzp, w.xsum(q), np.int32(w.has_wzp), p, w.s_w,
                     w.bias, np.int32(w.has_bias))
        args += (np.int32(b), np.int32(hidden), out)
        grid = (-(-hidden // 8), min(-(-b // mb), 65535))
        _kernel("rnn_cell.cu", f"rnn_step_{self.act}_{mb}")(grid, (256,), args)
        return out


def gate_update(kind: str, gi: Any, gh: Any, h: Any, c: Any, h_out: Any, c_out: Any, y: Any = None) -> None:
    """The elementwise step (rnn_cell.cu gate_update) from gates gi, gh [B, G*H].

    h_out/c_out may be h/c (updated in place). y: a [B, H] view with unit
    inner stride (a sequence's output at one step) that also receives h'.
    c and c_out are read and written by LSTM only.
    """
    b, hidden = h.shape
    n = b * hidden
    if n == 0:
        return
    _check_size("the state", n)
    i32 = np.int32
    y_stride = y.strides[0] // y.itemsize if y is not None else 0
    _kernel("rnn_cell.cu", f"gate_update_{kind}")(
        (_blocks(n),), (256,),
        (gi, gh, h, c, h_out, c_out, h_out if y is None else y, i32(y_stride), i32(b), i32(hidden)),
    )


GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}


class Recurrent:
    """One direction of a dynamic recurrent layer on the device, as qrt._kernels.Recurrent.

    ``step`` is one cell step; ``sequence`` the whole time loop, launches only
    (no host synchronisation), its buffers allocated once per call. For LSTM
    and GRU the input projection of all steps is one dynamic linear over T*B
    rows (torch quantizes it over the whole sequence); for RNN it is per step.
    """

    def __init__(self, kind: str, ih: Any, hh: Any) -> None:
        self.kind, self.gates = kind, GATES[kind]
        self.ih, self.hh = ih, hh
        self.hidden, self.input_size = hh.in_features, ih.in_features
        if hh.out_features != self.gates * self.hidden or ih.out_features != hh.out_features:
            raise ValueError("Recurrent: weight shapes do not match the gate count")

    def step(self, x: Any, h: Any, c: Any) -> tuple[Any, Any]:
        """(h', c') from x [B, I], h and c [B, H] (pass h as c except for LSTM; c' is then h')."""
        cp = _cupy()
        h_out = cp.empty(h.shape, cp.float32)
        c_out = cp.empty(h.shape, cp.float32) if self.kind == "lstm" else h_out
        if h.size:
            gate_update(self.kind, self.ih(x), self.hh(h), h, c, h_out, c_out)
        return h_out, c_out

    def sequence(self, x: Any, y: Any, y_offset: int, reverse: bool, h: Any, c: Any) -> None:
        """Run over x [T, B, I]; write h_t into y[t, :, y_offset:y_offset+H].

        h and c (C-contiguous [B, H]) hold the initial state on entry and the
        final state on return (pass h as c except for LSTM).
        """
        cp = _cupy()
        steps, b = x.shape[:2]
        hidden, rows = self.hidden, self.gates * self.hidden
        if steps == 0 or b == 0 or hidden == 0:
            return
        whole = self.kind in ("lstm", "gru")
        if whole:  # one matrix product, quantized over all steps at once
            gi_all = self.ih(x.reshape(steps * b, self.input_size))
        else:
            gi, ih_ws = cp.empty((b, rows), cp.float32), self.ih.workspace(b)
        gh, hh_ws = cp.empty((b, rows), cp.float32), self.hh.workspace(b)
        for s in range(steps):
            t = steps - 1 - s if reverse else s
            if whole:
                gi = gi_all[t * b : (t + 1) * b]  # contiguous rows of step t
            else:
                self.ih(x[t], gi, ih_ws)
            self.hh(h, gh, hh_ws)
            gate_update(self.kind, gi, gh, h, c, h, c, y[t, :, y_offset : y_offset + hidden])


# ---------------------------------------------------------------- ops


def _quantize_per_tensor(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    scale, zp = np.float32(c["scale"]), np.int32(c["zero_point"])
    dtype = QUANT_DTYPES[node.attrs["dtype"]]

    def step(x):
        cp = _cupy()
        x = _dev(x, np.float32)
        _check_size("x", x.size)
        y = cp.empty(x.shape, dtype)
        if x.size:
            fn = _kernel("quantize.cu", f"quantize_per_tensor_{dtype}")
            fn((_blocks(x.size),), (256,), (x, np.uint32(x.size), scale, zp, y))
        return (y,)

    return step


def _channel_args(shape: tuple, axis: int) -> tuple:
    return np.uint32(shape[axis]), np.uint32(math.prod(shape[axis + 1 :]))


def _per_channel_params(c: Mapping[str, np.ndarray], scale_dtype: Any) -> tuple[Any, Any]:
    scale = np.ascontiguousarray(c["scale"], scale_dtype)
    return _dev(scale), _dev(np.ascontiguousarray(c["zero_point"], np.int32))


def _quantize_per_channel(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    # torch quantizes with 1.0f / (float)scale: only fl(scale) matters (numpy rounds float64 to nearest even)
    scale, zp = _per_channel_params(c, np.float32)
    dtype, axis = QUANT_DTYPES[node.attrs["dtype"]], node.attrs["axis"]

    def step(x):
        cp = _cupy()
        x = _dev(x, np.float32)
        _check_size("x", x.size)
        y = cp.empty(x.shape, dtype)
        if x.size:
            channels, inner = _channel_args(x.shape, axis)
            fn = _kernel("quantize.cu", f"quantize_per_channel_{dtype}")
            fn((_blocks(x.size),), (256,), (x, np.uint32(x.size), channels, inner, scale, zp, y))
        return (y,)

    return step


def _dequantize(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    axis = node.attrs["axis"]
    if axis is None:
        scale, zp = np.float32(c["scale"]), np.int32(c["zero_point"])
    else:  # torch multiplies by the per-channel scale in double; float32 scales widen exactly
        scale, zp = _per_channel_params(c, np.float64)

    def step(x):
        cp = _cupy()
        x = _dev(x)
        _check_size("x", x.size)
        y = cp.empty(x.shape, cp.float32)
        if x.size:
            n = np.uint32(x.size)
            if axis is None:
                fn = _kernel("quantize.cu", f"dequantize_per_tensor_{x.dtype}")
                fn((_blocks(x.size),), (256,), (x, n, scale, zp, y))
            else:
                channels, inner = _channel_args(x.shape, axis)
                fn = _kernel("quantize.cu", f"dequantize_per_channel_{x.dtype}")
                fn((_blocks(x.size),), (256,), (x, n, channels, inner, scale, zp, y))
        return (y,)

    return step


def _rows(layer: Any, x_dtype: Any) -> Step:
    """Apply a [rows, in] -> [rows, out] layer to x of any rank >= 1."""

    def step(x):
        x = _dev(x, x_dtype)
        lead = x.shape[:-1]
        y = layer(x.reshape(-1, layer.in_features))
        return (y.reshape(lead + (layer.out_features,)),)

    return step


def _linear(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    return _rows(StaticLinear(c, node.attrs["relu"]), np.uint8)


def _linear_dynamic(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    return _rows(dynamic_linear(c, node.attrs["reduce_range"]), np.float32)


def _linear_float(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    """Float32 linear through CuPy's matmul (cuBLAS): close to, not bit-exact with, torch's GEMM."""
    w_t = _dev(np.asarray(c["weight"], np.float32).T)
    bias = None if c.get("bias") is None else _dev(c["bias"], np.float32)

    def step(x):
        y = _dev(x, np.float32) @ w_t
        return (y if bias is None else y + bias,)

    return step


def _rnn_cell_dynamic(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    rr = node.attrs["reduce_range"]
    cell = RNNCell(dynamic_linear(c, rr, "ih_"), dynamic_linear(c, rr, "hh_"), node.attrs["nonlinearity"] == "relu")

    def step(x, h):
        if x.shape[0] != h.shape[0]:
            raise ValueError(f"x has batch {x.shape[0]} but h has batch {h.shape[0]}")
        return (cell(_dev(x, np.float32), _dev(h, np.float32)),)

    return step


def _cell(op_kind: str) -> Callable[[Node, Mapping[str, np.ndarray]], Step]:
    """lstm/gru_cell_dynamic: one step, states in and new states out."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        rr = node.attrs["reduce_range"]
        cell = Recurrent(
            recurrent_kind(op_kind, node.attrs), dynamic_linear(c, rr, "ih_"), dynamic_linear(c, rr, "hh_")
        )

        def step(x, h, c_state=None):
            c_in = h if c_state is None else c_state
            if x.shape[0] != h.shape[0] or h.shape != c_in.shape:
                raise ValueError(f"x has batch {x.shape[0]} but the state has shape {list(c_in.shape)}")
            h = _dev(h, np.float32)
            h_out, c_out = cell.step(_dev(x, np.float32), h, h if c_state is None else _dev(c_state, np.float32))
            return (h_out,) if c_state is None else (h_out, c_out)

        return step

    return prepare


def _sequence(op_kind: str) -> Callable[[Node, Mapping[str, np.ndarray]], Step]:
    """rnn/lstm/gru_dynamic: every layer and direction, each time loop launched without synchronisation."""

    def prepare(node: Node, c: Mapping[str, np.ndarray]) -> Step:
        runs = layer_runs(op_kind, node.attrs, c, Recurrent, dynamic_linear)
        ports = [p for p in ("h0", "c0") if p in node.inputs]  # by port: c0 alone starts h at zeros

        def step(x, *states):
            given = dict(zip(ports, states))
            initial = [None if given.get(p) is None else _dev(given[p], np.float32) for p in ("h0", "c0")]
            return run_sequence(runs, node.attrs, op_kind == "lstm", _dev(x, np.float32), initial, _cupy(),
                                _check_size)

        return step

    return prepare


def _relu(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    def step(x):
        with _lock:
            fn = _elementwise.get("relu")
            if fn is None:
                # np.maximum(x, 0) as numpy computes it: NaN kept, -0.0 -> +0.0
                fn = _elementwise["relu"] = _cupy().ElementwiseKernel(
                    "float32 x", "float32 y", "y = (x > 0.0f || x != x) ? x : 0.0f", "qrt_relu"
                )
        return (fn(_dev(x, np.float32)),)

    return step


def _add(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    def step(a, b):
        if a.shape != b.shape:  # no broadcasting: free dimensions must agree
            raise ValueError(f"operands have shapes {a.shape} and {b.shape}")
        return (_dev(a, np.float32) + _dev(b, np.float32),)  # one IEEE add: nothing to fuse

    return step


def _flatten(node: Node, c: Mapping[str, np.ndarray]) -> Step:
    start, end = node.attrs["start_dim"], node.attrs["end_dim"]
    return lambda x: (_dev(x).reshape(flattened(x.shape, start, end)),)


IMPLEMENTATIONS: dict[str, Callable[[Node, Mapping[str, np.ndarray]], Step]] = {
    "quantize_per_tensor": _quantize_per_tensor,
    "quantize_per_channel": _quantize_per_channel,
    "dequantize": _dequantize,
    "linear": _linear,
    "linear_dynamic": _linear_dynamic,
    "linear_float": _linear_float,
    "rnn_cell_dynamic": _rnn_cell_dynamic,  # the fused int8 Elman step
    **{f"{kind}_cell_dynamic": _cell(kind) for kind in ("lstm", "gru")},
    **{f"{kind}_dynamic": _sequence(kind) for kind in ("rnn", "lstm", "gru")},
    "relu": _relu,
    "add": _add,
    "flatten": _flatten,
}


def check_graph(graph: Graph) -> None:
    """Refuse a model using ops this backend lacks, naming them all, before anything is uploaded."""
    def lacking(n: Node) -> str | None:
        if n.op not in IMPLEMENTATIONS:
            return n.op
        shapes = {graph.values[v].shape for v in n.inputs.values()}
        if n.op == "add" and len(shapes) > 1:  # the CUDA add takes equal shapes only
            return "add (broadcasting)"
        return None

    missing = sorted({lacking(n) for n in graph.nodes} - {None})
    if missing:
        nodes = [n.name for n in graph.nodes if lacking(n) is not None]
        more = f" and {len(nodes) - 5} more" if len(nodes) > 5 else ""
        raise NotImplementedError(
            f"device='cuda' does not implement op(s) {missing} (node(s) {nodes[:5]}{more}): "
            "load this model with device='cpu'"
        )


def prepare(node: Node, consts: Mapping[str, np.ndarray]) -> Step:
    """Upload a node's constants once; return its step over run-time inputs (check_graph has passed)."""
    return IMPLEMENTATIONS[node.op](node, consts)
