// linear_dynamic with activation "per_row_symmetric" (torchao's Int8Tensor linear): each row of x
// quantized symmetrically to int8 with its own scale, the exact int32 product, and torchao's epilogue.
// The same float steps as the CPU (qrt/kernels/quantize.h qrt_quantize_rows_s8, gemm_i8.h
// qrt_dequantize_row_scaled), each rounding named.
#include "gemm_common.cuh"

#define TORCHAO_EPS 1.1920928955078125e-07f  // torchao's floor of a scale: float32's eps, 2^-23

// One block per row i: s = max(fl(max|x_i| / 127.5), eps), q = clamp(rne(fl(x * fl(1 / s))), -128, 127)
// stored as q + 128 (zero point 128 against the u8 x s8 dot products); the padding to Kp holds 128 (0).
// NaN or infinity gives a NaN scale (the CPU raises ValueError; the device cannot): that row's outputs are NaN.
extern "C" __global__ void dq_rows_symmetric(const float* x, int m, int k, int Kp, float* scales, u8* q) {
    __shared__ float ss;
    for (int i = blockIdx.x; i < m; i += gridDim.x) {
        const float* row = x + (size_t)i * k;
        float amax = 0.0f;
        int nan = 0;
        for (int t = threadIdx.x; t < k; t += blockDim.x) {
            const float a = fabsf(row[t]);
            nan |= !(a <= 3.40282347e38f);  // NaN or infinity
            amax = fmaxf(amax, a);
        }
        float lo = -amax;  // block_minmax reduces (min, max, nan): max|x| is max(-min(-|x|))
        block_minmax(lo, amax, nan);
        if (threadIdx.x == 0) {
            float s = __fdiv_rn(amax, 127.5f);
            s = nan ? __int_as_float(0x7fc00000) : (s > TORCHAO_EPS ? s : TORCHAO_EPS);
            scales[i] = s;
            ss = s;
        }
        __syncthreads();
        const float inv = __fdiv_rn(1.0f, ss);
        for (int t = threadIdx.x; t < Kp; t += blockDim.x) {
            float r = t < k ? rintf(__fmul_rn(row[t], inv)) : 0.0f;
            r = r < -128.0f ? -128.0f : (r > 127.0f ? 127.0f : r);
            q[(size_t)i * Kp + t] = (u8)((int)r + 128);
        }
        __syncthreads();
    }
}

// y[i, j] = fl(fl(fl(acc) * s_x[i]) * s_w[j]) + bias[j], acc = sum_k (q[i, k] - 128) * w[j, k] exactly:
// a warp per column j of row blockIdx.y (8 columns a block of 256 threads).
extern "C" __global__ void linear_rows_symmetric(const u8* q, int m, int Kp, const s8* w, int n, const int* wsum,
                                                 const float* s_x, const float* s_w, const float* bias, int has_bias,
                                                 float* y) {
    const int j = blockIdx.x * 8 + (threadIdx.x >> 5);
    for (int i = blockIdx.y; i < m; i += gridDim.y) {
        if (j >= n) return;
        int dot[1];
        warp_dot<1>(q, m, i, Kp, w + (size_t)j * Kp, dot);
        if ((threadIdx.x & 31) == 0) {
            const int acc = (int)((unsigned)dot[0] - 128u * (unsigned)wsum[j]);
            const float v = __fmul_rn(__fmul_rn(__int2float_rn(acc), s_x[i]), s_w[j]);
            y[(size_t)i * n + j] = has_bias ? __fadd_rn(v, bias[j]) : v;
        }
    }
}
