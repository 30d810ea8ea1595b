// Dynamic quantization of float activations on the device: min/max over the
// whole tensor, ChooseQuantizationParams, quantize to quint8. No host round
// trip: the parameters stay in device memory (QParams) for the GEMM epilogue.
//
// Small tensors: dq_small, one block per tensor, up to two tensors per launch
// (an RNN step quantizes x and h together). Large tensors: dq_partial
// (per-block min/max) then dq_finish, where every block folds the partials,
// derives the same parameters and quantizes its share.
#include "common.cuh"

struct DQJob {
    const float* x;
    int m, k, Kp;
    QParams* p;
    u8* q;
};

__device__ __forceinline__ void dq_one_block(const DQJob& j, int qmax) {
    __shared__ QParams sp;
    const unsigned n = (unsigned)j.m * (unsigned)j.k;
    float mn = __int_as_float(0x7f800000), mx = __int_as_float(0xff800000);
    int nan = 0;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = j.x[i];
        nan |= v != v;
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    block_minmax(mn, mx, nan);
    if (threadIdx.x == 0) {
        sp = choose_qparams(mn, mx, nan, qmax);
        *j.p = sp;
    }
    __syncthreads();
    const QParams p = sp;
    quantize_rows(j.x, j.m, j.k, j.Kp, p, j.q, threadIdx.x, blockDim.x);
}

extern "C" __global__ void dq_small(const float* x0, int m0, int k0, int Kp0, QParams* p0, u8* q0,
                                    const float* x1, int m1, int k1, int Kp1, QParams* p1, u8* q1, int qmax) {
    const DQJob j = blockIdx.x == 0 ? DQJob{x0, m0, k0, Kp0, p0, q0} : DQJob{x1, m1, k1, Kp1, p1, q1};
    dq_one_block(j, qmax);
}

// part[3 * b + {0, 1, 2}] = min, max, NaN flag (as 0 / 1) of block b's share.
extern "C" __global__ void dq_partial(const float* x, unsigned n, float* part) {
    float mn = __int_as_float(0x7f800000), mx = __int_as_float(0xff800000);
    int nan = 0;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        nan |= v != v;
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    block_minmax(mn, mx, nan);
    if (threadIdx.x == 0) {
        part[3 * blockIdx.x] = mn;
        part[3 * blockIdx.x + 1] = mx;
        part[3 * blockIdx.x + 2] = (float)nan;
    }
}

extern "C" __global__ void dq_finish(const float* x, int m, int k, int Kp, const float* part, int nparts,
                                     int qmax, QParams* p_out, u8* q) {
    __shared__ QParams sp;
    float mn = __int_as_float(0x7f800000), mx = __int_as_float(0xff800000);
    int nan = 0;
    for (int b = threadIdx.x; b < nparts; b += blockDim.x) {
        mn = fminf(mn, part[3 * b]);
        mx = fmaxf(mx, part[3 * b + 1]);
        nan |= part[3 * b + 2] != 0.0f;
    }
    block_minmax(mn, mx, nan);
    if (threadIdx.x == 0) {
        sp = choose_qparams(mn, mx, nan, qmax);
        if (blockIdx.x == 0) *p_out = sp;
    }
    __syncthreads();
    const QParams p = sp;
    quantize_rows(x, m, k, Kp, p, q, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// Row sums of q[m, Kp] (only needed when some weight zero point is not 0).
extern "C" __global__ void row_sums_u8(const u8* q, int m, int Kp, int* sums) {
    for (int row = blockIdx.x; row < m; row += gridDim.x) {
        int s = 0;
        for (int c = threadIdx.x; c < Kp; c += blockDim.x) s += q[(size_t)row * Kp + c];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        __shared__ int ws[32];
        if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            int t = 0;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += ws[w];
            sums[row] = t;
        }
        __syncthreads();
    }
}
