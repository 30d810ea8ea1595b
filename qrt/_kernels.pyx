# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Integer kernels of qrt's CPU backend.

Each float step is written as PyTorch's x86/fbgemm engine performs it
(../shared/NUMERICS.md): fmaf exactly where that engine fuses, plain float
operations elsewhere. The extension is built with -ffp-contract=off and
without fast-math, so the compiler adds no fusion of its own and results do
not depend on the machine. Integer accumulation wraps modulo 2**32 as int32
does in the reference (-fwrapv makes that defined behaviour in C).

Callers validate shapes; the kernels trust them and run without the GIL.
"""

from libc.math cimport fmaf, nearbyintf, nearbyint, fabs, tanhf, expf, isinf
from libc.string cimport memcpy
from libc.stdint cimport int8_t, uint8_t, int32_t, int64_t

import numpy as np

ctypedef fused qint_t:
    uint8_t
    int8_t
    int32_t

# fbgemm's SMALL_SCALE_THRESHOLD: a float, widened to double where compared.
cdef float SMALL_SCALE = 6.1e-5


cdef inline int64_t round_clamp(float v, int64_t qmin, int64_t qmax, int* nan) noexcept nogil:
    """rne(v) clamped to [qmin, qmax]; NaN is counted and mapped to qmin."""
    cdef float r = nearbyintf(v)
    if r != r:
        nan[0] += 1
        return qmin
    if <double>r < <double>qmin:
        return qmin
    if <double>r > <double>qmax:
        return qmax
    return <int64_t>r


cdef inline void qrange(qint_t* dummy, int64_t* qmin, int64_t* qmax) noexcept nogil:
    if qint_t is uint8_t:
        qmin[0], qmax[0] = 0, 255
    elif qint_t is int8_t:
        qmin[0], qmax[0] = -128, 127
    else:
        qmin[0], qmax[0] = -2147483648, 2147483647


# ------------------------------------------------------------ quantize / dequantize

def quantize_per_tensor(const float[::1] x, float scale, int32_t zero_point, qint_t[::1] out) -> int:
    """out = clamp(rne(x / scale + zp)); returns the number of NaNs met.

    8-bit targets use fma(x, 1/scale, zp) (one rounding); qint32 rounds the
    product and the sum separately, as torch does.
    """
    cdef Py_ssize_t i, n = x.shape[0]
    cdef float inv = <float>1.0 / scale
    cdef float zp = <float>zero_point
    cdef int64_t qmin, qmax
    cdef int nan = 0
    qrange(<qint_t*>NULL, &qmin, &qmax)
    with nogil:
        for i in range(n):
            if qint_t is int32_t:
                out[i] = <qint_t>round_clamp(x[i] * inv + zp, qmin, qmax, &nan)
            else:
                out[i] = <qint_t>round_clamp(fmaf(x[i], inv, zp), qmin, qmax, &nan)
    return nan


def quantize_per_channel(const float[:, :, ::1] x, const float[::1] scale,
                         const int32_t[::1] zero_point, qint_t[:, :, ::1] out) -> int:
    """x viewed as [outer, channels, inner]; rne(fl(x * (1/scale_c)) + zp_c), no fma."""
    cdef Py_ssize_t a, c, i
    cdef float inv, zp
    cdef int64_t qmin, qmax
    cdef int nan = 0
    qrange(<qint_t*>NULL, &qmin, &qmax)
    with nogil:
        for a in range(x.shape[0]):
            for c in range(x.shape[1]):
                inv = <float>1.0 / scale[c]
                zp = <float>zero_point[c]
                for i in range(x.shape[2]):
                    out[a, c, i] = <qint_t>round_clamp(x[a, c, i] * inv + zp, qmin, qmax, &nan)
    return nan


def dequantize_per_tensor(const qint_t[::1] q, float scale, int32_t zero_point, float[::1] out) -> None:
    """out = fl(q - zp) * scale in float32; q - zp wraps in int32 as torch's does."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(q.shape[0]):
            out[i] = <float>(<int32_t>(q[i] - zero_point)) * scale


