/* Dynamic quantization of activations: vectorisable loops, included once per variant (variant.h). */
#include "gate_math.h"
#include "quantize_params.h"

/* A float's bits as an int32 that orders as the float does: negative floats' magnitude bits flipped, so
 * -inf < -1 < -0 < +0 < 1 < +inf, with NaNs past the infinities on the side of their sign. The flip keeps the
 * sign bit, so it is its own inverse. */
QRT_INLINE uint32_t qrt_order_flip(uint32_t b) { return b ^ ((uint32_t)((int32_t)b >> 31) >> 1); }

QRT_INLINE int32_t qrt_order_key(float v) { return (int32_t)qrt_order_flip(qrt_float_bits(v)); }

QRT_INLINE float qrt_order_float(int32_t key) { return qrt_bits_float(qrt_order_flip((uint32_t)key)); }

/* Min and max of x[0..n) (n >= 1); returns 1 if any is NaN or infinite (torch's parameter choice has no
 * defined result for those: its zero point becomes a cast of NaN), lo and hi then unset. Where the ISA has a
 * float form (I8_RANGE, isa/range_body.h: vminps and vmaxps), that; else taken on order keys, whose min and max
 * every ISA vectorises as integer instructions: compares and selects as GCC vectorises them took 6 cycles a
 * 16-float vector (Zen 5, avx512-vnni, 2240 floats: 193 -> 73 ns; portable, SSE2: 6.1 -> 0.9 us). A NaN or
 * an infinity leaves a key at or past an infinity's. -0.0 orders below +0.0 here, and either may come out of
 * the float form; callers extend the range to include 0, which makes either zero +0. */
static int qrt_min_max(const float* x, ptrdiff_t n, float* lo, float* hi) {
#if defined(I8_RANGE)
    return I8_RANGE(x, n, lo, hi);
#else
    int32_t mn = INT32_MAX, mx = INT32_MIN;
    for (ptrdiff_t i = 0; i < n; i++) {
        const int32_t key = qrt_order_key(x[i]);
        mn = key < mn ? key : mn;
        mx = key > mx ? key : mx;
    }
    *lo = qrt_order_float(mn);
    *hi = qrt_order_float(mx);
    return mx >= qrt_order_key(INFINITY) || mn <= qrt_order_key(-INFINITY);
#endif
}

/* q = clamp(rne(fma(x, inv, zp)), 0, 255) (NUMERICS.md Q1, torch on x86) or, round_first, clamp(rne(fl(x * inv)) +
 * zp, 0, 255) (torch on aarch64: the zero point added after rounding; NUMERICS.md section 9), for x not NaN (both
 * callers take x's range first, which refuses NaN and infinity). Rounded by the 1.5 * 2^23 shift (qrt_exp_parts,
 * gate_math.h: nearest, ties to even, for |y| < 2^22) and clamped on the bits as an int32: they order as the
 * shifted value does while it is positive, and a shifted value below 1.5 * 2^23 (y < 0, negative values
 * included) clamps to 0; beyond 2^22 they clamp to 255 as y would (every 7th float bit pattern checked against
 * nearbyintf's). round_first clamps the bits to those of rne(x * inv) in [-zp, 255 - zp] (zp in [0, 255]) and
 * subtracts the lower: the same bytes as clamping to [-256, 512], adding zp and clamping to [0, 255], for every
 * int32 (checked at zp 0, 1, 127, 128, 254, 255), in 2 compares where that took 4 (64 x 256 floats, avx512-vnni,
 * Zen 5: 1.28 -> 0.41 us). GCC compiled float clamps of nearbyintf's result into mask juggling: 2240
 * floats in 209 -> 113 ns on avx512-vnni, 531 -> 278 on avx2 (Zen 5). */
