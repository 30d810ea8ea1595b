// matmul and attention of qrt/gpu/attention.py: the CPU's qrt/kernels/attention_body.h, the same IEEE
// operations in the same order, so both backends give the same bits. Every output of a product is one
// fma chain (__fmaf_rn) over k in order from +0; nothing else contracts (--fmad=false); nothing
// flushes to zero.
//
// The softmax's max is float_ops.cu's lane_reduce, run by the first half-warp of a block over the scores' whole
// vectors of 16 in shared memory (float_ops.cu is included for it), then the rest as torch takes it (NaN skipped
// without a mask); its exponentials and sum are torch's (torch_exp.h).
#include "float_ops.cu"
#include "../kernels/torch_exp.h"

#define TORCH_LANES 16     // torch's AVX-512 lanes
#define TORCH_KV_BLOCK 512  // its blocks of keys
#define TORCH_GEMM_K 384    // its sgemm's longest single chain

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

// The context product's sum for keys [j0, j0 + kb) of a row: one chain, or over 384 keys two (the first
// ceil(kb / 2), then the rest), each added to y in turn (attention_body.h's qrt_torch_gemm_rows); add 0: y is
// the first chain.
__device__ float torch_context(const float* p, const float* vb, unsigned ev, unsigned d, unsigned j0, unsigned kb,
                               float y, bool add) {
    const unsigned half = kb > TORCH_GEMM_K ? (kb + 1) / 2 : kb;
    for (int part = 0; part < (half < kb ? 2 : 1); part++) {
        const unsigned t0 = j0 + (part ? half : 0), t1 = j0 + (part ? kb : half);
        float acc = 0.0f;
        for (unsigned j = t0; j < t1; j++) acc = __fmaf_rn(p[j], vb[(unsigned long long)j * ev + d], acc);
        y = add || part ? __fadd_rn(y, acc) : acc;
    }
    return y;
}

// One block a query row (row r of batch b, blockIdx.x = b * l + r), its s scores in shared memory, as the
// CPU's qrt_attention (attention_body.h): t_j = fl(chain(q_r, k_j) * scale), or fma(chain, scale, mask_j) with
// a float mask, then -inf where a bool mask is 0 or, causal, j > r. Over blocks of 512 keys, torch's online
// softmax: m' = max(m, the block's max); p_j = exp(t_j - m') and their sum z in torch's AVX-512 order
// (exp_u20 on the whole vectors of 16, lane l (thread l) summing j = l mod 16 from +0, the lanes folded in
// halves, then the rest exp in double rounded to float, added one by one); c = glibc's expf(m - m'),
// Z = fma(c, Z, z), the context times c from the second block on, plus the block's (torch_context); a block
// whose m' is -inf takes p_j = 0 and leaves the rest. y[r][d] = fl(context * fl(1 / Z)), Z = 0 taken as 1. The
// mask's row r of its batch holds s values from r * mask_stride on (elements of 1 byte, bool, or 4, float).
// blockDim.x >= 16.
extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, const unsigned char* mask,
                                         int mask_kind, unsigned mask_stride, float scale, int causal, float* y,
                                         unsigned l, unsigned s, unsigned e, unsigned ev, QRT_SIZES(size),
                                         QRT_STRIDES(sq), QRT_STRIDES(sk), QRT_STRIDES(sv), QRT_STRIDES(sm)) {
    extern __shared__ float p[];  // the row's s scores, then its p_j
    __shared__ float run_max, run_sum, block_max, rescale, lanes[TORCH_LANES];
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
        if (mask_kind == MASK_FLOAT)
            t = __fmaf_rn(t, scale, ((const float*)mask)[mask_row + j]);
        else if (mask_kind == MASK_BOOL)  // torch's float mask of it, 0 / -inf: a masked NaN score stays NaN
            t = __fmaf_rn(t, scale, mask[mask_row + j] ? 0.0f : -INFINITY);
        else
            t = __fmul_rn(t, scale);
        if (causal && j > r) t = -INFINITY;
        p[j] = t;
    }
    float* yr = y + (unsigned long long)blockIdx.x * ev;
    if (threadIdx.x == 0) {
        run_max = -INFINITY;
        run_sum = 0.0f;
    }
    if (s == 0)  // no key: the context is the empty sum
        for (unsigned d = threadIdx.x; d < ev; d += blockDim.x) yr[d] = 0.0f;
    __syncthreads();
    for (unsigned n0 = 0; n0 < s; n0 += TORCH_KV_BLOCK) {
        const unsigned kb_len = s - n0 < TORCH_KV_BLOCK ? s - n0 : TORCH_KV_BLOCK;
        if (threadIdx.x < QRT_LANES) {
            // torch's max: the whole vectors' (NaN propagated), then the last kb_len % 16, without a mask by
            // std::max (NaN skipped), with one NaN propagated too
            const unsigned vectors = kb_len / TORCH_LANES * TORCH_LANES;
            const bool torch_tail = mask_kind == MASK_NONE;
            float bm = lane_reduce<RED_MAX>(HalfWarp(), p + n0, vectors, 1);
            if (threadIdx.x == 0) {
                float tail = -INFINITY;
                for (unsigned j = vectors; j < kb_len; j++)
                    tail = torch_tail ? (tail < p[n0 + j] ? p[n0 + j] : tail) : combine<RED_MAX>(tail, p[n0 + j]);
                bm = torch_tail ? (bm < tail ? tail : bm) : combine<RED_MAX>(bm, tail);
                block_max = run_max > bm ? run_max : bm;
            }
        }
        __syncthreads();
        const float m = block_max;
        const unsigned whole = kb_len / TORCH_LANES * TORCH_LANES;
        for (unsigned j = threadIdx.x; j < kb_len; j += blockDim.x)
            if (m == -INFINITY || j < whole) p[n0 + j] = m == -INFINITY ? 0.0f : qrt_exp_u20(__fsub_rn(p[n0 + j], m));
        __syncthreads();
        if (m != -INFINITY && threadIdx.x < TORCH_LANES) {
            float acc = 0.0f;
            for (unsigned j = threadIdx.x; j < whole; j += TORCH_LANES) acc = __fadd_rn(acc, p[n0 + j]);
            lanes[threadIdx.x] = acc;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            rescale = 1.0f;
            if (m != -INFINITY) {
                for (int half = TORCH_LANES / 2; half >= 1; half /= 2)
                    for (int i = 0; i < half; i++) lanes[i] = __fadd_rn(lanes[i], lanes[i + half]);
                float z = lanes[0];
                for (unsigned j = n0 + whole; j < n0 + kb_len; j++) {
                    p[j] = qrt_exp_rounded(__fsub_rn(p[j], m));
                    z = __fadd_rn(z, p[j]);
                }
                rescale = qrt_expf_glibc(__fsub_rn(run_max, m));
                run_sum = __fmaf_rn(rescale, run_sum, z);
                run_max = m;
            }
        }
        __syncthreads();
        const float c = rescale;
        for (unsigned d = threadIdx.x; d < ev; d += blockDim.x) {
            const float so_far = n0 > 0 ? __fmul_rn(yr[d], c) : 0.0f;
            yr[d] = torch_context(p, vb, ev, d, n0, kb_len, so_far, n0 > 0);
        }
        __syncthreads();
    }
    const float recip = __fdiv_rn(1.0f, run_sum == 0.0f ? 1.0f : run_sum);
    for (unsigned d = threadIdx.x; d < ev; d += blockDim.x) yr[d] = __fmul_rn(yr[d], recip);
}