def dequantize_per_channel(const qint_t[:, :, ::1] q, const float[::1] scale,
                           const int32_t[::1] zero_point, float[:, :, ::1] out) -> None:
    """out = fl(q - zp_c) * scale_c in float32, q - zp_c exact (no int32 wrap, unlike per-tensor).

    torch multiplies in double, but a product of two floats is exact in
    double, so rounding it once to float is the float32 product.
    """
    cdef Py_ssize_t a, c, i
    with nogil:
        for a in range(q.shape[0]):
            for c in range(q.shape[1]):
                for i in range(q.shape[2]):
                    out[a, c, i] = <float>(<int64_t>q[a, c, i] - zero_point[c]) * scale[c]


# ------------------------------------------------------------ dynamic quantization of activations

cdef int min_max(const float* x, Py_ssize_t n, float* lo, float* hi) noexcept nogil:
    """Float min and max over n values; returns 1 if any is NaN or infinite.

    torch's parameter choice has no defined result for those (its zero point
    becomes a cast of NaN), so qrt refuses them rather than copy undefined behaviour.
    """
    cdef float mn = x[0], mx = x[0], v
    cdef bint nan = False
    cdef Py_ssize_t i
    for i in range(n):
        v = x[i]
        nan |= v != v
        mn = v if v < mn else mn
        mx = v if v > mx else mx
    lo[0], hi[0] = mn, mx
    return nan or isinf(mn) or isinf(mx)


cdef void choose_qparams(float lo, float hi, bint reduce_range, float* scale, int32_t* zero_point) noexcept nogil:
    """PyTorch's ChooseQuantizationParams for a quint8 activation (NUMERICS.md steps 2-5)."""
    cdef int32_t qmin = 0
    cdef int32_t qmax = 127 if reduce_range else 255
    cdef double s
    cdef float org, amp
    cdef double zp_min, zp_max, err_min, err_max, zp
    lo = lo if lo < 0 else 0
    hi = hi if hi > 0 else 0
    s = (<double>hi - lo) / (qmax - qmin)
    if <float>s == 0 or isinf(<float>1.0 / <float>s):
        s = 0.1
    if s < <double>SMALL_SCALE:
        org = <float>s
        s = SMALL_SCALE
        if lo == 0:
            hi = SMALL_SCALE * (qmax - qmin)
        elif hi == 0:
            lo = -SMALL_SCALE * (qmax - qmin)
        else:
            amp = SMALL_SCALE / org
            lo = lo * amp
            hi = hi * amp
    zp_min = qmin - lo / s
    zp_max = qmax - hi / s
    err_min = fabs(<double>qmin) - fabs(lo / s)
    err_max = fabs(<double>qmax) - fabs(hi / s)
    zp = zp_min if err_min < err_max else zp_max
    if zp < qmin:
        zero_point[0] = qmin
    elif zp > qmax:
        zero_point[0] = qmax
    else:
        zero_point[0] = <int32_t>nearbyint(zp)
    scale[0] = <float>s


cdef int quantize_activations(const float* x, Py_ssize_t n, bint reduce_range,
                              uint8_t* q, float* scale, int32_t* zero_point) noexcept nogil:
    """Choose (scale, zp) from x's range and quantize x to quint8; returns 1 on NaN or infinity."""
    cdef float lo, hi, inv, zpf
    cdef int nan = 0
    cdef Py_ssize_t i
    if min_max(x, n, &lo, &hi):
        return 1
    choose_qparams(lo, hi, reduce_range, scale, zero_point)
    inv = <float>1.0 / scale[0]
    zpf = <float>zero_point[0]
    for i in range(n):
        # clamp to 255 even under reduce_range: PyTorch does the same
        q[i] = <uint8_t>round_clamp(fmaf(x[i], inv, zpf), 0, 255, &nan)
    return 0


