// The elementwise part of a dynamic RNN step, h' = act(lin_hh(h) + lin_ih(x))
// with v = fl(gh + gi) as the CPU adds it, and the whole int8 step fused into
// one launch after dq_small has quantized x and h (dynamic_quant.cu).
// tanhf differs from the CPU's in the last bit (NUMERICS.md: <= 3e-7 per step).
#include "gemm_common.cuh"

enum { ACT_TANH = 0, ACT_RELU = 1 };

template <int ACT>
__device__ __forceinline__ float activate(float v) {
    if (ACT == ACT_TANH) return tanhf(v);
    return (v > 0.0f || v != v) ? v : 0.0f;  // NaN passes through: the GPU cannot raise on it
}

template <int ACT>
__device__ __forceinline__ void rnn_act(const float* gh, const float* gi, float* out, unsigned n) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = activate<ACT>(__fadd_rn(gh[i], gi[i]));
}

// One warp per hidden unit j and MB batch rows: both int8 dot products, both
// dynamic epilogues, the add and the activation.
template <int MB, int ACT>
__device__ __forceinline__ void rnn_step(const u8* qx, int kxp, const s8* w_ih, const Epilogue& e_ih,
                                         const u8* qh, int khp, const s8* w_hh, const Epilogue& e_hh,
                                         int batch, int hidden, float* out) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= hidden) return;
    const QParams px = *e_ih.xq, ph = *e_hh.xq;
    for (int i0 = blockIdx.y * MB; i0 < batch; i0 += gridDim.y * MB) {
        int di[MB], dh[MB];
        warp_dot<MB>(qx, batch, i0, kxp, w_ih + (size_t)j * kxp, di);
        warp_dot<MB>(qh, batch, i0, khp, w_hh + (size_t)j * khp, dh);
#pragma unroll
        for (int r = 0; r < MB; ++r) {
            if (lane == r && i0 + r < batch) {
                const int i = i0 + r;
                const float gi = epilogue_float(e_ih, exact_acc(e_ih, di[r], i, j, px.zp), j, px.scale);
                const float gh = epilogue_float(e_hh, exact_acc(e_hh, dh[r], i, j, ph.zp), j, ph.scale);
                out[(size_t)i * hidden + j] = activate<ACT>(__fadd_rn(gh, gi));
            }
        }
    }
}

#define QRT_LAYER_PARAMS(P)                                                                              \
    const u8 *P##q, int P##kp, const s8 *P##w, int P##k, const int *P##wsum, const int *P##wzp,         \
        const int *P##xsum, int P##has_wzp, const QParams *P##xq, const float *P##s_w, const float *P##bias, \
        int P##has_bias
#define QRT_LAYER_EPI(P)                                                                                 \
    Epilogue{P##k, P##wsum, P##wzp, P##xsum, P##has_wzp, P##xq, P##s_w, P##bias, P##has_bias, 0, 0, 0.0f, 0, 0}

#define QRT_RNN_ENTRIES(ACT_NAME, ACT)                                                                   \
    extern "C" __global__ void rnn_act_##ACT_NAME(const float* gh, const float* gi, float* out, unsigned n) { \
        rnn_act<ACT>(gh, gi, out, n);                                                                    \
    }                                                                                                    \
    QRT_RNN_STEP(ACT_NAME, ACT, 1)                                                                       \
    QRT_RNN_STEP(ACT_NAME, ACT, 2)                                                                       \
    QRT_RNN_STEP(ACT_NAME, ACT, 4)                                                                       \
    QRT_RNN_STEP(ACT_NAME, ACT, 8)
#define QRT_RNN_STEP(ACT_NAME, ACT, MB)                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                                    \
        rnn_step_##ACT_NAME##_##MB(QRT_LAYER_PARAMS(ih_), QRT_LAYER_PARAMS(hh_), int batch, int hidden,   \
                                   float* out) {                                                         \
        rnn_step<MB, ACT>(ih_q, ih_kp, ih_w, QRT_LAYER_EPI(ih_), hh_q, hh_kp, hh_w, QRT_LAYER_EPI(hh_),   \
                          batch, hidden, out);                                                           \
    }

QRT_RNN_ENTRIES(tanh, ACT_TANH)
QRT_RNN_ENTRIES(relu, ACT_RELU)
