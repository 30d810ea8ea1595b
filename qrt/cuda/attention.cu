// matmul and attention of qrt/gpu/attention.py: the CPU's qrt/kernels/attention_body.h, the same IEEE
// operations in the same order, so both backends give the same bits. Every output of a product is one
// fma chain (__fmaf_rn) over k in order from +0; nothing else contracts (--fmad=false); nothing
// flushes to zero.
//
// The softmax's max is float_ops.cu's lane_reduce, run by the first half-warp of a block over the scores in
// shared memory (float_ops.cu is included for it); its exponentials and sum are torch's (torch_exp.h).
#include "float_ops.cu"
#include "../kernels/torch_exp.h"

#define TORCH_LANES 16

enum { MASK_NONE, MASK_BOOL, MASK_FLOAT };

// The batch dimensions (at most 6: values have rank <= 8), innermost first, as kernel arguments: their sizes,
// and an operand's stride along each in elements (0 where it is broadcast). No offset table: a step
// launches kernels only, so that a CUDA graph can capture it (qrt/gpu/plan.py).
#define QRT_BATCH_RANK 6
#define QRT_SIZES(P) unsigned P##0, unsigned P##1, unsigned P##2, unsigned P##3, unsigned P##4, unsigned P##5
#define QRT_STRIDES(P) long long P##0, long long P##1, long long P##2, long long P##3, long long P##4, long long P##5
#define QRT_LIST(P) {P##0, P##1, P##2, P##3, P##4, P##5}

// Where output batch b starts in each of `count` operands.
template <int COUNT>
__device__ void batch_offsets(unsigned long long b, const unsigned* size, const long long (*stride)[QRT_BATCH_RANK],
                              long long* off) {
    for (int o = 0; o < COUNT; o++) off[o] = 0;
#pragma unroll
    for (int d = 0; d < QRT_BATCH_RANK; d++) {
        const unsigned long long rest = b / size[d], i = b - rest * size[d];
        for (int o = 0; o < COUNT; o++) off[o] += (long long)i * stride[o][d];
        b = rest;
    }
}

// y[b][i][j] = the chain over t < k of a[b][i][t] * b[b][t][j], one thread an output.
extern "C" __global__ void matmul_f32(const float* a, const float* b, float* y, unsigned long long outputs, unsigned m,
                                      unsigned k, unsigned n, QRT_SIZES(size), QRT_STRIDES(sa), QRT_STRIDES(sb)) {
    const unsigned sizes[QRT_BATCH_RANK] = QRT_LIST(size);
    const long long strides[2][QRT_BATCH_RANK] = {QRT_LIST(sa), QRT_LIST(sb)};
    for (unsigned long long o = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; o < outputs;
         o += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long row = o / n, batch = row / m;
        const unsigned j = (unsigned)(o - row * n), i = (unsigned)(row - batch * m);
        long long off[2];
        batch_offsets<2>(batch, sizes, strides, off);
        const float* ar = a + off[0] + (unsigned long long)i * k;
        const float* bc = b + off[1] + j;
        float acc = 0.0f;
        for (unsigned t = 0; t < k; t++) acc = __fmaf_rn(ar[t], bc[(unsigned long long)t * n], acc);
        y[o] = acc;
    }
}

