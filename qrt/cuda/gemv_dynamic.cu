// Batch 1..8 int8 products that stream the weights at the memory's bandwidth, with x in shared memory.
//
// gemv_dq_<MB>: the whole dynamic linear in one kernel. Every block takes the range of the whole float
//   input, chooses the parameters and quantizes x into its shared memory exactly as dq_small does (min
//   and max are exact and independent of order, so every block derives the same QParams and q_x), then
//   streams its share of the weight rows. No second kernel, no host round trip.
// gemv_q_<epi>_<MB>: the same product over an x quantized beforehand (q_x, QParams and row sums in
//   global memory, the arguments of gemm_s8.cu's gemv).
//
// Why these reach the bandwidth: a persistent grid, one 768-thread block per SM (a block's prologue then
// runs once per SM; 768 threads leave each up to 80 registers, what the 8 loads in flight need without
// spilling); column groups are dealt to the blocks in turn, so every SM streams an equal share; each lane
// keeps 8 independent 16-byte weight loads in flight (96 KB per SM with all 24 warps busy, several times
// bandwidth x latency); the x bytes come from shared memory, at MB >= 4 two columns per warp so that
// they cost half.
// The int32 accumulator and the epilogues are gemm_common.cuh's: the same bits as every other path.
#include "gemm_common.cuh"

enum { GV_THREADS = 768, GV_WARPS = GV_THREADS / 32, GV_LOADS = 8 };

// LPC lanes per output column (CPW = 32 / LPC columns per warp), each lane GV_LOADS loads of 16 bytes in
// flight. A warp-wide x load from shared memory costs one wavefront per 128 distinct bytes: LPC * 16 / 128
// per row. At MB >= 4 and 32 lanes per column that would be 4 * MB wavefronts per 512 weight bytes, near
// the shared memory's limit at full HBM speed; 16 lanes halve it (and each lane still reads 16 of a
// column's 256 contiguous bytes).
template <int MB> struct GvShape {
    static constexpr int LPC = MB >= 4 ? 16 : 32;
    static constexpr int CPW = 32 / LPC;
    static constexpr int STEP = LPC * 16;  // bytes of k that a column's lanes cover per load
};

// 16 weight bytes through the read-only path, not kept in L1: each is read once.
__device__ __forceinline__ int4 ld_stream(const s8* p) {
    int4 v;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// c + the sum of the 4 bytes of a.
__device__ __forceinline__ unsigned byte_sum(unsigned a, unsigned c) {
    unsigned d;
    asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x01010101u), "r"(c));
    return d;
}

// The warp's first column group, and the stride between its groups: group g goes to block g % gridDim.x,
// so that fewer groups than warps still spread over every block (SM).
__device__ __forceinline__ int first_group() { return blockIdx.x + gridDim.x * (threadIdx.x >> 5); }
__device__ __forceinline__ int group_stride() { return gridDim.x * GV_WARPS; }

// Ask L2 for the warp's first column group, one 128-byte line per lane and step, so that HBM already
// streams while the block quantizes x.
template <int MB>
__device__ __forceinline__ void prefetch_first_group(const s8* w, int n, int Kp) {
    using S = GvShape<MB>;
    const int lane = threadIdx.x & 31, j = first_group() * S::CPW + lane / S::LPC;
    if (j >= n) return;
    for (int kb = lane % S::LPC * 128; kb < Kp; kb += S::LPC * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (size_t)j * Kp + kb));
}

// Range of the m * k floats at x over the whole block (every thread gets it), as dq_small: scalars up to
// the first 16-byte boundary (x may be a row slice), float4 loads four at a time, scalars for the tail.
__device__ __forceinline__ void block_range(const float* x, unsigned count, float& mn, float& mx, int& nan) {
    mn = __int_as_float(0x7f800000);
    mx = __int_as_float(0xff800000);
    nan = 0;
    auto take = [&](float v) {
        nan |= v != v;
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    };
    const unsigned misalign = (unsigned)(reinterpret_cast<size_t>(x) & 15) / 4;
    const unsigned head = min(count, (4 - misalign) & 3), vecs = (count - head) / 4;
    const float4* xv = reinterpret_cast<const float4*>(x + head);
    if (threadIdx.x < head) take(x[threadIdx.x]);
#pragma unroll 4
    for (unsigned i = threadIdx.x; i < vecs; i += blockDim.x) {
        const float4 v = xv[i];
        take(v.x);
        take(v.y);
        take(v.z);
        take(v.w);
    }
    for (unsigned i = head + 4 * vecs + threadIdx.x; i < count; i += blockDim.x) take(x[i]);
    block_minmax(mn, mx, nan);
}

// xsum[r] = sum_k q_x[r, k] for the m rows of xs (row_sums_u8's integers): warp r sums row r.
__device__ __forceinline__ void row_sums_shared(const u8* xs, int m, int Kp, int* xsum) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < m) {
        unsigned s = 0;
        for (int kb = lane * 16; kb < Kp; kb += 32 * 16) {
            const int4 v = *reinterpret_cast<const int4*>(xs + warp * Kp + kb);
            s = byte_sum(v.x, byte_sum(v.y, byte_sum(v.z, byte_sum(v.w, s))));
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) xsum[warp] = (int)s;
    }
}

// Dynamic quantization of x[m, k] into xs[m, Kp] (dq_small's steps), and xsum when has_wzp.
__device__ __forceinline__ QParams quantize_to_shared(const float* x, int m, int k, int Kp, int qmax, int has_wzp,
                                                      u8* xs, int* xsum) {
    __shared__ QParams sp;
    float mn, mx;
    int nan;
    block_range(x, (unsigned)m * (unsigned)k, mn, mx, nan);
    if (threadIdx.x == 0) sp = choose_qparams(mn, mx, nan, qmax);
    __syncthreads();
    const QParams p = sp;
    quantize_rows(x, m, k, Kp, p, xs, threadIdx.x, blockDim.x);
    __syncthreads();
    if (has_wzp) {
        row_sums_shared(xs, m, Kp, xsum);
        __syncthreads();
    }
    return p;
}