# ------------------------------------------------------------ integer GEMM

cdef void gemm_u8s8(const uint8_t* x, int32_t x_zp, const int8_t* w, const int32_t* w_rowsum,
                    const int32_t* w_zp, Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                    int32_t* acc) noexcept nogil:
    """acc[i, j] = sum_k (x[i, k] - x_zp) * (w[j, k] - w_zp[j]), exactly, in int32.

    Expanded as sum(x*w) - x_zp*rowsum(w) - w_zp*rowsum(x) + k*x_zp*w_zp so
    the inner loop is a plain u8 x s8 dot product the compiler vectorises.
    """
    cdef Py_ssize_t i, j, t
    cdef int32_t dot, x_sum
    cdef const uint8_t* xr
    cdef const int8_t* wr
    for i in range(m):
        xr = x + i * k
        x_sum = 0
        for t in range(k):
            x_sum += xr[t]
        for j in range(n):
            wr = w + j * k
            dot = 0
            for t in range(k):
                dot += <int32_t>xr[t] * <int32_t>wr[t]
            acc[i * n + j] = dot - x_zp * w_rowsum[j] - w_zp[j] * x_sum + <int32_t>k * x_zp * w_zp[j]


# ------------------------------------------------------------ float16-weight GEMM

cdef void gemm_f32_chain(const float* x, const float* w, const float* bias,
                         Py_ssize_t m, Py_ssize_t n, Py_ssize_t k, float* y) noexcept nogil:
    """y = x @ w.T (+ bias) as fbgemm's fp16 kernel rounds it.

    Each output is one fma chain over k in order. In the last partial block
    of 32 output columns, when k > 512, the chain restarts every 512 values
    and the block sums are added with plain float adds.
    """
    cdef Py_ssize_t i, j, t, kb, kend
    cdef Py_ssize_t tail_start = n - n % 32
    cdef float total, part
    cdef const float* xr
    cdef const float* wr
    for i in range(m):
        xr = x + i * k
        for j in range(n):
            wr = w + j * k
            if j >= tail_start and k > 512:
                total = 0
                for kb in range(0, k, 512):
                    kend = kb + 512 if kb + 512 < k else k
                    part = 0
                    for t in range(kb, kend):
                        part = fmaf(xr[t], wr[t], part)
                    total = total + part
            else:
                total = 0
                for t in range(k):
                    total = fmaf(xr[t], wr[t], total)
            y[i * n + j] = total + bias[j] if bias != NULL else total


# ------------------------------------------------------------ layers with prepared weights

