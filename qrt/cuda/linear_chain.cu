// The float linears, rounded as fbgemm's fp16 kernel rounds them (NUMERICS.md;
// qrt/_kernels.pyx gemm_f32_chain, the CPU's oracle): each output is one
// float32 fma chain over k in order, then a separate add of the bias. In the
// last partial block of 32 output columns, when k > 512, the chain restarts
// every 512 values and the block sums are added with plain float adds.
// linear_fp16 reads float16 weights (dynamic linear), linear_f32 float32 ones
// (linear_float, which the CPU runs through the same chain).
//
// One thread per output; weights stored transposed, wT[k][n], so a warp's
// loads at each k are contiguous.
#include "common.cuh"

__device__ __forceinline__ float widen(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact widening, subnormals kept
    return f;
}

__device__ __forceinline__ float widen(float w) { return w; }

template <typename W>
__device__ __forceinline__ float fma_chain(const float* xr, const W* wT, int n, int j, int t0, int t1) {
    float acc = 0.0f;
    for (int t = t0; t < t1; ++t) acc = __fmaf_rn(xr[t], widen(wT[(size_t)t * n + j]), acc);
    return acc;
}

template <typename W>
__device__ __forceinline__ void linear_chain(const float* x, int m, int k, const W* wT, int n, const float* bias,
                                             int has_bias, float* y) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const int tail_start = n - n % 32;
    for (int i = blockIdx.y; i < m; i += gridDim.y) {
        const float* xr = x + (size_t)i * k;
        float total;
        if (j >= tail_start && k > 512) {
            total = 0.0f;
            for (int kb = 0; kb < k; kb += 512) total = __fadd_rn(total, fma_chain(xr, wT, n, j, kb, min(kb + 512, k)));
        } else {
            total = fma_chain(xr, wT, n, j, 0, k);
        }
        y[(size_t)i * n + j] = has_bias ? __fadd_rn(total, bias[j]) : total;
    }
}

extern "C" __global__ void linear_fp16(const float* x, int m, int k, const unsigned short* wT, int n,
                                       const float* bias, int has_bias, float* y) {
    linear_chain(x, m, k, wT, n, bias, has_bias, y);
}

extern "C" __global__ void linear_f32(const float* x, int m, int k, const float* wT, int n, const float* bias,
                                      int has_bias, float* y) {
    linear_chain(x, m, k, wT, n, bias, has_bias, y);
}
