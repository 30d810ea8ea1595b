// The float32 math ops of qrt/gpu/float_ops.py: the functions, reductions and their final steps of the
// CPU's float_ops_body.h, the same IEEE operations in the same order, so both backends give the same
// bits. The scalar functions are the CPU's own (qrt/kernels/float_math.h, compiled here as device code
// with --fmad=false: every product and sum rounds as written, fmaf stays one fma).
//
// Reductions follow float_ops_body.h's order: the reduced dimension is cut into blocks of 256; in a
// block element j goes to lane j % 16, each lane combines its elements in order, the 16 lanes fold in
// halves (l with l + 8, then l + 4, l + 2, l + 1); the blocks combine in order from the op's start
// value. Here the 16 lanes are the 16 threads of a half-warp, one half-warp per reduced row (of
// any stride), and the fold is __shfl_down_sync's tree, which pairs lanes exactly so. Nothing flushes
// to zero: subnormals are kept, as on the CPU.

#include "../kernels/float_math.h"
#include "../kernels/torch_gelu.h"
#include "../kernels/torch_layer_norm.h"

#define QRT_LANES 16
#define QRT_BLOCK 256

enum { UN_RELU, UN_SIGMOID, UN_TANH, UN_SILU, UN_GELU, UN_GELU_TANH, UN_SQRT, UN_RSQRT, UN_LOG, UN_SIN, UN_COS, UN_CEIL,
       UN_FLOOR };
enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV };
enum { RED_SUM, RED_MAX };

template <int OP>
__device__ __forceinline__ float unary_fn(float x) {
    if (OP == UN_RELU) return qrt_relu(x);
    if (OP == UN_SIGMOID) return qrt_sigmoid(x);
    if (OP == UN_TANH) return qrt_tanh(x);
    if (OP == UN_SILU) return qrt_silu(x);
    if (OP == UN_GELU) return qrt_gelu_onednn(x);
    // IEEE round-to-nearest square root and division whatever nvcc's flags: the CPU's sqrtf and 1.0f / sqrtf
    if (OP == UN_SQRT) return __fsqrt_rn(x);
    if (OP == UN_RSQRT) return __fdiv_rn(1.0f, __fsqrt_rn(x));
    if (OP == UN_LOG) return qrt_logf(x);
    if (OP == UN_SIN) return qrt_sinf(x);
    if (OP == UN_COS) return qrt_cosf(x);
    if (OP == UN_CEIL) return ceilf(x);  // exact: no rounding mode enters
    if (OP == UN_FLOOR) return floorf(x);
    return qrt_gelu_tanh(x);
}

#define QRT_UNARY_ENTRY(NAME, OP)                                                                    \
    extern "C" __global__ void unary_##NAME(const float* x, float* y, unsigned n) {                  \
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) \
            y[i] = unary_fn<OP>(x[i]);                                                               \
    }
QRT_UNARY_ENTRY(relu, UN_RELU)
QRT_UNARY_ENTRY(sigmoid, UN_SIGMOID)
QRT_UNARY_ENTRY(tanh, UN_TANH)
QRT_UNARY_ENTRY(silu, UN_SILU)
QRT_UNARY_ENTRY(gelu, UN_GELU)
QRT_UNARY_ENTRY(gelu_tanh, UN_GELU_TANH)
QRT_UNARY_ENTRY(sqrt, UN_SQRT)
QRT_UNARY_ENTRY(rsqrt, UN_RSQRT)
QRT_UNARY_ENTRY(log, UN_LOG)
QRT_UNARY_ENTRY(sin, UN_SIN)
QRT_UNARY_ENTRY(cos, UN_COS)
QRT_UNARY_ENTRY(ceil, UN_CEIL)
QRT_UNARY_ENTRY(floor, UN_FLOOR)

// y = a op b with numpy broadcasting, one IEEE operation per element. The output's dimensions come
// innermost first (at most 8, merged where both operands run on contiguously, size-1 ones dropped), with
// each operand's stride along them (0 where broadcast): qrt/gpu/float_ops.py's _broadcast_view.
#define QRT_MAX_RANK 8
#define QRT_DIM_PARAMS(P) unsigned P##0, unsigned P##1, unsigned P##2, unsigned P##3, unsigned P##4, \
    unsigned P##5, unsigned P##6, unsigned P##7
#define QRT_DIM_ARRAY(P) {P##0, P##1, P##2, P##3, P##4, P##5, P##6, P##7}