QRT_INLINE void qrt_quantize_span(const float* x, ptrdiff_t n, float inv, float zp, int round_first, uint8_t* q) {
    const int32_t shift = 0x4b400000; /* the bits of 1.5 * 2^23 */
    if (round_first) { /* the bits of a negative float, a negative int32, clamp to lo without overflowing */
        const int32_t z = (int32_t)zp, lo = shift - z, hi = shift + 255 - z;
        for (ptrdiff_t i = 0; i < n; i++) {
            int32_t v = (int32_t)qrt_float_bits(x[i] * inv + 12582912.0f);
            v = v < lo ? lo : v > hi ? hi : v;
            q[i] = (uint8_t)(v - lo);
        }
        return;
    }
    for (ptrdiff_t i = 0; i < n; i++) {
        int32_t v = (int32_t)qrt_float_bits(fmaf(x[i], inv, zp) + 12582912.0f);
        v = (v > shift ? v : shift) - shift; /* 0 at least */
        q[i] = (uint8_t)(v < 255 ? v : 255);
    }
}

/* The table's entry; the packers of x (gemm_i8.h, gemm_i8_amx.h) inline the span at a constant length. */
static void qrt_quantize_u8(const float* x, ptrdiff_t n, float inv, float zp, int round_first, uint8_t* q) {
    qrt_quantize_span(x, n, inv, zp, round_first, q);
}

/* The largest of x[0..n) (0 if n is 0): whether a row of x may take the int8 product's faster flavour. */
static int qrt_u8_max(const uint8_t* x, ptrdiff_t n) {
    uint8_t largest = 0;
    for (ptrdiff_t i = 0; i < n; i++)
        largest = x[i] > largest ? x[i] : largest;
    return largest;
}

/* torchao's per-row symmetric int8 quantization (Int8Tensor.from_hp, PerRow, SYMMETRIC; NUMERICS.md section 11) of
 * x[m][k]: for each row, s = max(fl(max|x| / 127.5), 2^-23), q = clamp(rne(fl(x * fl(1 / s))), -128, 127), stored as
 * q + 128 (zero point 128 in the u8 x s8 product: the same sums), and scales[i] = s. max|x| is taken on the bits
 * with the sign cleared, which order as the magnitudes do (a NaN or an infinity at or past 0x7f800000); rne by
 * the 1.5 * 2^23 shift as qrt_quantize_u8 (|fl(x * inv)| <= 127.5 (1 + 2^-22) here). Returns 1 on NaN or infinity
 * (q and scales then partly set). */
static int qrt_quantize_rows_s8(const float* x, ptrdiff_t m, ptrdiff_t k, uint8_t* q, float* scales) {
    const float eps = 1.1920928955078125e-07f; /* torchao's floor: float32's eps */
    for (ptrdiff_t i = 0; i < m; i++) {
        const float* row = x + i * k;
        uint8_t* out = q + i * k;
        uint32_t amax = 0;
        for (ptrdiff_t t = 0; t < k; t++) {
            const uint32_t b = qrt_float_bits(row[t]) & 0x7fffffffu;
            amax = b > amax ? b : amax;
        }
        if (amax >= 0x7f800000u)
            return 1;
        float s = qrt_bits_float(amax) / 127.5f;
        s = s > eps ? s : eps;
        const float inv = 1.0f / s;
        scales[i] = s;
        for (ptrdiff_t t = 0; t < k; t++) {
            int32_t v = (int32_t)qrt_float_bits(row[t] * inv + 12582912.0f) - 0x4b400000;
            v = v < -128 ? -128 : (v > 127 ? 127 : v);
            out[t] = (uint8_t)(v + 128);
        }
    }
    return 0;
}

/* x[0..n) (n >= 1) quantized dynamically on one thread: its range (qrt_min_max), torch's parameters for it,
 * then q (qrt_quantize_u8, clamped to 255 even under reduce_range, as PyTorch does). One call where the
 * driver made three: a batch-1 recurrent step quantizes its hidden state so every step. Returns 1 on NaN or
 * infinity (q, scale and zero point then unset). */
static int qrt_quantize_dynamic(const float* x, ptrdiff_t n, int reduce_range, int round_first, uint8_t* q,
                                float* scale, int32_t* zero_point) {
    float lo, hi;
    if (qrt_min_max(x, n, &lo, &hi))
        return 1;
    qrt_choose_qparams(lo, hi, reduce_range, scale, zero_point);
    qrt_quantize_u8(x, n, 1.0f / *scale, (float)*zero_point, round_first, q);
    return 0;
}
