// A whole dynamic recurrent sequence (RNN, LSTM, GRU; int8 W_hh without zero points) as one kernel
// per direction: a persistent grid whose blocks keep their slice of W_hh in shared memory for every
// step, with one grid-wide barrier per step (Diamos et al., "Persistent RNNs", 2016).
//
// Block g owns the hidden units j in [g * U, g * U + U) and holds the W_hh rows of all their gates
// (row q * H + j for gate q, torch's chunk order). Step s (time t = s, or T - 1 - s in reverse):
//  1. wait until every block has written h_t (the barrier of step s - 1);
//  2. read the whole state h_t [B, H] (h at step 0, then y[t_prev]) into shared memory, take its
//     min and max and quantize it exactly as dq_small does: min and max are exact whatever the
//     order, so every block derives the same QParams and the same q_h as the launch loop;
//  3. the int32 dot products of the block's gate rows with q_h (dp4a) and gemm_common.cuh's
//     EPI_FLOAT epilogue, as the GEMV computes them;
//  4. cell_update (gates.cuh) per (batch row, unit) with the input gates gi_all[t] (fetched while
//     the block waited), c kept in shared memory (only its block uses it); h' goes to y[t];
//  5. arrive at the barrier, then fetch the next step's gi.
// The same functions on the same values in the same order: the launch loop's bits, the CPU's bits.
// A grid of one block (small layers) keeps h_t in shared memory and needs no barrier.
//
// RNN's input projection quantizes each step's x on its own (torch's RNN, unlike LSTM and GRU,
// is a loop of cells): rnn_input_proj computes it for all steps at once, before the sequence.
#include "gemm_common.cuh"
#include "gates.cuh"

enum { PERSIST_THREADS = 512, PROJ_ROWS = 64 };
// A barrier wait longer than this means the blocks were not all resident: give up, report.
#define BARRIER_TIMEOUT_NS 5000000000ull

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

// The grid-wide barrier, for a grid whose blocks are all resident (the launcher puts at most one
// block per SM and checks that one fits). sync[0] counts arrivals and only grows (zeroed before the
// launch: a memset node in a CUDA graph); the barrier of step s is passed at (s + 1) * gridDim.x.
// CUTLASS's GenericBarrier, split in two so that a block does independent work while the others
// arrive: bar.sync, then thread 0's release add (cumulative: it publishes the writes the whole block
// made before the bar.sync); thread 0's acquire loads, then bar.sync (the block's later reads see
// what the other blocks published). sync[1] != 0 ends every wait: 1 is set by a wait that timed out
// (blocks not all resident), 2 by a launch with too little shared memory; the launcher reports
// either, where a plain spin would hang.
__device__ __forceinline__ void grid_arrive(unsigned* sync) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync) : "memory");
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void grid_wait(unsigned* sync, unsigned target) {
    if (threadIdx.x == 0) {
        const unsigned long long start = global_ns();
        while (ld_acquire(sync) < target && ld_acquire(sync + 1) == 0)
            if (global_ns() - start > BARRIER_TIMEOUT_NS) atomicExch(sync + 1, 1u);
    }
    __syncthreads();
}