// y[i, j] for i < m <= MB and the columns of this warp's groups: dot products over xs[m, Kp] (shared) and
// w[j, Kp], reduced over the column's lanes, then the epilogue (the column's lane r stores row r).
template <int MB, int EPI>
__device__ __forceinline__ void gemv_columns(const u8* xs, int m, int Kp, const s8* w, int n, void* y,
                                             const Epilogue& e, const QParams& xq) {
    using S = GvShape<MB>;
    const int lane = threadIdx.x & 31, slice = lane % S::LPC;
    const int groups = (n + S::CPW - 1) / S::CPW;  // w has rows up to a multiple of 128: no row guard
    for (int g = first_group(); g < groups; g += group_stride()) {
        const int j = g * S::CPW + lane / S::LPC;
        const s8* wj = w + (size_t)j * Kp;
        int dot[MB];
#pragma unroll
        for (int r = 0; r < MB; ++r) dot[r] = 0;
        for (int k0 = slice * 16; k0 < Kp; k0 += S::STEP * GV_LOADS) {
            int4 wv[GV_LOADS];  // every load of the batch is issued before the first is used
#pragma unroll
            for (int u = 0; u < GV_LOADS; ++u)
                if (k0 + u * S::STEP < Kp) wv[u] = ld_stream(wj + k0 + u * S::STEP);
#pragma unroll
            for (int u = 0; u < GV_LOADS; ++u) {
                const int kb = k0 + u * S::STEP;
                if (kb >= Kp) break;
#pragma unroll
                for (int r = 0; r < MB; ++r) {
                    if (r >= m) break;
                    const int4 xv = *reinterpret_cast<const int4*>(xs + r * Kp + kb);
                    dot[r] = dp4a_us((unsigned)xv.x, wv[u].x, dot[r]);
                    dot[r] = dp4a_us((unsigned)xv.y, wv[u].y, dot[r]);
                    dot[r] = dp4a_us((unsigned)xv.z, wv[u].z, dot[r]);
                    dot[r] = dp4a_us((unsigned)xv.w, wv[u].w, dot[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MB; ++r) {
            for (int o = S::LPC / 2; o > 0; o >>= 1) dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
            if (slice == r && r < m && j < n) store<EPI>(e, y, n, r, j, dot[r], xq);
        }
    }
}

// q_x [MB rows at most, Kp]: dynamic shared memory, MB * Kp bytes (the host opts in above 48 KB).
extern __shared__ __align__(16) u8 gv_xs[];

template <int MB>
__device__ __forceinline__ void gemv_dq(const float* x, int m, int Kp, const s8* w, int n, float* y, int qmax,
                                        Epilogue e) {
    __shared__ int xsum[MB];
    prefetch_first_group<MB>(w, n, Kp);
    const QParams xq = quantize_to_shared(x, m, e.k, Kp, qmax, e.has_wzp, gv_xs, xsum);
    e.xsum = xsum;  // e.xq is not read: xq is this block's own
    gemv_columns<MB, EPI_FLOAT>(gv_xs, m, Kp, w, n, y, e, xq);
}

template <int MB, int EPI>
__device__ __forceinline__ void gemv_q(const u8* x, int m, int Kp, const s8* w, int n, void* y, const Epilogue& e) {
    prefetch_first_group<MB>(w, n, Kp);
    const int4* src = reinterpret_cast<const int4*>(x);
#pragma unroll 4  // loads batched: 48 KB in flight, a q_x of 8 rows of 4096 in one L2 round trip
    for (int i = threadIdx.x; i < m * Kp / 16; i += blockDim.x) reinterpret_cast<int4*>(gv_xs)[i] = src[i];
    __syncthreads();
    gemv_columns<MB, EPI>(gv_xs, m, Kp, w, n, y, e, *e.xq);
}

#define QRT_GEMV_DQ(MB)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)                                          \
        gemv_dq_##MB(const float* x, int m, int Kp, const s8* w, int n, float* y, int qmax, QRT_EPI_PARAMS) { \
        gemv_dq<MB>(x, m, Kp, w, n, y, qmax, QRT_EPI_ARGS);                                              \
    }
#define QRT_GEMV_Q(NAME, MB, EPI)                                                                        \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 1)                                          \
        NAME(const u8* x, int m, int Kp, const s8* w, int n, void* y, QRT_EPI_PARAMS) {                  \
        gemv_q<MB, EPI>(x, m, Kp, w, n, y, QRT_EPI_ARGS);                                                \
    }

QRT_GEMV_DQ(1)
QRT_GEMV_DQ(2)
QRT_GEMV_DQ(4)
QRT_GEMV_DQ(8)
QRT_GEMV_Q(gemv_q_float_1, 1, EPI_FLOAT)
QRT_GEMV_Q(gemv_q_float_2, 2, EPI_FLOAT)
QRT_GEMV_Q(gemv_q_float_4, 4, EPI_FLOAT)
QRT_GEMV_Q(gemv_q_float_8, 8, EPI_FLOAT)
QRT_GEMV_Q(gemv_q_requant_1, 1, EPI_REQUANT)
QRT_GEMV_Q(gemv_q_requant_2, 2, EPI_REQUANT)
QRT_GEMV_Q(gemv_q_requant_4, 4, EPI_REQUANT)
QRT_GEMV_Q(gemv_q_requant_8, 8, EPI_REQUANT)
