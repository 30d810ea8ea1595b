// Device helpers shared by qrt's CUDA kernels (see ../../docs/NUMERICS.md).
//
// Every float step names its rounding: __fmaf_rn where PyTorch's x86 engine
// fuses, __fmul_rn / __fadd_rn / __frcp_rn / __fdiv_rn where it does not, so
// results do not depend on nvcc's contraction (sources are also built with
// --fmad=false). No standard headers: NVRTC compiles these without them.
#pragma once

typedef unsigned char u8;
typedef signed char s8;

// Quantization parameters of an activation tensor, written on the device by
// the dynamic quantization kernels (or uploaded once for static ops).
struct QParams {
    float scale;  // s_x
    float inv;    // fl(1 / s_x)
    int zp;       // zero point
    int nan;      // 1 if the input held a NaN (scale and inv are then NaN)
};

// rne(v) clamped to [qmin, qmax], compared in double as the CPU kernel does
// (exact for the int32 range too); NaN maps to qmin.
__device__ __forceinline__ long long round_clamp(float v, long long qmin, long long qmax) {
    float r = rintf(v);
    if (r != r) return qmin;
    if ((double)r < (double)qmin) return qmin;
    if ((double)r > (double)qmax) return qmax;
    return (long long)r;
}

template <typename T> struct QRange;
template <> struct QRange<u8> { static constexpr long long lo = 0, hi = 255; };
template <> struct QRange<s8> { static constexpr long long lo = -128, hi = 127; };
template <> struct QRange<int> { static constexpr long long lo = -2147483648LL, hi = 2147483647LL; };

// Block-wide float min / max and NaN flag; every thread gets the result.
// fminf / fmaxf skip NaN, which is counted separately as the CPU does.
__device__ __forceinline__ void block_minmax(float& mn, float& mx, int& nan) {
    __shared__ float s_mn[32], s_mx[32];
    __shared__ int s_nan[32];
    for (int o = 16; o > 0; o >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
    if (lane == 0) { s_mn[warp] = mn; s_mx[warp] = mx; s_nan[warp] = nan; }
    __syncthreads();
    if (warp == 0) {
        mn = lane < nwarps ? s_mn[lane] : __int_as_float(0x7f800000);
        mx = lane < nwarps ? s_mx[lane] : __int_as_float(0xff800000);
        nan = lane < nwarps ? s_nan[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) {
            mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            nan |= __shfl_xor_sync(0xffffffffu, nan, o);
        }
        if (lane == 0) { s_mn[0] = mn; s_mx[0] = mx; s_nan[0] = nan; }
    }
    __syncthreads();
    mn = s_mn[0]; mx = s_mx[0]; nan = s_nan[0];
}

// PyTorch's ChooseQuantizationParams for a quint8 activation (NUMERICS.md,
// dynamic Linear steps 2-5), step for step as qrt/_kernels.pyx computes it.
__device__ __forceinline__ QParams choose_qparams(float lo, float hi, int nan, int qmax) {
    const float SMALL_SCALE = 6.1e-5f;  // a float, widened to double where compared
    const int qmin = 0;
    QParams p;
    if (nan) {  // no scale represents NaN: make every downstream float NaN
        p.scale = p.inv = __int_as_float(0x7fc00000);
        p.zp = 0;
        p.nan = 1;
        return p;
    }
    lo = lo < 0.0f ? lo : 0.0f;
    hi = hi > 0.0f ? hi : 0.0f;
    double s = __ddiv_rn(__dsub_rn((double)hi, (double)lo), (double)(qmax - qmin));
    float sf = __double2float_rn(s);
    if (sf == 0.0f || isinf(__fdiv_rn(1.0f, sf))) s = 0.1;
    if (s < (double)SMALL_SCALE) {
        float org = __double2float_rn(s);
        s = (double)SMALL_SCALE;
        if (lo == 0.0f) {
            hi = __fmul_rn(SMALL_SCALE, (float)(qmax - qmin));
        } else if (hi == 0.0f) {
            lo = __fmul_rn(-SMALL_SCALE, (float)(qmax - qmin));
        } else {
            float amp = __fdiv_rn(SMALL_SCALE, org);
            lo = __fmul_rn(lo, amp);
            hi = __fmul_rn(hi, amp);
        }
    }
    double lo_s = __ddiv_rn((double)lo, s), hi_s = __ddiv_rn((double)hi, s);
    double zp_min = __dsub_rn((double)qmin, lo_s);
    double zp_max = __dsub_rn((double)qmax, hi_s);
    double err_min = __dsub_rn(fabs((double)qmin), fabs(lo_s));
    double err_max = __dsub_rn(fabs((double)qmax), fabs(hi_s));
    double zp = err_min < err_max ? zp_min : zp_max;
    p.zp = zp < qmin ? qmin : (zp > qmax ? qmax : __double2int_rn(zp));
    p.scale = __double2float_rn(s);
    p.inv = __fdiv_rn(1.0f, p.scale);  // fl(1 / s_x)
    p.nan = 0;
    return p;
}

// q_x = clamp(rne(fma(x, inv, zp)), 0, 255) (rule Q1; 255 even under
// reduce_range) for x[m, k] into q[m, Kp], zeroing the padding columns.
__device__ __forceinline__ void quantize_rows(const float* x, int m, int k, int Kp, const QParams& p,
                                              u8* q, unsigned start, unsigned stride) {
    const float zpf = (float)p.zp;
    const unsigned total = (unsigned)m * (unsigned)Kp;
    for (unsigned e = start; e < total; e += stride) {
        const unsigned row = e / (unsigned)Kp, col = e - row * (unsigned)Kp;
        q[e] = col < (unsigned)k ? (u8)round_clamp(__fmaf_rn(x[(size_t)row * k + col], p.inv, zpf), 0, 255) : (u8)0;
    }
}