cdef class DynamicLinear:
    """A dynamic quantized linear layer, weights prepared once.

    int8 weights: y = fma(fl(acc), fl(s_x * s_w[n]), bias[n]) where acc is
    the exact integer product of the per-call quantized input and the
    weights. float16 weights: widened to float32 once (exact) and applied
    with the fp16 kernel's accumulation order.
    """
    cdef readonly Py_ssize_t out_features, in_features
    cdef readonly bint is_int8
    cdef bint reduce_range
    cdef object arrays  # keeps the buffers below alive
    cdef const int8_t* w8
    cdef const float* w32
    cdef const int32_t* rowsum
    cdef const float* scale
    cdef const int32_t* zp
    cdef const float* bias

    def __init__(self, weight, scale=None, zero_point=None, bias=None, bint reduce_range=True):
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.reduce_range = reduce_range
        self.is_int8 = weight.dtype == np.int8
        cdef const float[::1] fv
        cdef const int32_t[::1] iv
        cdef const int8_t[:, ::1] w8v
        cdef const float[:, ::1] w32v
        keep = []
        if self.is_int8:
            w = np.ascontiguousarray(weight)
            s = np.ascontiguousarray(np.broadcast_to(np.asarray(scale, np.float32), (n,)))
            z = np.ascontiguousarray(np.broadcast_to(np.asarray(zero_point, np.int32), (n,)))
            rs = w.sum(axis=1, dtype=np.int32)
            keep += [w, s, z, rs]
            if n and k:
                w8v = w
                self.w8 = &w8v[0, 0]
            fv = s
            iv = z
            self.scale = &fv[0] if n else NULL
            self.zp = &iv[0] if n else NULL
            iv = rs
            self.rowsum = &iv[0] if n else NULL
        else:
            w = np.ascontiguousarray(weight, dtype=np.float32)
            keep.append(w)
            if n and k:
                w32v = w
                self.w32 = &w32v[0, 0]
        if bias is not None:
            b = np.ascontiguousarray(bias, dtype=np.float32)
            keep.append(b)
            fv = b
            self.bias = &fv[0] if n else NULL
        self.arrays = keep

    cdef int forward(self, const float* x, Py_ssize_t m, float* y,
                     uint8_t* xq, int32_t* acc) noexcept nogil:
        """y[m, n] from x[m, k]; scratch xq[m*k], acc[m*n]. Returns 1 if x holds NaN or infinity."""
        cdef Py_ssize_t n = self.out_features, k = self.in_features, i, j
        cdef float s_x
        cdef int32_t zp_x
        if m == 0 or n == 0:
            return 0
        if not self.is_int8:
            gemm_f32_chain(x, self.w32, self.bias, m, n, k, y)
            return 0
        if k == 0:
            s_x, zp_x = 0, 0
        elif quantize_activations(x, m * k, self.reduce_range, xq, &s_x, &zp_x):
            return 1
        gemm_u8s8(xq, zp_x, self.w8, self.rowsum, self.zp, m, n, k, acc)
        for i in range(m):
            for j in range(n):
                if self.bias != NULL:
                    y[i * n + j] = fmaf(<float>acc[i * n + j], s_x * self.scale[j], self.bias[j])
                else:
                    y[i * n + j] = <float>acc[i * n + j] * (s_x * self.scale[j])
        return 0

    def __call__(self, const float[:, ::1] x, float[:, ::1] y):
        """y = layer(x). Shapes are checked here, before the GIL is released."""
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.in_features or y.shape[0] != m or y.shape[1] != self.out_features:
            raise ValueError("DynamicLinear: shape mismatch")
        cdef uint8_t[::1] xq = np.empty(m * self.in_features if self.is_int8 else 0, np.uint8)
        cdef int32_t[::1] acc = np.empty(m * self.out_features if self.is_int8 else 0, np.int32)
        cdef int nan
        with nogil:
            nan = self.forward(&x[0, 0] if m and self.in_features else NULL, m,
                               &y[0, 0] if m and self.out_features else NULL,
                               &xq[0] if xq.shape[0] else NULL, &acc[0] if acc.shape[0] else NULL)
        if nan:
            raise ValueError("input contains NaN or infinity, which dynamic quantization cannot represent")