template <int OP>
__device__ __forceinline__ float binary_fn(float a, float b) {
    if (OP == BIN_ADD) return __fadd_rn(a, b);
    if (OP == BIN_SUB) return __fsub_rn(a, b);
    if (OP == BIN_MUL) return __fmul_rn(a, b);
    return __fdiv_rn(a, b);
}

// Element e of y: its index along each dimension (innermost first) gives the operands' offsets.
template <int OP>
__device__ void binary(const float* a, const float* b, float* y, unsigned n, int rank, const unsigned* shape,
                       const unsigned* ta, const unsigned* tb) {
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        unsigned rest = e, oa = 0, ob = 0;
#pragma unroll
        for (int k = 0; k < QRT_MAX_RANK; k++) {
            if (k < rank) {
                const unsigned q = rest / shape[k], i = rest - q * shape[k];
                oa += i * ta[k];
                ob += i * tb[k];
                rest = q;
            }
        }
        y[e] = binary_fn<OP>(a[oa], b[ob]);
    }
}

#define QRT_BINARY_ENTRY(NAME, OP)                                                                         \
    extern "C" __global__ void binary_##NAME(const float* a, const float* b, float* y, unsigned n, int rank, \
                                             QRT_DIM_PARAMS(s), QRT_DIM_PARAMS(sa), QRT_DIM_PARAMS(sb)) {  \
        const unsigned shape[QRT_MAX_RANK] = QRT_DIM_ARRAY(s), ta[QRT_MAX_RANK] = QRT_DIM_ARRAY(sa),      \
                       tb[QRT_MAX_RANK] = QRT_DIM_ARRAY(sb);                                              \
        binary<OP>(a, b, y, n, rank, shape, ta, tb);                                                       \
    }
QRT_BINARY_ENTRY(add, BIN_ADD)
QRT_BINARY_ENTRY(sub, BIN_SUB)
QRT_BINARY_ENTRY(mul, BIN_MUL)
QRT_BINARY_ENTRY(div, BIN_DIV)

// float_ops_body.h's qrt_red_combine: max propagates NaN; the operand order kept (it decides -0.0 vs 0.0)
template <int OP>
__device__ __forceinline__ float combine(float acc, float v) {
    if (OP == RED_MAX) return (v > acc || v != v) ? v : acc;
    return __fadd_rn(acc, v);
}

// The reduced rows of an [outer, n, inner] view, one per half-warp: row r is column c = r % inner of
// slab o = r / inner, its elements x[o * n * inner + j * inner + c]. Every lane of the half-warp
// runs the same rows, so the shuffles below see all 16.
struct HalfWarp {
    unsigned lane, mask, first, step;
    __device__ HalfWarp()
        : lane(threadIdx.x & (QRT_LANES - 1)),
          mask(0xffffu << (threadIdx.x & QRT_LANES)),
          first((blockIdx.x * blockDim.x + threadIdx.x) / QRT_LANES),
          step(gridDim.x * blockDim.x / QRT_LANES) {}
};

// The reduction (OP) of x[j * stride], j < n, in the CPU's order; every lane gets the result.
// Lane l reads only the elements j % 16 == l (a block starts at a multiple of 16): those a lane
// wrote itself before (softmax's exponentials) need no barrier.
template <int OP>
__device__ float lane_reduce(const HalfWarp& w, const float* x, unsigned n, unsigned stride) {
    constexpr int FOLD = OP == RED_MAX ? RED_MAX : RED_SUM;
    const float init = OP == RED_MAX ? -INFINITY : 0.0f;
    float total = init;  // lane 0's is the result
    for (unsigned j0 = 0; j0 < n; j0 += QRT_BLOCK) {
        const unsigned nb = n - j0 < QRT_BLOCK ? n - j0 : QRT_BLOCK;
        float acc = init;
        for (unsigned j = w.lane; j < nb; j += QRT_LANES) acc = combine<OP>(acc, x[(j0 + j) * stride]);
        for (int half = QRT_LANES / 2; half > 0; half /= 2)  // lane l takes lane l + half's; l < half matter
            acc = combine<FOLD>(acc, __shfl_down_sync(w.mask, acc, half, QRT_LANES));
        total = combine<FOLD>(total, acc);
    }
    return __shfl_sync(w.mask, total, 0, QRT_LANES);
}