// store(r, b, sum_k w[r, k] q[b, k]) for r < rows, b < batch: each thread a tile of RB weight rows
// by BB batch rows over every KS-th 16-byte chunk of k, summed over the KS lanes of the tile
// (integer sums: any order is exact). w holds rows rounded up to RB and q batch rounded up to BB
// (zero padding, so the loop has no bounds checks); rows are Kp bytes, Kp % 16 == 0, 16-byte
// aligned. The KS lanes of a tile read consecutive chunks of one row: no bank conflicts.
template <int RB, int BB, int KS, typename Store>
__device__ __forceinline__ void tile_dots(const s8* w, int rows, const u8* q, int batch, int Kp, Store store) {
    static_assert(32 % KS == 0, "a tile's lanes lie within a warp");
    constexpr int TPW = 32 / KS;  // tiles per warp
    const int lane = threadIdx.x & 31, ks = lane % KS, chunks = Kp >> 4;
    const int bt = (batch + BB - 1) / BB, tiles = (rows + RB - 1) / RB * bt;
    const int nwarps = blockDim.x >> 5;
    // whole warps go round the loop together (the shuffles need every lane)
    for (int t0 = (threadIdx.x >> 5) * TPW; t0 < tiles; t0 += nwarps * TPW) {
        const int tile = t0 + lane / KS;
        const bool valid = tile < tiles;
        const int r0 = valid ? tile / bt * RB : 0, b0 = valid ? tile % bt * BB : 0;
        int acc[RB][BB];
#pragma unroll
        for (int i = 0; i < RB; ++i)
#pragma unroll
            for (int j = 0; j < BB; ++j) acc[i][j] = 0;
        for (int c = ks; c < chunks; c += KS) {
            int4 wv[RB];
#pragma unroll
            for (int i = 0; i < RB; ++i)
                wv[i] = *reinterpret_cast<const int4*>(w + (size_t)(r0 + i) * Kp + c * 16);
#pragma unroll
            for (int j = 0; j < BB; ++j) {
                const int4 xv = *reinterpret_cast<const int4*>(q + (size_t)(b0 + j) * Kp + c * 16);
#pragma unroll
                for (int i = 0; i < RB; ++i) {
                    acc[i][j] = dp4a_us((unsigned)xv.x, wv[i].x, acc[i][j]);
                    acc[i][j] = dp4a_us((unsigned)xv.y, wv[i].y, acc[i][j]);
                    acc[i][j] = dp4a_us((unsigned)xv.z, wv[i].z, acc[i][j]);
                    acc[i][j] = dp4a_us((unsigned)xv.w, wv[i].w, acc[i][j]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RB; ++i)
#pragma unroll
            for (int j = 0; j < BB; ++j) {
#pragma unroll
                for (int o = KS / 2; o > 0; o >>= 1) acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], o);
                // the tile's lanes share its stores
                if (valid && (i * BB + j) % KS == ks && r0 + i < rows && b0 + j < batch)
                    store(r0 + i, b0 + j, acc[i][j]);
            }
    }
}

// QParams of the n values load(0), ..., load(n - 1) for the whole block, as dq_small computes them:
// the block's min, max and NaN flag, then ChooseQuantizationParams. INFLIGHT loads per thread are
// issued before any is used: the values come from L2, and one at a time the latency would dominate.
template <typename Load>
__device__ __forceinline__ QParams block_qparams(unsigned n, int qmax, Load load) {
    constexpr int INFLIGHT = 8;
    __shared__ QParams sp;
    float mn = __int_as_float(0x7f800000), mx = __int_as_float(0xff800000);
    int nan = 0;
    for (unsigned e0 = threadIdx.x; e0 < n; e0 += INFLIGHT * blockDim.x) {
        float v[INFLIGHT];
#pragma unroll
        for (int u = 0; u < INFLIGHT; ++u)
            if (e0 + u * blockDim.x < n) v[u] = load(e0 + u * blockDim.x);
#pragma unroll
        for (int u = 0; u < INFLIGHT; ++u)
            if (e0 + u * blockDim.x < n) {
                nan |= v[u] != v[u];
                mn = fminf(mn, v[u]);
                mx = fmaxf(mx, v[u]);
            }
    }
    block_minmax(mn, mx, nan);  // ends with __syncthreads: sp's readers of the last call are done
    if (threadIdx.x == 0) sp = choose_qparams(mn, mx, nan, qmax);
    __syncthreads();
    return sp;
}

// Offset of element e of a dense [rows, cols] array in one of row stride ld; ld == cols, the
// common case, takes no division.
__device__ __forceinline__ unsigned strided(unsigned e, unsigned cols, unsigned ld) {
    if (ld == cols) return e;
    const unsigned row = e / cols;
    return row * ld + (e - row * cols);
}

__device__ __forceinline__ unsigned align16(unsigned n) { return (n + 15u) & ~15u; }

// The persistent kernel's shared memory (bytes), the same sum as recurrent.py's _persistent_smem.
struct PersistLayout {
    unsigned q, h, gh, gi, c, total;
    __device__ PersistLayout(int gates, int units, int batch, int hidden, int Kp, int RB, int BB) {
        const unsigned rows = (unsigned)gates * units, cells = (unsigned)batch * units;
        q = (rows + RB - 1) / RB * RB * Kp;  // W_hh slice first, at 0
        h = q + (unsigned)(batch + BB - 1) / BB * BB * Kp;
        gh = h + align16(4u * batch * hidden);
        gi = gh + align16(4u * rows * batch);
        c = gi + align16(4u * rows * batch);
        total = c + align16(4u * cells);
    }
};

// h, c [B, H]: the initial state, then the final one (c: LSTM only). y: the output at time 0 of this
// direction (row stride y_stride per batch row, B * y_stride per step). Needs steps >= 2: h is read at
// step 0 and written at the last step, by every block. gi_all [steps * B, G * H]; units: U.
template <int KIND, int RB, int BB, int KS>
__device__ __forceinline__ void rnn_persistent(const float* gi_all, const s8* w_hh, int Kp, int hidden,
                                               const int* wsum, const float* s_w, const float* bias, int has_bias,
                                               int qmax, float* h, float* c, float* y, int y_stride, int steps,
                                               int batch, int units, int reverse, unsigned* sync) {
    constexpr int G = GateCount<KIND>::value;
    const int H = hidden, B = batch, U = units, R = G * U, j0 = blockIdx.x * U;
    const Epilogue e{H, wsum, nullptr, nullptr, 0, nullptr, s_w, bias, has_bias, nullptr, nullptr, 0.0f, 0, 0};
    extern __shared__ __align__(16) unsigned char smem[];
    const PersistLayout L(G, U, B, H, Kp, RB, BB);
    if (L.total > dynamic_smem_size()) {  // every block sees it: none waits at a barrier
        if (threadIdx.x == 0) sync[1] = 2;
        return;
    }
    s8* w_s = reinterpret_cast<s8*>(smem);
    u8* q_s = smem + L.q;
    float* h_s = reinterpret_cast<float*>(smem + L.h);
    float* gh_s = reinterpret_cast<float*>(smem + L.gh);  // [R, B]
    float* gi_s = reinterpret_cast<float*>(smem + L.gi);  // [B, R]
    float* c_s = reinterpret_cast<float*>(smem + L.c);    // [B, U]

    // W_hh rows of the block's units; rows of units past H (last block) and the padding are zeros
    const int vecs = Kp >> 4, rows_p = (R + RB - 1) / RB * RB;
    for (int i = threadIdx.x; i < rows_p * vecs; i += blockDim.x) {
        const int r = i / vecs, g = r / U, j = j0 + r - g * U;
        int4 v = make_int4(0, 0, 0, 0);
        if (r < R && j < H)
            v = *reinterpret_cast<const int4*>(w_hh + ((size_t)g * H + j) * Kp + (i - r * vecs) * 16);
        reinterpret_cast<int4*>(w_s)[i] = v;
    }
    // q_h's padding (columns past H, rows past B) stays zero: the steps write only the values
    for (int i = threadIdx.x; i < (B + BB - 1) / BB * BB * Kp; i += blockDim.x) q_s[i] = 0;
    if (KIND == CELL_LSTM)
        for (int i = threadIdx.x; i < B * U; i += blockDim.x) {
            const int b = i / U, j = j0 + i - b * U;
            c_s[i] = j < H ? c[(size_t)b * H + j] : 0.0f;
        }
    auto fetch_gi = [&](int t) {
        for (int i = threadIdx.x; i < B * R; i += blockDim.x) {
            const int b = i / R, r = i - b * R, g = r / U, j = j0 + r - g * U;
            gi_s[i] = j < H ? gi_all[((size_t)t * B + b) * G * H + (size_t)g * H + j] : 0.0f;
        }
    };
    fetch_gi(reverse ? steps - 1 : 0);

    const bool alone = gridDim.x == 1;  // one block: h_t stays in h_s, no barrier
    for (int s = 0; s < steps; ++s) {
        const int t = reverse ? steps - 1 - s : s;
        if (s && !alone) grid_wait(sync, (unsigned)s * gridDim.x);
        const float* h_t = s ? y + (size_t)(reverse ? t + 1 : t - 1) * B * y_stride : h;
        const unsigned ld = s ? y_stride : H;
        const QParams p = s && alone ? block_qparams(B * H, qmax, [&](unsigned i) { return h_s[i]; })
                                     : block_qparams(B * H, qmax, [&](unsigned i) {
                                           // through L2, not L1: other blocks wrote h_t in this launch
                                           return h_s[i] = __ldcg(h_t + strided(i, H, ld));
                                       });
        // quantize_rows' rule Q1, over the values only (the padding is zero)
        const float zpf = (float)p.zp;
        for (unsigned i = threadIdx.x; i < (unsigned)B * H; i += blockDim.x)
            q_s[strided(i, H, Kp)] = (u8)round_clamp(__fmaf_rn(h_s[i], p.inv, zpf), 0, 255);
        __syncthreads();
        tile_dots<RB, BB, KS>(w_s, R, q_s, B, Kp, [&](int r, int b, int dot) {
            const int g = r / U, j = j0 + r - g * U, n = g * H + j;
            if (j < H) gh_s[r * B + b] = epilogue_float(e, exact_acc(e, dot, b, n, p.zp), n, p.scale);
        });
        __syncthreads();
        float* y_t = y + (size_t)t * B * y_stride;
        const bool last = s == steps - 1;
        for (int i = threadIdx.x; i < B * U; i += blockDim.x) {
            const int b = i / U, u = i - b * U, j = j0 + u;
            if (j >= H) continue;
            float xi[G], xh[G];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                xi[g] = gi_s[b * R + g * U + u];
                xh[g] = gh_s[(g * U + u) * B + b];
            }
            float cv;
            const float hv = cell_update<KIND>(xi, xh, h_s[b * H + j], KIND == CELL_LSTM ? c_s[i] : 0.0f, cv);
            if (KIND == CELL_LSTM) c_s[i] = cv;
            y_t[(size_t)b * y_stride + j] = hv;
            if (alone) h_s[b * H + j] = hv;  // h_s[b * H + j] is read by this thread only
            if (last) h[(size_t)b * H + j] = hv;  // every block read h at step 0, before barrier 0
        }
        if (!last) {
            if (alone) __syncthreads();
            else grid_arrive(sync);
            fetch_gi(reverse ? t - 1 : t + 1);  // gi_s's and h_s's readers passed the bar.sync
        }
    }
    if (KIND == CELL_LSTM)
        for (int i = threadIdx.x; i < B * U; i += blockDim.x) {
            const int b = i / U, j = j0 + i - b * U;
            if (j < H) c[(size_t)b * H + j] = c_s[i];
        }
}

