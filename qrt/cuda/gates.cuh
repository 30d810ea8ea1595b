// The gate arithmetic of one dynamic recurrent unit (RNN, LSTM, GRU) from its gate pre-activations:
// shared by rnn_cell.cu (gate_update, the fused Elman step) and rnn_persistent.cu, so that every
// path gives the same bits. Every product and sum rounds on its own, in torch's order, and sigmoid
// and tanh are the CPU's own (qrt/kernels/gate_math.h, compiled here as device code).
#pragma once
#include "../kernels/gate_math.h"

// The RNN kinds double as the activation of the fused Elman step.
enum { ACT_TANH = 0, ACT_RELU = 1, CELL_LSTM = 2, CELL_GRU = 3 };

template <int KIND> struct GateCount { static constexpr int value = 1; };
template <> struct GateCount<CELL_LSTM> { static constexpr int value = 4; };
template <> struct GateCount<CELL_GRU> { static constexpr int value = 3; };

template <int ACT>
__device__ __forceinline__ float activate(float v) {
    if (ACT == ACT_TANH) return qrt_tanh(v);
    return qrt_relu(v);  // NaN passes through: the GPU cannot raise on it
}

// h' of one unit from its gates xi = lin_ih(x), xh = lin_hh(h) (torch's chunk order), its state h
// and (LSTM) c; c_new receives c' (LSTM only).
template <int KIND>
__device__ __forceinline__ float cell_update(const float (&xi)[GateCount<KIND>::value],
                                             const float (&xh)[GateCount<KIND>::value], float h, float c,
                                             float& c_new) {
    if constexpr (KIND == CELL_LSTM) {  // chunks i, f, g, o
        const float ig = qrt_sigmoid(__fadd_rn(xh[0], xi[0]));
        const float fg = qrt_sigmoid(__fadd_rn(xh[1], xi[1]));
        const float cg = qrt_tanh(__fadd_rn(xh[2], xi[2]));
        const float og = qrt_sigmoid(__fadd_rn(xh[3], xi[3]));
        c_new = __fadd_rn(__fmul_rn(fg, c), __fmul_rn(ig, cg));
        return __fmul_rn(og, qrt_tanh(c_new));
    } else if constexpr (KIND == CELL_GRU) {  // chunks r, z, n; the hidden bias of n is inside xh, scaled by r
        const float r = qrt_sigmoid(__fadd_rn(xh[0], xi[0]));
        const float z = qrt_sigmoid(__fadd_rn(xh[1], xi[1]));
        const float nv = qrt_tanh(__fadd_rn(xi[2], __fmul_rn(xh[2], r)));
        return __fadd_rn(__fmul_rn(__fsub_rn(h, nv), z), nv);
    } else {
        return activate<KIND>(__fadd_rn(xh[0], xi[0]));
    }
}
