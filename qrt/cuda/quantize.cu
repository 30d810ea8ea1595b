// quantize / dequantize, per tensor and per channel (NUMERICS.md Q1-Q3).
// One template per job; the extern "C" entry points below instantiate it
// for quint8 (u8), qint8 (s8) and qint32 (int).
#include "common.cuh"

// Q1 for 8-bit targets: rne(fma(x, fl(1/s), zp)); Q2 for qint32: the product
// and the sum rounded separately.
template <typename T>
__device__ void quantize_per_tensor(const float* x, unsigned n, float scale, int zero_point, T* y) {
    const float inv = __fdiv_rn(1.0f, scale), zp = (float)zero_point;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = sizeof(T) == 4 ? __fadd_rn(__fmul_rn(x[i], inv), zp) : __fmaf_rn(x[i], inv, zp);
        y[i] = (T)round_clamp(v, QRange<T>::lo, QRange<T>::hi);
    }
}

// Q2: x viewed as [outer, channels, inner]; rne(fl(fl(x * fl(1/s_c)) + zp_c)), no fma. s_c is fl(scale)
// even when the file holds float64: torch computes 1.0f / (float)scale.
template <typename T>
__device__ void quantize_per_channel(const float* x, unsigned n, unsigned channels, unsigned inner,
                                     const float* scale, const int* zero_point, T* y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned c = (i / inner) % channels;
        const float v = __fadd_rn(__fmul_rn(x[i], __fdiv_rn(1.0f, scale[c])), (float)zero_point[c]);
        y[i] = (T)round_clamp(v, QRange<T>::lo, QRange<T>::hi);
    }
}

// Q3 per tensor: fl(q - zp) * s in float32, q - zp wrapping in int32 as torch's (and the CPU's) does.
template <typename T>
__device__ void dequantize_per_tensor(const T* q, unsigned n, float scale, int zero_point, float* y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = __fmul_rn(__int2float_rn((int)((unsigned)(int)q[i] - (unsigned)zero_point)), scale);
}

// Q3 per channel, as torch computes it: fl(double(fl(fl(q) - fl(zp_c))) * s_c) with s_c float64 (the
// subtraction is float32, exact for 8-bit q, may round for qint32 beyond 2**24; the product is double).
template <typename T>
__device__ void dequantize_per_channel(const T* q, unsigned n, unsigned channels, unsigned inner,
                                       const double* scale, const int* zero_point, float* y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned c = (i / inner) % channels;
        const float d = __fsub_rn(__int2float_rn((int)q[i]), __int2float_rn(zero_point[c]));
        y[i] = __double2float_rn(__dmul_rn((double)d, scale[c]));
    }
}

#define QRT_QUANTIZE_ENTRIES(SUFFIX, T)                                                                   \
    extern "C" __global__ void quantize_per_tensor_##SUFFIX(const float* x, unsigned n, float scale,     \
                                                            int zero_point, T* y) {                      \
        quantize_per_tensor<T>(x, n, scale, zero_point, y);                                               \
    }                                                                                                     \
    extern "C" __global__ void quantize_per_channel_##SUFFIX(const float* x, unsigned n, unsigned channels, \
                                                             unsigned inner, const float* scale,          \
                                                             const int* zero_point, T* y) {               \
        quantize_per_channel<T>(x, n, channels, inner, scale, zero_point, y);                             \
    }                                                                                                     \
    extern "C" __global__ void dequantize_per_tensor_##SUFFIX(const T* q, unsigned n, float scale,       \
                                                              int zero_point, float* y) {                 \
        dequantize_per_tensor<T>(q, n, scale, zero_point, y);                                             \
    }                                                                                                     \
    extern "C" __global__ void dequantize_per_channel_##SUFFIX(const T* q, unsigned n, unsigned channels, \
                                                               unsigned inner, const double* scale,       \
                                                               const int* zero_point, float* y) {         \
        dequantize_per_channel<T>(q, n, channels, inner, scale, zero_point, y);                           \
    }

QRT_QUANTIZE_ENTRIES(uint8, u8)
QRT_QUANTIZE_ENTRIES(int8, s8)
QRT_QUANTIZE_ENTRIES(int32, int)