cdef class StaticLinear:
    """Static quantized linear (+ReLU): quint8 in, qint8 weights, float bias, quint8 out.

    Requantization as fbgemm does it: a float multiplier per output channel,
    the bias folded into the accumulator scale first, the rounded value
    saturated to int16 before the zero point is added and the result clamped.
    """
    cdef readonly Py_ssize_t out_features, in_features
    cdef int32_t x_zp, y_zp, lo
    cdef bint per_channel, has_bias
    cdef float bias_inv  # per-tensor: fl(1 / double(a_w))
    cdef object arrays
    cdef const int8_t* w
    cdef const int32_t* rowsum
    cdef const int32_t* w_zp
    cdef const float* bias
    cdef const float* bias_q  # per-channel: fl(bias / a_w)
    cdef const float* mult

    def __init__(self, weight, w_scale, w_zero_point, bias, float x_scale, int32_t x_zero_point,
                 float y_scale, int32_t y_zero_point, bint relu):
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.x_zp, self.y_zp = x_zero_point, y_zero_point
        self.lo = y_zero_point if relu else 0  # ReLU is the lower clamp at the zero point
        self.per_channel = np.ndim(w_scale) == 1
        self.has_bias = bias is not None
        w = np.ascontiguousarray(weight)
        s_w = np.broadcast_to(np.asarray(w_scale, np.float32), (n,))
        a_w = (np.float32(x_scale) * s_w).astype(np.float32)
        mult = np.ascontiguousarray(a_w / np.float32(y_scale), dtype=np.float32)
        z = np.ascontiguousarray(np.broadcast_to(np.asarray(w_zero_point, np.int32), (n,)))
        rs = w.sum(axis=1, dtype=np.int32)
        b = np.ascontiguousarray(bias if bias is not None else np.zeros(n), dtype=np.float32)
        with np.errstate(over="ignore"):  # a huge bias over a tiny a_w saturates: inf is its right value
            bq = (b / a_w).astype(np.float32)
        self.bias_inv = np.float32(1.0 / np.float64(a_w[0])) if n else 0
        self.arrays = [w, mult, z, rs, b, bq]
        cdef const int8_t[:, ::1] wv = w
        cdef const float[::1] fv
        cdef const int32_t[::1] iv
        if n and k:
            self.w = &wv[0, 0]
        if n:
            fv = mult
            self.mult = &fv[0]
            fv = b
            self.bias = &fv[0]
            fv = bq
            self.bias_q = &fv[0]
            iv = z
            self.w_zp = &iv[0]
            iv = rs
            self.rowsum = &iv[0]

    cdef void forward(self, const uint8_t* x, Py_ssize_t m, uint8_t* y, int32_t* acc) noexcept nogil:
        cdef Py_ssize_t n = self.out_features, i, j
        cdef float v, r
        cdef int32_t q
        gemm_u8s8(x, self.x_zp, self.w, self.rowsum, self.w_zp, m, n, self.in_features, acc)
        for i in range(m):
            for j in range(n):
                v = <float>acc[i * n + j]
                if self.has_bias:
                    if self.per_channel:
                        v = v + self.bias_q[j]
                    else:
                        v = fmaf(self.bias[j], self.bias_inv, v)
                r = nearbyintf(v * self.mult[j])
                r = -32768 if r < -32768 else (32767 if r > 32767 else r)  # int16 saturation
                q = <int32_t>r + self.y_zp
                y[i * n + j] = <uint8_t>(self.lo if q < self.lo else (255 if q > 255 else q))

    def __call__(self, const uint8_t[:, ::1] x, uint8_t[:, ::1] y):
        cdef Py_ssize_t m = x.shape[0]
        if x.shape[1] != self.in_features or y.shape[0] != m or y.shape[1] != self.out_features:
            raise ValueError("StaticLinear: shape mismatch")
        if m == 0 or self.out_features == 0:
            return
        cdef int32_t[::1] acc = np.empty(m * self.out_features, np.int32)
        with nogil:
            self.forward(&x[0, 0] if self.in_features else NULL, m, &y[0, 0], &acc[0])


# ------------------------------------------------------------ recurrent layers

cdef enum Kind:
    RNN_TANH, RNN_RELU, LSTM, GRU

KINDS = {"rnn_tanh": RNN_TANH, "rnn_relu": RNN_RELU, "lstm": LSTM, "gru": GRU}
GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}


cdef inline float sigmoid(float v) noexcept nogil:
    return <float>1.0 / (<float>1.0 + expf(-v))


