/* Dynamic quantization of activations: vectorisable loops, included once per variant (variant.h). */
#include "quantize_params.h"

/* Min and max of x[0..n) (n >= 1); returns 1 if any is NaN or infinite (torch's parameter choice has
 * no defined result for those: its zero point becomes a cast of NaN). Kept in 4 x 8 lanes (GCC/Clang vector
 * extensions), so it runs as vector compares and selects, 4 independent ones at a time (one chain of
 * compare and select per lane ran at 3-4 cycles a vector: 6% of a batch-1 MLP call on Zen 5): only the
 * sign of a zero result may differ from a serial scan, and callers extend the range to include 0, making
 * both zeros +0. */
static int qrt_min_max(const float* x, ptrdiff_t n, float* lo, float* hi) {
    float mn = x[0], mx = x[0];
    int nan = 0;
    ptrdiff_t i = 0;
#if defined(__GNUC__)
    typedef float f8 __attribute__((vector_size(32)));
    typedef int32_t i8 __attribute__((vector_size(32)));
    f8 vmn[4], vmx[4], v;
    i8 vnan = {0}, less, more;
    QRT_UNROLL for (int a = 0; a < 4; a++) {
        vmn[a] = (f8){0} + mn;
        vmx[a] = vmn[a];
    }
    for (; i + 32 <= n; i += 32)
        QRT_UNROLL for (int a = 0; a < 4; a++) {
            memcpy(&v, x + i + 8 * a, sizeof v);
            vnan |= v != v;
            less = v < vmn[a];
            more = v > vmx[a];
            vmn[a] = (f8)((less & (i8)v) | (~less & (i8)vmn[a]));
            vmx[a] = (f8)((more & (i8)v) | (~more & (i8)vmx[a]));
        }
    QRT_UNROLL for (int a = 1; a < 4; a++) { /* the 4 into the first */
        less = vmn[a] < vmn[0];
        more = vmx[a] > vmx[0];
        vmn[0] = (f8)((less & (i8)vmn[a]) | (~less & (i8)vmn[0]));
        vmx[0] = (f8)((more & (i8)vmx[a]) | (~more & (i8)vmx[0]));
    }
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, x + i, sizeof v);
        vnan |= v != v;
        less = v < vmn[0];
        more = v > vmx[0];
        vmn[0] = (f8)((less & (i8)v) | (~less & (i8)vmn[0]));
        vmx[0] = (f8)((more & (i8)v) | (~more & (i8)vmx[0]));
    }
    for (int l = 0; l < 8; l++) {
        nan |= vnan[l] != 0;
        mn = vmn[0][l] < mn ? vmn[0][l] : mn;
        mx = vmx[0][l] > mx ? vmx[0][l] : mx;
    }
#endif
    for (; i < n; i++) {
        nan |= x[i] != x[i];
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    *lo = mn;
    *hi = mx;
    return nan || isinf(mn) || isinf(mx);
}

/* q = clamp(rne(fma(x, inv, zp)), 0, 255) (NUMERICS.md Q1); a NaN product maps to 0. */
static void qrt_quantize_u8(const float* x, ptrdiff_t n, float inv, float zp, uint8_t* q) {
    for (ptrdiff_t i = 0; i < n; i++) {
        float r = nearbyintf(fmaf(x[i], inv, zp));
        r = r > 0.0f ? r : 0.0f;
        r = r < 255.0f ? r : 255.0f;
        q[i] = (uint8_t)(int32_t)r;
    }
}

/* The largest of x[0..n) (0 if n is 0): whether a row of x may take the int8 product's faster flavour. */
static int qrt_u8_max(const uint8_t* x, ptrdiff_t n) {
    uint8_t largest = 0;
    for (ptrdiff_t i = 0; i < n; i++)
        largest = x[i] > largest ? x[i] : largest;
    return largest;
}

/* x[0..n) (n >= 1) quantized dynamically on one thread: its range (qrt_min_max), torch's parameters for it,
 * then q (qrt_quantize_u8, clamped to 255 even under reduce_range, as PyTorch does). One call where the
 * driver made three: a batch-1 recurrent step quantizes its hidden state so every step. Returns 1 on NaN or
 * infinity (q, scale and zero point then unset). */
static int qrt_quantize_dynamic(const float* x, ptrdiff_t n, int reduce_range, uint8_t* q, float* scale,
                                int32_t* zero_point) {
    float lo, hi;
    if (qrt_min_max(x, n, &lo, &hi))
        return 1;
    qrt_choose_qparams(lo, hi, reduce_range, scale, zero_point);
    qrt_quantize_u8(x, n, 1.0f / *scale, (float)*zero_point, q);
    return 0;
}