// One block a query row (row r of batch b, blockIdx.x = b * l + r), its s scores in shared memory:
// t_j = fl(chain(q_r, k_j) * scale), then fl(t_j + mask_j) (float mask) or -inf (bool mask 0, or causal
// j > r); m = max t; p_j = exp(t_j - m) and Z their sum in torch's AVX-512 order, as the CPU's
// qrt_torch_exp_sum (attention_body.h): exp_u20 on the whole vectors of 16, lane l (thread l) summing
// j = l mod 16 from +0, the lanes folded in halves, then the rest exp in double rounded to float, added one by
// one; y[r][d] = fl(chain_j(p_j v_j[d]) * fl(1 / Z)). A row masked out entirely takes p_j = 0 and Z = 1, as
// the CPU does. The mask's row r of its batch holds s values from r * mask_stride on (elements of 1 byte,
// bool, or 4, float). blockDim.x >= 16.
extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, const unsigned char* mask,
                                         int mask_kind, unsigned mask_stride, float scale, int causal, float* y,
                                         unsigned l, unsigned s, unsigned e, unsigned ev, QRT_SIZES(size),
                                         QRT_STRIDES(sq), QRT_STRIDES(sk), QRT_STRIDES(sv), QRT_STRIDES(sm)) {
    extern __shared__ float p[];  // the row's s scores, then its p_j
    __shared__ float row_max, row_recip, lanes[TORCH_LANES];
    const unsigned sizes[QRT_BATCH_RANK] = QRT_LIST(size);
    const long long strides[4][QRT_BATCH_RANK] = {QRT_LIST(sq), QRT_LIST(sk), QRT_LIST(sv), QRT_LIST(sm)};
    const unsigned long long b = blockIdx.x / l;
    const unsigned r = blockIdx.x - (unsigned)(b * l);
    long long off[4];
    batch_offsets<4>(b, sizes, strides, off);
    const float* qr = q + off[0] + (unsigned long long)r * e;
    const float* kb = k + off[1];
    const float* vb = v + off[2];
    const unsigned long long mask_row = off[3] + (unsigned long long)r * mask_stride;
    for (unsigned j = threadIdx.x; j < s; j += blockDim.x) {
        const float* kj = kb + (unsigned long long)j * e;
        float t = 0.0f;
        for (unsigned d = 0; d < e; d++) t = __fmaf_rn(qr[d], kj[d], t);
        t = __fmul_rn(t, scale);
        if (mask_kind == MASK_FLOAT)
            t = __fadd_rn(t, ((const float*)mask)[mask_row + j]);
        else if (mask_kind == MASK_BOOL && !mask[mask_row + j])
            t = -INFINITY;
        if (causal && j > r) t = -INFINITY;
        p[j] = t;
    }
    __syncthreads();
    if (threadIdx.x < QRT_LANES) {
        const float m = lane_reduce<RED_MAX>(HalfWarp(), p, s, 1);
        if (threadIdx.x == 0) row_max = m;
    }
    __syncthreads();
    const float m = row_max;
    const unsigned whole = s / TORCH_LANES * TORCH_LANES;
    for (unsigned j = threadIdx.x; j < whole; j += blockDim.x)
        p[j] = m == -INFINITY ? 0.0f : qrt_exp_u20(__fsub_rn(p[j], m));
    __syncthreads();
    if (threadIdx.x < TORCH_LANES) {
        float acc = 0.0f;
        for (unsigned j = threadIdx.x; j < whole; j += TORCH_LANES) acc = __fadd_rn(acc, p[j]);
        lanes[threadIdx.x] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int half = TORCH_LANES / 2; half >= 1; half /= 2)
            for (int i = 0; i < half; i++) lanes[i] = __fadd_rn(lanes[i], lanes[i + half]);
        float z = lanes[0];
        for (unsigned j = whole; j < s; j++) {
            p[j] = m == -INFINITY ? 0.0f : __double2float_rn(qrt_exp_double(__fsub_rn(p[j], m)));
            z = __fadd_rn(z, p[j]);
        }
        row_recip = __fdiv_rn(1.0f, z == 0.0f ? 1.0f : z);
    }
    __syncthreads();
    const float recip = row_recip;
    float* yr = y + (unsigned long long)blockIdx.x * ev;
    for (unsigned d = threadIdx.x; d < ev; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned j = 0; j < s; j++) acc = __fmaf_rn(p[j], vb[(unsigned long long)j * ev + d], acc);
        yr[d] = __fmul_rn(acc, recip);
    }
}
