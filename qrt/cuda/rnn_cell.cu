// The elementwise part of a dynamic recurrent step (RNN, LSTM, GRU) from
// gi = lin_ih(x) and gh = lin_hh(h), and the whole int8 Elman RNN step fused
// into one launch after dq_small has quantized x and h (dynamic_quant.cu).
// The gate arithmetic is gates.cuh's (the CPU's sigmoid and tanh, torch's
// order of roundings), as the CPU's gates.h: both backends give the same bits.
#include "gemm_common.cuh"
#include "gates.cuh"

// One thread per (batch row b, hidden unit j); gates are [batch, G * hidden]
// in torch's chunk order. h_out may be h and c_out may be c (a sequence
// updates its state in place): each element is read before it is written, by
// the same thread. If y_stride != 0, h' is also stored at y[b * y_stride + j]
// (a sequence's output, bidirectional halves interleaved). c, c_out: LSTM only.
template <int KIND>
__device__ __forceinline__ void gate_update(const float* gi, const float* gh, const float* h, const float* c,
                                            float* h_out, float* c_out, float* y, int y_stride, int batch,
                                            int hidden) {
    constexpr int G = GateCount<KIND>::value;
    const unsigned n = (unsigned)batch * (unsigned)hidden;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const unsigned b = e / (unsigned)hidden, j = e - b * (unsigned)hidden;
        float xi[G], xh[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            xi[g] = gi[((size_t)b * G + g) * hidden + j];
            xh[g] = gh[((size_t)b * G + g) * hidden + j];
        }
        float cv;  // h is read by GRU only, c by LSTM only
        const float hv =
            cell_update<KIND>(xi, xh, KIND == CELL_GRU ? h[e] : 0.0f, KIND == CELL_LSTM ? c[e] : 0.0f, cv);
        if (KIND == CELL_LSTM) c_out[e] = cv;
        h_out[e] = hv;
        if (y_stride) y[(size_t)b * y_stride + j] = hv;
    }
}

#define QRT_GATE_ENTRY(NAME, KIND)                                                                        \
    extern "C" __global__ void gate_update_##NAME(const float* gi, const float* gh, const float* h,       \
                                                  const float* c, float* h_out, float* c_out, float* y,   \
                                                  int y_stride, int batch, int hidden) {                  \
        gate_update<KIND>(gi, gh, h, c, h_out, c_out, y, y_stride, batch, hidden);                        \
    }
QRT_GATE_ENTRY(rnn_tanh, ACT_TANH)
QRT_GATE_ENTRY(rnn_relu, ACT_RELU)
QRT_GATE_ENTRY(lstm, CELL_LSTM)
QRT_GATE_ENTRY(gru, CELL_GRU)

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
