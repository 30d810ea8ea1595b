// Float16-weight dynamic linear, rounded as fbgemm's fp16 kernel rounds it
// (NUMERICS.md; qrt/_kernels.pyx gemm_f32_chain): each output is one float32
// fma chain over k in order, then a separate add of the bias. In the last
// partial block of 32 output columns, when k > 512, the chain restarts every
// 512 values and the block sums are added with plain float adds.
//
// One thread per output; weights stored transposed, wT[k][n] as float16 bits,
// so a warp's loads at each k are contiguous.
#include "common.cuh"

__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact widening, subnormals kept
    return f;
}

__device__ __forceinline__ float fma_chain(const float* xr, const unsigned short* wT, int n, int j, int t0, int t1) {
    float acc = 0.0f;
    for (int t = t0; t < t1; ++t) acc = __fmaf_rn(xr[t], half_bits_to_float(wT[(size_t)t * n + j]), acc);
    return acc;
}

extern "C" __global__ void linear_fp16(const float* x, int m, int k, const unsigned short* wT, int n,
                                       const float* bias, int has_bias, float* y) {
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
