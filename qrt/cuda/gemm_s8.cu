// u8 x s8 -> int32 GEMM / GEMV with fused epilogues (qrt/_kernels.pyx gemm_u8s8
// plus the dynamic and static epilogues). y[i, j] from x[m, Kp] (quint8, rows
// zero-padded to Kp, a multiple of 64) and w[Np, Kp] (qint8, zero-padded to
// Np, a multiple of 128 rows). The int32 accumulator is the exact product
// modulo 2**32, so every kernel here gives the same integers as the CPU.
//
// gemv_<epi>_<MB>: one warp per output column and MB input rows, dp4a;
//   memory-bound on the weights (batch 1..8).
// gemm_<epi>: tensor-core integer MMA (mma.sync m16n8k32 u8 x s8, sm_80+),
//   128 x 128 block tiles, 64-byte k steps in a STAGES-deep cp.async pipeline.
#include "gemm_common.cuh"

template <int MB, int EPI>
__device__ __forceinline__ void gemv(const u8* x, int m, int Kp, const s8* w, int n, void* y, const Epilogue& e) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= n) return;  // whole warps only; no block-wide sync below
    const QParams xq = *e.xq;
    for (int i0 = blockIdx.y * MB; i0 < m; i0 += gridDim.y * MB) {
        int dot[MB];
        warp_dot<MB>(x, m, i0, Kp, w + (size_t)j * Kp, dot);
#pragma unroll
        for (int r = 0; r < MB; ++r)
            if (lane == r && i0 + r < m) store<EPI>(e, y, n, i0 + r, j, dot[r], xq);
    }
}

// ---------------------------------------------------------------- tensor-core GEMM

enum { BM = 128, BN = 128, BK = 64, LDS = BK + 16 };  // LDS: padded smem row (80 B) avoids bank conflicts

// k tiles in flight: with one 8-warp block per SM (a 512-row product is 128 blocks), a tile's copy
// takes longer than its 32 MMAs per warp; with two stages the loop waited on every copy.
// STAGES * 20 KB of dynamic shared memory (the host opts in above 48 KB).
enum { STAGES = 4 };
struct GemmStage {
    u8 a[BM][LDS];
    s8 b[BN][LDS];
};
extern __shared__ __align__(16) unsigned char gemm_smem[];

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte global -> shared copy; src_bytes 0 fills zeros (rows past m).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

// Copy the k-tile at k0 of x rows [bm, bm + BM) and w rows [bn, bn + BN) into stage buffers.
__device__ __forceinline__ void load_tile(u8 (*As)[LDS], s8 (*Bs)[LDS], const u8* x, int m, const s8* w, int Kp,
                                          int bm, int bn, int k0) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
        const int c = threadIdx.x + 256 * s;  // 512 chunks of 16 bytes per operand
        const int row = c >> 2, col = (c & 3) * 16;
        const int gr = bm + row;
        cp_async16(&As[row][col], x + (size_t)(gr < m ? gr : 0) * Kp + k0 + col, gr < m ? 16 : 0);
        cp_async16(&Bs[row][col], w + (size_t)(bn + row) * Kp + k0 + col, 16);
    }
    asm volatile("cp.async.commit_group;");
}

template <int EPI>
__device__ __forceinline__ void gemm_mma(const u8* x, int m, int Kp, const s8* w, int n, void* y, const Epilogue& e) {
#if __CUDA_ARCH__ >= 800
    GemmStage* stage = reinterpret_cast<GemmStage*>(gemm_smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;           // PTX fragment layout: groupID, thread in group
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;  // 2 x 4 warps, 64 x 32 each
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    int acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0;

    // One commit group per k tile (empty past the last), so that "all but STAGES - 2 groups done" always
    // means "tile kt has landed".
    const int ktiles = Kp / BK;
#pragma unroll
    for (int kt = 0; kt < STAGES - 1; ++kt) {
        if (kt < ktiles) load_tile(stage[kt].a, stage[kt].b, x, m, w, Kp, bm, bn, kt * BK);
        else asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();  // tile kt visible to all, and every warp is done with tile kt - 1, refilled next
        const int next = kt + STAGES - 1;
        if (next < ktiles) load_tile(stage[next % STAGES].a, stage[next % STAGES].b, x, m, w, Kp, bm, bn, next * BK);
        else asm volatile("cp.async.commit_group;");
        const GemmStage& cur = stage[kt % STAGES];
#pragma unroll
        for (int kb = 0; kb < BK; kb += 32) {
            unsigned af[4][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                const int r = wm + mt * 16 + g;
                af[mt][0] = *reinterpret_cast<const unsigned*>(&cur.a[r][kb + t * 4]);
                af[mt][1] = *reinterpret_cast<const unsigned*>(&cur.a[r + 8][kb + t * 4]);
                af[mt][2] = *reinterpret_cast<const unsigned*>(&cur.a[r][kb + 16 + t * 4]);
                af[mt][3] = *reinterpret_cast<const unsigned*>(&cur.a[r + 8][kb + 16 + t * 4]);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int c = wn + nt * 8 + g;
                bf[nt][0] = *reinterpret_cast<const unsigned*>(&cur.b[c][kb + t * 4]);
                bf[nt][1] = *reinterpret_cast<const unsigned*>(&cur.b[c][kb + 16 + t * 4]);
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                    asm volatile(
                        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
                        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+r"(acc[mt][nt][0]), "+r"(acc[mt][nt][1]), "+r"(acc[mt][nt][2]), "+r"(acc[mt][nt][3])
                        : "r"(af[mt][0]), "r"(af[mt][1]), "r"(af[mt][2]), "r"(af[mt][3]), "r"(bf[nt][0]),
                          "r"(bf[nt][1]));
        }
    }
    const QParams xq = *e.xq;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) {  // D fragment: rows g, g + 8; columns 2t, 2t + 1
                const int i = bm + wm + mt * 16 + g + (c >> 1) * 8;
                const int j = bn + wn + nt * 8 + t * 2 + (c & 1);
                if (i < m && j < n) store<EPI>(e, y, n, i, j, acc[mt][nt][c], xq);
            }
#else
    __trap();  // the host picks gemv on devices without integer mma.sync
#endif
}

#define QRT_GEMV(NAME, MB, EPI)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                    \
        NAME(const u8* x, int m, int Kp, const s8* w, int n, void* y, QRT_EPI_PARAMS) {                  \
        gemv<MB, EPI>(x, m, Kp, w, n, y, QRT_EPI_ARGS);                                                  \
    }
#define QRT_GEMM(NAME, EPI)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                    \
        NAME(const u8* x, int m, int Kp, const s8* w, int n, void* y, QRT_EPI_PARAMS) {                  \
        gemm_mma<EPI>(x, m, Kp, w, n, y, QRT_EPI_ARGS);                                                  \
    }

QRT_GEMV(gemv_float_1, 1, EPI_FLOAT)
QRT_GEMV(gemv_float_2, 2, EPI_FLOAT)
QRT_GEMV(gemv_float_4, 4, EPI_FLOAT)
QRT_GEMV(gemv_float_8, 8, EPI_FLOAT)
QRT_GEMV(gemv_requant_1, 1, EPI_REQUANT)
QRT_GEMV(gemv_requant_2, 2, EPI_REQUANT)
QRT_GEMV(gemv_requant_4, 4, EPI_REQUANT)
QRT_GEMV(gemv_requant_8, 8, EPI_REQUANT)
QRT_GEMM(gemm_float, EPI_FLOAT)
QRT_GEMM(gemm_requant, EPI_REQUANT)