cdef void gate_update(int kind, const float* gi, const float* gh, const float* h, const float* c,
                      float* h_out, float* c_out, Py_ssize_t batch, Py_ssize_t hidden) noexcept nogil:
    """The elementwise part of one step, from gi = lin_ih(x) and gh = lin_hh(h), in torch's order.

    RNN:  h' = act(gh + gi)
    LSTM: chunks i, f, g, o;  c' = sig(f) * c + sig(i) * tanh(g);  h' = sig(o) * tanh(c')
    GRU:  chunks r, z, n;  r = sig(gh_r + gi_r);  z = sig(gh_z + gi_z);
          n = tanh(gi_n + gh_n * r);  h' = (h - n) * z + n
    Each product and sum rounds on its own (no contraction), as torch's separate tensor ops do.
    """
    cdef Py_ssize_t b, j, g = 1 if kind <= RNN_RELU else (4 if kind == LSTM else 3)
    cdef const float* xi
    cdef const float* xh
    cdef float v, ig, fg, cg, og, c_new, r, z, n
    for b in range(batch):
        xi = gi + b * g * hidden
        xh = gh + b * g * hidden
        for j in range(hidden):
            if kind == RNN_TANH:
                h_out[b * hidden + j] = tanhf(xh[j] + xi[j])
            elif kind == RNN_RELU:
                v = xh[j] + xi[j]
                h_out[b * hidden + j] = v if v > 0 else 0
            elif kind == LSTM:
                ig = sigmoid(xh[j] + xi[j])
                fg = sigmoid(xh[hidden + j] + xi[hidden + j])
                cg = tanhf(xh[2 * hidden + j] + xi[2 * hidden + j])
                og = sigmoid(xh[3 * hidden + j] + xi[3 * hidden + j])
                c_new = fg * c[b * hidden + j] + ig * cg
                c_out[b * hidden + j] = c_new
                h_out[b * hidden + j] = og * tanhf(c_new)
            else:
                r = sigmoid(xh[j] + xi[j])
                z = sigmoid(xh[hidden + j] + xi[hidden + j])
                n = tanhf(xi[2 * hidden + j] + xh[2 * hidden + j] * r)
                h_out[b * hidden + j] = (h[b * hidden + j] - n) * z + n


def check_states(Py_ssize_t batch, Py_ssize_t hidden, list shapes):
    for shape in shapes:
        if shape != (batch, hidden):
            raise ValueError(f"state has shape {list(shape)}, expected {[batch, hidden]}")


