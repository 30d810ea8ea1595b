// Pieces shared by the int8 GEMM kernels and the fused RNN step: the exact
// int32 accumulator, the two epilogues, and a warp's u8 x s8 dot products.
#pragma once
#include "common.cuh"

enum { EPI_FLOAT = 0, EPI_REQUANT = 1 };

// One layer's epilogue data, per output column j unless noted.
struct Epilogue {
    int k;              // true inner size (without padding)
    const int* wsum;    // sum_k q_w[j, k]
    const int* wzp;     // weight zero point
    const int* xsum;    // sum_k q_x[i, k]; read only when has_wzp
    int has_wzp;
    const QParams* xq;  // input scale and zero point (device memory)
    const float* s_w;   // EPI_FLOAT: weight scale
    const float* bias;  // EPI_FLOAT: bias, EPI_REQUANT: float bias (bias_mode 1)
    int bias_mode;      // 0 none; EPI_FLOAT 1: bias; EPI_REQUANT 1: per-tensor, 2: per-channel
    const float* mult;  // EPI_REQUANT: fl(fl(s_x * s_w) / s_o)
    const float* bias_q;  // EPI_REQUANT per-channel: fl(bias / a_w)
    float bias_inv;     // EPI_REQUANT per-tensor: fl(1 / double(a_w))
    int y_zp, lo;       // EPI_REQUANT: output zero point, lower clamp (y_zp under ReLU)
};

// acc = sum_k (q_x - zp_x)(q_w - zp_w) from dot = sum_k q_x q_w, modulo 2**32
// like the CPU's int32 expansion (unsigned arithmetic: wrapping is defined).
__device__ __forceinline__ int exact_acc(const Epilogue& e, int dot, int i, int j, int xzp) {
    unsigned a = (unsigned)dot - (unsigned)xzp * (unsigned)e.wsum[j];
    if (e.has_wzp) {
        const unsigned wz = (unsigned)e.wzp[j];
        a = a - wz * (unsigned)e.xsum[i] + (unsigned)e.k * (unsigned)xzp * wz;
    }
    return (int)a;
}

// Dynamic linear: y = fma(fl(acc), fl(s_x * s_w), bias), or fl(fl(acc) * fl(s_x * s_w)).
__device__ __forceinline__ float epilogue_float(const Epilogue& e, int acc, int j, float s_x) {
    const float a = __int2float_rn(acc), sc = __fmul_rn(s_x, e.s_w[j]);
    return e.bias_mode ? __fmaf_rn(a, sc, e.bias[j]) : __fmul_rn(a, sc);
}

// Static linear: bias folded into the accumulator scale, float multiplier,
// int16 saturation, zero point, clamp to [lo, 255].
__device__ __forceinline__ u8 epilogue_requant(const Epilogue& e, int acc, int j) {
    float v = __int2float_rn(acc);
    if (e.bias_mode == 1) v = __fmaf_rn(e.bias[j], e.bias_inv, v);
    else if (e.bias_mode == 2) v = __fadd_rn(v, e.bias_q[j]);
    float r = rintf(__fmul_rn(v, e.mult[j]));
    r = r < -32768.0f ? -32768.0f : (r > 32767.0f ? 32767.0f : r);
    const int q = (int)r + e.y_zp;
    return (u8)(q < e.lo ? e.lo : (q > 255 ? 255 : q));
}

template <int EPI>
__device__ __forceinline__ void store(const Epilogue& e, void* y, int n, int i, int j, int dot, const QParams& xq) {
    const int acc = exact_acc(e, dot, i, j, xq.zp);
    if (EPI == EPI_FLOAT) static_cast<float*>(y)[(size_t)i * n + j] = epilogue_float(e, acc, j, xq.scale);
    else static_cast<u8*>(y)[(size_t)i * n + j] = epilogue_requant(e, acc, j);
}

// The Epilogue's fields as kernel parameters (CuPy passes scalars and pointers, not structs).
#define QRT_EPI_PARAMS                                                                                   \
    int k, const int *wsum, const int *wzp, const int *xsum, int has_wzp, const QParams *xq,             \
        const float *s_w, const float *bias, int bias_mode, const float *mult, const float *bias_q,      \
        float bias_inv, int y_zp, int lo
#define QRT_EPI_ARGS Epilogue{k, wsum, wzp, xsum, has_wzp, xq, s_w, bias, bias_mode, mult, bias_q, bias_inv, y_zp, lo}

// u8 x s8 dot product of 4 byte pairs, added to c (dp4a, sm_61+).
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// dot[r] = sum_k x[i0 + r, k] * w[k] for r < MB, rows past m left 0, reduced
// over the warp (every lane gets the sums). Rows are Kp bytes, Kp % 16 == 0,
// 16-byte aligned: each lane reads 16 bytes per step, the warp 512.
template <int MB>
__device__ __forceinline__ void warp_dot(const u8* x, int m, int i0, int Kp, const s8* w, int dot[MB]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < MB; ++r) dot[r] = 0;
#pragma unroll 4
    for (int kb = lane * 16; kb < Kp; kb += 32 * 16) {
        const int4 wv = *reinterpret_cast<const int4*>(w + kb);
#pragma unroll
        for (int r = 0; r < MB; ++r) {
            if (i0 + r < m) {
                const int4 xv = *reinterpret_cast<const int4*>(x + (size_t)(i0 + r) * Kp + kb);
                dot[r] = dp4a_us((unsigned)xv.x, wv.x, dot[r]);
                dot[r] = dp4a_us((unsigned)xv.y, wv.y, dot[r]);
                dot[r] = dp4a_us((unsigned)xv.z, wv.z, dot[r]);
                dot[r] = dp4a_us((unsigned)xv.w, wv.w, dot[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MB; ++r)
        for (int o = 16; o > 0; o >>= 1) dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
}