// sum: the lane sum (0 for n = 0); mean: fl(sum / fl(n)) (0 / 0, NaN, for n = 0). y[o * inner + c].
template <int MEAN>
__device__ void sum_rows(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    const HalfWarp w;
    for (unsigned r = w.first; r < outer * inner; r += w.step) {
        const unsigned o = r / inner, c = r - o * inner;
        float s = lane_reduce<RED_SUM>(w, x + o * n * inner + c, n, inner);
        if (MEAN) s = __fdiv_rn(s, (float)n);
        if (w.lane == 0) y[r] = s;
    }
}

extern "C" __global__ void sum_f32(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    sum_rows<0>(x, y, outer, n, inner);
}
extern "C" __global__ void mean_f32(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    sum_rows<1>(x, y, outer, n, inner);
}

// softmax: m = max, e_j = exp(x_j - m) (stored in y), s = the lane sum of e, y_j = e_j / s;
// log_softmax: y_j = (x_j - m) - log(s). n >= 1.
template <int LOG>
__device__ void softmax_rows(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    const HalfWarp w;
    for (unsigned r = w.first; r < outer * inner; r += w.step) {
        const unsigned o = r / inner, at = o * n * inner + (r - o * inner);
        const float* xr = x + at;
        float* yr = y + at;
        const float m = lane_reduce<RED_MAX>(w, xr, n, inner);
        for (unsigned j = w.lane; j < n; j += QRT_LANES) yr[j * inner] = qrt_exp_full(__fsub_rn(xr[j * inner], m));
        const float s = lane_reduce<RED_SUM>(w, yr, n, inner);
        if (LOG) {
            const float ls = qrt_logf(s);
            for (unsigned j = w.lane; j < n; j += QRT_LANES)
                yr[j * inner] = __fsub_rn(__fsub_rn(xr[j * inner], m), ls);
        } else {
            for (unsigned j = w.lane; j < n; j += QRT_LANES) yr[j * inner] = __fdiv_rn(yr[j * inner], s);
        }
    }
}

extern "C" __global__ void softmax_f32(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    softmax_rows<0>(x, y, outer, n, inner);
}
extern "C" __global__ void log_softmax_f32(const float* x, float* y, unsigned outer, unsigned n, unsigned inner) {
    softmax_rows<1>(x, y, outer, n, inner);
}

// batch_norm's elements: x, y viewed as [outer, channels, inner], y = fma(x, alpha[c], beta[c]) with the terms the
// host computed (the CPU's batch_norm_terms, qrt/gpu/float_ops.py).
extern "C" __global__ void batch_norm_f32(const float* x, const float* alpha, const float* beta, float* y, unsigned n,
                                          unsigned channels, unsigned inner) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned c = i / inner % channels;
        y[i] = __fmaf_rn(x[i], alpha[c], beta[c]);
    }
}

// torch 2.13's layer_norm (torch_layer_norm.h), a row per half-warp: lanes 0-7 run the 8 Welford lanes of the
// CPU's vector part (each its own lane, as the CPU's vector code does), lane 0 gathers them (shuffles) and runs
// the tail and the lane merge, then all 16 write the outputs. w and b each skipped when null. n >= 1.
extern "C" __global__ void layer_norm_f32(const float* x, const float* wt, const float* b, float eps, float* y,
                                          unsigned rows, unsigned n) {
    const HalfWarp w;
    for (unsigned r = w.first; r < rows; r += w.step) {
        const float* xr = x + (size_t)r * n;
        float* yr = y + (size_t)r * n;
        float m1[QRT_LN_LANES], m2[QRT_LN_LANES];
        const int l = w.lane < QRT_LN_LANES ? (int)w.lane : 0;
        qrt_ln_lane_moments(xr, n, n / QRT_LN_LANES, 1, l, l + 1, m1, m2);
        float mine1 = m1[l], mine2 = m2[l], mean = 0.0f, rstd = 0.0f;
        for (int k = 0; k < QRT_LN_LANES; k++) {
            m1[k] = __shfl_sync(w.mask, mine1, k, QRT_LANES);
            m2[k] = __shfl_sync(w.mask, mine2, k, QRT_LANES);
        }
        if (w.lane == 0) qrt_ln_finish(xr, n, m1, m2, eps, &mean, &rstd);
        mean = __shfl_sync(w.mask, mean, 0, QRT_LANES);
        rstd = __shfl_sync(w.mask, rstd, 0, QRT_LANES);
        for (unsigned j = w.lane; j < n; j += QRT_LANES) yr[j] = qrt_ln_out(xr[j], mean, rstd, wt, b, j);
    }
}