cdef class Recurrent:
    """One direction of a dynamic quantized recurrent layer: RNN (tanh/relu), LSTM or GRU.

    ``step`` runs one cell step; ``sequence`` runs the whole time loop in
    compiled code. For LSTM and GRU the input projection of all time steps is
    one dynamic linear over T*B rows (torch quantizes it over the whole
    sequence at once); for RNN it is per step, as a loop of RNNCells does.
    """
    cdef DynamicLinear ih, hh
    cdef int kind
    cdef readonly Py_ssize_t hidden, input_size
    cdef Py_ssize_t gates

    def __init__(self, str kind, DynamicLinear ih, DynamicLinear hh):
        self.kind = KINDS[kind]
        self.gates = GATES[kind]
        self.ih, self.hh = ih, hh
        self.hidden = hh.in_features
        self.input_size = ih.in_features
        if hh.out_features != self.gates * self.hidden or ih.out_features != hh.out_features:
            raise ValueError("Recurrent: weight shapes do not match the gate count")

    def step(self, const float[:, ::1] x, const float[:, ::1] h, const float[:, ::1] c,
             float[:, ::1] h_out, float[:, ::1] c_out):
        """One step; c and c_out are used by LSTM only (pass h and h_out otherwise)."""
        cdef Py_ssize_t b = x.shape[0], hidden = self.hidden, rows = self.gates * self.hidden
        check_states(b, hidden, [(h.shape[0], h.shape[1]), (c.shape[0], c.shape[1]),
                                 (h_out.shape[0], h_out.shape[1]), (c_out.shape[0], c_out.shape[1])])
        if x.shape[1] != self.input_size:
            raise ValueError(f"x has {x.shape[1]} features, expected {self.input_size}")
        if b == 0 or hidden == 0:
            return
        cdef float[::1] gi = np.empty(b * rows, np.float32)
        cdef float[::1] gh = np.empty(b * rows, np.float32)
        cdef uint8_t[::1] xq = np.empty(b * max(self.input_size, hidden), np.uint8)
        cdef int32_t[::1] acc = np.empty(b * rows, np.int32)
        cdef int nan
        with nogil:
            nan = self.ih.forward(&x[0, 0] if self.input_size else NULL, b, &gi[0],
                                  &xq[0] if self.input_size else NULL, &acc[0])
            nan |= self.hh.forward(&h[0, 0], b, &gh[0], &xq[0], &acc[0])
            if not nan:
                gate_update(self.kind, &gi[0], &gh[0], &h[0, 0], &c[0, 0], &h_out[0, 0], &c_out[0, 0],
                            b, hidden)
        if nan:
            raise ValueError("input contains NaN or infinity, which dynamic quantization cannot represent")

    def sequence(self, const float[:, :, ::1] x, float[:, :, ::1] y, Py_ssize_t y_offset, bint reverse,
                 float[:, ::1] h, float[:, ::1] c):
        """Run over x [T, B, I]; write h_t into y[t, :, y_offset:y_offset+H].

        h and c hold the initial state on entry and the final state on return.
        """
        cdef Py_ssize_t steps = x.shape[0], b = x.shape[1], hidden = self.hidden
        cdef Py_ssize_t n_in = self.input_size, rows = self.gates * hidden, t, s, i
        if x.shape[2] != n_in or y.shape[0] != steps or y.shape[1] != b or y_offset + hidden > y.shape[2]:
            raise ValueError("Recurrent: sequence shape mismatch")
        check_states(b, hidden, [(h.shape[0], h.shape[1]), (c.shape[0], c.shape[1])])
        if steps == 0 or b == 0 or hidden == 0:
            return
        cdef bint whole = self.kind == LSTM or self.kind == GRU
        cdef Py_ssize_t gi_rows = steps * b if whole else b
        cdef float[::1] gi = np.empty(gi_rows * rows, np.float32)
        cdef float[::1] gh = np.empty(b * rows, np.float32)
        cdef float[::1] h_new = np.empty(b * hidden, np.float32)
        cdef float[::1] c_new = np.empty(b * hidden, np.float32)
        cdef uint8_t[::1] xq = np.empty(max(gi_rows * n_in, b * hidden), np.uint8)
        cdef int32_t[::1] acc = np.empty(gi_rows * rows, np.int32)
        cdef int nan = 0
        cdef const float* gi_t
        with nogil:
            if whole:
                nan = self.ih.forward(&x[0, 0, 0] if n_in else NULL, steps * b, &gi[0],
                                      &xq[0] if n_in else NULL, &acc[0])
            for s in range(steps):
                if nan:
                    break
                t = steps - 1 - s if reverse else s
                if whole:
                    gi_t = &gi[t * b * rows]
                else:
                    nan = self.ih.forward(&x[t, 0, 0] if n_in else NULL, b, &gi[0],
                                          &xq[0] if n_in else NULL, &acc[0])
                    gi_t = &gi[0]
                nan |= self.hh.forward(&h[0, 0], b, &gh[0], &xq[0], &acc[0])
                gate_update(self.kind, gi_t, &gh[0], &h[0, 0], &c[0, 0], &h_new[0], &c_new[0], b, hidden)
                memcpy(&h[0, 0], &h_new[0], b * hidden * sizeof(float))
                if self.kind == LSTM:
                    memcpy(&c[0, 0], &c_new[0], b * hidden * sizeof(float))
                for i in range(b):
                    memcpy(&y[t, i, y_offset], &h_new[i * hidden], hidden * sizeof(float))
        if nan:
            raise ValueError("input contains NaN or infinity, which dynamic quantization cannot represent")