// gi[t * B + b, j] for j in this block's PROJ_ROWS weight rows (blockIdx.x) at step t = blockIdx.y:
// the dynamic linear of x_t [B, k] alone, as quantize_dynamic (dq_small) and the GEMV compute it.
// w: [Np, Kp] with Np a multiple of PROJ_ROWS (Int8Weights pads to 128): whole row groups exist.
template <int RB, int BB, int KS>
__device__ __forceinline__ void rnn_input_proj(const float* x, int batch, int k, int Kp, const s8* w, int n,
                                               const int* wsum, const float* s_w, const float* bias,
                                               int has_bias, int qmax, float* gi) {
    const int t = blockIdx.y, r0 = blockIdx.x * PROJ_ROWS;
    const Epilogue e{k, wsum, nullptr, nullptr, 0, nullptr, s_w, bias, has_bias, nullptr, nullptr, 0.0f, 0, 0};
    extern __shared__ __align__(16) unsigned char smem[];
    u8* q_s = smem;  // [B rounded up to BB, Kp]
    const float* x_t = x + (size_t)t * batch * k;
    const QParams p = block_qparams(batch * k, qmax, [&](unsigned i) { return x_t[i]; });
    quantize_rows(x_t, batch, k, Kp, p, q_s, threadIdx.x, blockDim.x);
    for (int i = batch * Kp + threadIdx.x; i < (batch + BB - 1) / BB * BB * Kp; i += blockDim.x) q_s[i] = 0;
    __syncthreads();
    tile_dots<RB, BB, KS>(w + (size_t)r0 * Kp, PROJ_ROWS, q_s, batch, Kp, [&](int r, int b, int dot) {
        const int j = r0 + r;
        if (j < n)
            gi[((size_t)t * batch + b) * n + j] = epilogue_float(e, exact_acc(e, dot, b, j, p.zp), j, p.scale);
    });
}

// Tiles by batch: MB 1 (RB 2, KS 16), 2 (2 x 2, KS 8), 4 for 3 and more rows (4 x 4, KS 8).
#define QRT_PERSIST_ENTRY(NAME, KIND, MB, RB, BB, KS)                                                        \
    extern "C" __global__ void __launch_bounds__(PERSIST_THREADS, 1) rnn_persistent_##NAME##_##MB(          \
        const float* gi_all, const s8* w_hh, int Kp, int hidden, const int* wsum, const float* s_w,          \
        const float* bias, int has_bias, int qmax, float* h, float* c, float* y, int y_stride, int steps,    \
        int batch, int units, int reverse, unsigned* sync) {                                                 \
        rnn_persistent<KIND, RB, BB, KS>(gi_all, w_hh, Kp, hidden, wsum, s_w, bias, has_bias, qmax, h, c, y, \
                                         y_stride, steps, batch, units, reverse, sync);                      \
    }
#define QRT_PROJ_ENTRY(MB, RB, BB, KS)                                                                      \
    extern "C" __global__ void __launch_bounds__(PERSIST_THREADS) rnn_input_proj_##MB(                      \
        const float* x, int batch, int k, int Kp, const s8* w, int n, const int* wsum, const float* s_w,    \
        const float* bias, int has_bias, int qmax, float* gi) {                                             \
        rnn_input_proj<RB, BB, KS>(x, batch, k, Kp, w, n, wsum, s_w, bias, has_bias, qmax, gi);             \
    }
#define QRT_PERSIST_TILES(NAME, KIND)          \
    QRT_PERSIST_ENTRY(NAME, KIND, 1, 2, 1, 16) \
    QRT_PERSIST_ENTRY(NAME, KIND, 2, 2, 2, 8)  \
    QRT_PERSIST_ENTRY(NAME, KIND, 4, 4, 4, 8)
QRT_PERSIST_TILES(rnn_tanh, ACT_TANH)
QRT_PERSIST_TILES(rnn_relu, ACT_RELU)
QRT_PERSIST_TILES(lstm, CELL_LSTM)
QRT_PERSIST_TILES(gru, CELL_GRU)
QRT_PROJ_ENTRY(1, 2, 1, 16)
QRT_PROJ_ENTRY(2, 2, 2, 8)
QRT_PROJ_ENTRY(4, 4, 4, 8)
