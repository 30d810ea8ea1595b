/* Vectorised GEMM kernels of qrt's CPU backend, included from _kernels.pyx.
 *
 * Two products, each with one generic tile function over a handful of
 * per-ISA primitives chosen at build time from the compiler's macros:
 *
 *   u8 x s8 -> int32 (exact):  AVX-512 VNNI vpdpbusd | AVX2 vpmaddwd on
 *   int16-widened bytes (vpmaddubsw would saturate) | NEON sdot on x - 128 |
 *   portable C.
 *   float32 x float16 -> float32 fma chains (fbgemm's rounding): AVX-512F or
 *   AVX2+FMA with f16c widening on the fly | portable C on widened weights.
 *
 * Weights are packed once at load into panels of NR output columns. In an
 * int8 panel each group of 4 k values holds NR x 4 bytes (column-major within
 * the group: what one vpdpbusd / sdot lane consumes); K is padded to a
 * multiple of 4 and N to a multiple of NR with zeros. In a float16 panel each
 * k holds NR consecutive values.
 *
 * A tile is MR rows of x times one panel, accumulated in registers over the
 * whole of K; the drivers walk panels outside and row tiles inside, so a
 * panel (NR * K bytes, 256 KiB at K = 4096) stays in L2 while x streams past.
 * Every output is computed by one tile with one fixed order of operations,
 * whatever the tiling or the number of threads, so results never depend on
 * either.
 */
#ifndef QRT_GEMM_H
#define QRT_GEMM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define QRT_INLINE static inline __attribute__((always_inline))
#define QRT_UNROLL _Pragma("GCC unroll 16")
#else
#define QRT_UNROLL
#define QRT_INLINE static inline
#endif

/* ------------------------------------------------------------------ u8 x s8 primitives
 * I8_NR columns per panel, I8_MR rows per tile, I8_NV accumulators per row,
 * each covering I8_COLS columns and consuming I8_WBYTES packed bytes per group.
 * I8_XBIAS: the dot product the hardware computes is sum (x - XBIAS) * w.
 */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define QRT_I8_PATH "avx512vnni"
#define I8_NR 64
#define I8_MR 6
#define I8_COLS 16
#define I8_XBIAS 0
typedef __m512i i8_acc;
typedef __m512i i8_w;
typedef __m512i i8_x;
#define I8_ZERO() _mm512_setzero_si512()
#define I8_LOADW(p) _mm512_loadu_si512((const void*)(p))
#define I8_SETX(word) _mm512_set1_epi32((int)(word))
/* vpdpbusd: 4 u8*s8 products (each fits int16) summed into each int32 lane, no saturation */
#define I8_DOT(acc, x, w) _mm512_dpbusd_epi32((acc), (x), (w))
#define I8_STORE(out, acc) _mm512_storeu_si512((void*)(out), (acc))
#define I8_LOADC(p) _mm512_loadu_si512((const void*)(p))

#elif defined(__AVX2__)
#include <immintrin.h>
#define QRT_I8_PATH "avx2"
#define I8_NR 8
#define I8_MR 4
#define I8_COLS 4
#define I8_XBIAS 0
typedef __m256i i8_acc;
typedef __m256i i8_w;
typedef __m256i i8_x;
#define I8_ZERO() _mm256_setzero_si256()
/* 4 columns x 4 k of s8 widened to 16 int16; x's 4 bytes widened and repeated to match.
 * vpmaddwd then sums pairs exactly (2 * 255 * 128 < 2^31): lane 2c + h holds column c, k pair h. */
#define I8_LOADW(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p)))
#define I8_SETX(word) _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128((int)(word))))
#define I8_DOT(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
/* 4 partial sums back into pair form: (c, 0) per column */
#define I8_LOADC(p) _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i*)(p)))
QRT_INLINE void I8_STORE(int32_t* out, i8_acc acc) {
    int32_t pairs[8];
    _mm256_storeu_si256((__m256i*)pairs, acc);
    for (int c = 0; c < 4; c++)
        out[c] = (int32_t)((uint32_t)pairs[2 * c] + (uint32_t)pairs[2 * c + 1]);
}

#elif defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define QRT_I8_PATH "neon-sdot"
#define I8_NR 16
#define I8_MR 4
#define I8_COLS 4
/* sdot is s8 x s8: feed x - 128 (x ^ 0x80) and add 128 * rowsum(w) back in the epilogue */
#define I8_XBIAS 128
typedef int32x4_t i8_acc;
typedef int8x16_t i8_w;
typedef int8x16_t i8_x;
#define I8_ZERO() vdupq_n_s32(0)
#define I8_LOADW(p) vld1q_s8((const int8_t*)(p))
#define I8_SETX(word) vreinterpretq_s8_u32(vdupq_n_u32((uint32_t)(word) ^ 0x80808080u))
#define I8_DOT(acc, x, w) vdotq_s32((acc), (w), (x))
#define I8_STORE(out, acc) vst1q_s32((out), (acc))
#define I8_LOADC(p) vld1q_s32(p)

#else
#define QRT_I8_PATH "portable"
#define I8_NR 16
#define I8_MR 4
#define I8_COLS 1
#define I8_XBIAS 0
typedef int32_t i8_acc;
typedef const int8_t* i8_w;
typedef uint32_t i8_x;
#define I8_ZERO() 0
#define I8_LOADW(p) ((const int8_t*)(p))
#define I8_SETX(word) ((uint32_t)(word))
QRT_INLINE int32_t I8_DOT(int32_t acc, uint32_t x, const int8_t* w) {
    uint32_t s = (uint32_t)acc;
    for (int t = 0; t < 4; t++)
        s += ((x >> (8 * t)) & 0xFF) * (uint32_t)(int32_t)w[t];
    return (int32_t)s;
}
#define I8_STORE(out, acc) (*(out) = (acc))
#define I8_LOADC(p) (*(p))
#endif

#define I8_NV (I8_NR / I8_COLS)
#define I8_WBYTES (I8_COLS * 4)

static inline ptrdiff_t qrt_round_up(ptrdiff_t v, ptrdiff_t to) { return (v + to - 1) / to * to; }

/* Bytes of packed int8 weights for n x k. */
static inline ptrdiff_t qrt_i8_packed_size(ptrdiff_t n, ptrdiff_t k) {
    return qrt_round_up(n, I8_NR) * qrt_round_up(k, 4);
}

/* w[n][k] (row-major) -> panels of I8_NR columns, groups of 4 k, zero padded. */
static void qrt_i8_pack(const int8_t* w, ptrdiff_t n, ptrdiff_t k, int8_t* out) {
    ptrdiff_t kp = qrt_round_up(k, 4), j, t;
    memset(out, 0, (size_t)qrt_i8_packed_size(n, k));
    for (j = 0; j < n; j++) {
        int8_t* panel = out + (j / I8_NR) * I8_NR * kp;
        for (t = 0; t < k; t++)
            panel[(t / 4) * I8_NR * 4 + (j % I8_NR) * 4 + t % 4] = w[j * k + t];
    }
}

/* Bytes of packed x for m x k. */
static inline ptrdiff_t qrt_i8_packed_x_size(ptrdiff_t m, ptrdiff_t k) {
    return qrt_round_up(m, I8_MR) * qrt_round_up(k, 4);
}

/* x[m][k] -> tiles of I8_MR rows; in a tile, each group of 4 k holds the rows' 4 bytes in turn,
 * so a tile reads one contiguous stream (rows of x K bytes apart would share L1 sets when K is a
 * multiple of 4096). Padding rows and k are 0. */
static void qrt_i8_pack_x(const uint8_t* x, ptrdiff_t m, ptrdiff_t k, uint8_t* out) {
    ptrdiff_t kp = qrt_round_up(k, 4), i, g;
    if (m % I8_MR || k % 4)
        memset(out, 0, (size_t)qrt_i8_packed_x_size(m, k));
    for (ptrdiff_t i0 = 0; i0 < m; i0 += I8_MR) {
        uint8_t* tile = out + i0 * kp;
        int rows = (int)(m - i0 < I8_MR ? m - i0 : I8_MR);
        for (g = 0; g < k / 4; g++)
            for (int r = 0; r < rows; r++)
                memcpy(tile + (g * I8_MR + r) * 4, x + (i0 + r) * k + 4 * g, 4);
        for (i = i0; i < i0 + rows; i++)
            memcpy(tile + (g * I8_MR + i - i0) * 4, x + i * k + 4 * g, (size_t)(k % 4));
    }
}

/* c[r][col] = start[col] + sum over the k of groups [g0, g1) of (x[r][t] - I8_XBIAS) * panel column col,
 * for the r < mr rows of one packed x tile; start is `init` (one row, shared by all rows) or, when
 * init is NULL, c itself (continuing an earlier slice). c rows are I8_NR apart. */
QRT_INLINE void i8_tile(const uint8_t* xtile, const int mr, const int8_t* panel, ptrdiff_t g0, ptrdiff_t g1,
                        const int32_t* init, int32_t* c) {
    i8_acc acc[I8_MR][I8_NV];
    ptrdiff_t g;
    int r, v;
    QRT_UNROLL for (r = 0; r < I8_MR; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < I8_NV; v++)
                acc[r][v] = init ? I8_LOADC(init + v * I8_COLS) : I8_LOADC(c + r * I8_NR + v * I8_COLS);
    for (g = g0; g < g1; g++) {
        i8_w w[I8_NV];
        QRT_UNROLL for (v = 0; v < I8_NV; v++)
            w[v] = I8_LOADW(panel + g * I8_NR * 4 + v * I8_WBYTES);
        QRT_UNROLL for (r = 0; r < I8_MR; r++) {
            if (r < mr) {
                uint32_t word;
                memcpy(&word, xtile + (g * I8_MR + r) * 4, 4);
                i8_x xr = I8_SETX(word);
                QRT_UNROLL for (v = 0; v < I8_NV; v++)
                    acc[r][v] = I8_DOT(acc[r][v], xr, w[v]);
            }
        }
    }
    QRT_UNROLL for (r = 0; r < I8_MR; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < I8_NV; v++)
                I8_STORE(c + r * I8_NR + v * I8_COLS, acc[r][v]);
}

/* One tile per call site with mr a constant, so the accumulators live in registers. */
static void i8_tile_any(const uint8_t* xtile, int mr, const int8_t* panel, ptrdiff_t g0, ptrdiff_t g1,
                        const int32_t* init, int32_t* c) {
    switch (mr) {
    case 1: i8_tile(xtile, 1, panel, g0, g1, init, c); break;
    case 2: i8_tile(xtile, 2, panel, g0, g1, init, c); break;
    case 3: i8_tile(xtile, 3, panel, g0, g1, init, c); break;
    case 4: i8_tile(xtile, 4, panel, g0, g1, init, c); break;
    case 5: i8_tile(xtile, 5, panel, g0, g1, init, c); break;
    default: i8_tile(xtile, 6, panel, g0, g1, init, c); break;
    }
}

/* Cache blocking: a panel's slice of I8_KC k values (I8_NR * I8_KC bytes, 16 KiB) stays in L1
 * while up to I8_MC rows of x sweep it; their sums wait in c between slices. */
#ifndef I8_KC
#define I8_KC 256
#endif
#define I8_MC (I8_MR * 16)

/* What qrt_gemm_u8s8 does with each exact int32 result a = acc[i][j], while its tile is in cache. */
typedef struct {
    int32_t* acc;         /* if not NULL: acc[i][j] = a */
    float* y;             /* dynamic linear: y[i][j] = fma(fl(a), y_scale[j], bias[j]) or fl(a) * y_scale[j] */
    const float* y_scale; /* fl(s_x * s_w[j]) */
    const float* bias;
    uint8_t* q;           /* static linear: q[i][j] = requantized a (qrt_requantize_one) */
    const float* bias_q;  /* per-channel folded bias, or NULL */
    const float* bias_t;  /* per-tensor bias, or NULL */
    float bias_inv;
    const float* mult;
    int32_t zp, lo;
} qrt_epilogue;

/* Row i, columns [j0, j1), of the epilogue from the exact results a[0 .. j1 - j0).
 * Fields are read into locals first: stores through uint8_t* may alias anything, and the
 * compiler would reload them at every element otherwise. Static linear requantization
 * (NUMERICS.md): v = fl(a) plus the folded bias, v + bias_q[j] (per-channel) or
 * fma(bias[j], bias_inv, v) (per-tensor); then clamp(sat_int16(rne(fl(v * mult[j]))) + zp, lo, 255). */
static void qrt_epilogue_row(const qrt_epilogue* e, ptrdiff_t i, ptrdiff_t n, ptrdiff_t j0, ptrdiff_t j1,
                             const int32_t* a) {
    ptrdiff_t j, cols = j1 - j0;
    if (e->acc) {
        memcpy(e->acc + i * n + j0, a, (size_t)cols * sizeof(int32_t));
    } else if (e->q) {
        uint8_t* out = e->q + i * n + j0;
        const float *bias_q = e->bias_q, *bias_t = e->bias_t, *mult = e->mult + j0;
        float bias_inv = e->bias_inv;
        int32_t zp = e->zp, lo = e->lo;
        for (j = 0; j < cols; j++) {
            float v = (float)a[j];
            if (bias_q)
                v = v + bias_q[j0 + j];
            else if (bias_t)
                v = fmaf(bias_t[j0 + j], bias_inv, v);
            float r = nearbyintf(v * mult[j]);
            r = r < -32768.0f ? -32768.0f : (r > 32767.0f ? 32767.0f : r);
            int32_t q = (int32_t)r + zp;
            out[j] = (uint8_t)(q < lo ? lo : (q > 255 ? 255 : q));
        }
    } else {
        float* out = e->y + i * n + j0;
        const float *scale = e->y_scale + j0, *bias = e->bias;
        if (bias)
            for (j = 0; j < cols; j++)
                out[j] = fmaf((float)a[j], scale[j], bias[j0 + j]);
        else
            for (j = 0; j < cols; j++)
                out[j] = (float)a[j] * scale[j];
    }
}

/* The part of the expansion below that depends on the column only, for columns [0, n) of weights
 * with row sums w_rowsum and zero points w_zp, against x_zp: what each sum starts from. */
static void qrt_i8_col_offset(int32_t x_zp, const int32_t* w_rowsum, const int32_t* w_zp, ptrdiff_t n, ptrdiff_t k,
                              int32_t* out) {
    uint32_t zx = (uint32_t)x_zp, kz = (uint32_t)k * zx;
    for (ptrdiff_t j = 0; j < n; j++)
        out[j] = (int32_t)(((uint32_t)I8_XBIAS - zx) * (uint32_t)w_rowsum[j] + kz * (uint32_t)w_zp[j]);
}

/* acc[i][j] = sum_t (x[i][t] - x_zp) * (w[j][t] - w_zp[j]) in int32 (wrapping), for
 * rows [i0, i1) (i0 a multiple of I8_MR) and columns of panels [p0, p1) (clipped to n),
 * from x packed by qrt_i8_pack_x.
 *
 * Expanded as dot(x, w) + col_offset[j] - w_zp[j] * rowsum(x)[i], where col_offset (from
 * qrt_i8_col_offset, padded to whole panels) holds - x_zp * rowsum(w)[j] + k * x_zp * w_zp[j]:
 * the dot products start from it, so a sum needs no fixing afterwards unless x_rowsum is given
 * (it may be NULL when every w_zp is 0). All exact modulo 2^32. Each result goes to the epilogue
 * e (row stride n). */
static void qrt_gemm_u8s8(const uint8_t* xpacked, const int32_t* col_offset, const int8_t* packed,
                          const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0,
                          ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, const qrt_epilogue* e) {
    int32_t c[I8_MC * I8_NR];
    ptrdiff_t kp = qrt_round_up(k, 4), groups = kp / 4, p, ib, ie, i, gb, j, j0, j1;
    for (p = p0; p < p1; p++) {
        const int8_t* panel = packed + p * I8_NR * kp;
        j0 = p * I8_NR;
        j1 = j0 + I8_NR < n ? j0 + I8_NR : n;
        for (ib = i0; ib < i1; ib += I8_MC) {
            ie = ib + I8_MC < i1 ? ib + I8_MC : i1;
            for (gb = 0; gb < groups || gb == 0; gb += I8_KC / 4) {
                ptrdiff_t ge = gb + I8_KC / 4 < groups ? gb + I8_KC / 4 : groups;
                for (i = ib; i < ie; i += I8_MR)
                    i8_tile_any(xpacked + i * kp, (int)(ie - i < I8_MR ? ie - i : I8_MR), panel, gb, ge,
                                gb == 0 ? col_offset + j0 : NULL, c + (i - ib) * I8_NR);
            }
            for (i = ib; i < ie; i++) {
                int32_t* ci = c + (i - ib) * I8_NR;
                if (x_rowsum) {
                    uint32_t xs = (uint32_t)x_rowsum[i];
                    for (j = j0; j < j1; j++)
                        ci[j - j0] = (int32_t)((uint32_t)ci[j - j0] - (uint32_t)w_zp[j] * xs);
                }
                qrt_epilogue_row(e, i, n, j0, j1, ci);
            }
        }
    }
}

/* ------------------------------------------------------------------ float x float16 primitives
 * F_NR columns per panel, F_MR rows per tile, F_LANES columns per accumulator.
 * Packed weights are float16 bits (F_HALF) or float32 values.
 */
#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define QRT_F16_PATH "avx512f-f16c"
#define F_HALF 1
#define F_NR 32
#define F_MR 8
#define F_LANES 16
typedef __m512 f_vec;
#define F_ZERO() _mm512_setzero_ps()
#define F_LOADW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
#define F_LOADF(p) _mm512_loadu_ps(p)
#define F_SET1(v) _mm512_set1_ps(v)
#define F_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define F_ADD(a, b) _mm512_add_ps((a), (b))
#define F_STORE(out, v) _mm512_storeu_ps((out), (v))
#define F_LOADC(p) _mm512_loadu_ps(p)

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QRT_F16_PATH "avx2-fma-f16c"
#define F_HALF 1
#define F_NR 16
#define F_MR 4
#define F_LANES 8
typedef __m256 f_vec;
#define F_ZERO() _mm256_setzero_ps()
#define F_LOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
#define F_LOADF(p) _mm256_loadu_ps(p)
#define F_SET1(v) _mm256_set1_ps(v)
#define F_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define F_ADD(a, b) _mm256_add_ps((a), (b))
#define F_STORE(out, v) _mm256_storeu_ps((out), (v))
#define F_LOADC(p) _mm256_loadu_ps(p)

#else
#define QRT_F16_PATH "portable"
#define F_HALF 0
#define F_NR 16
#define F_MR 4
#define F_LANES 1
typedef float f_vec;
#define F_ZERO() 0.0f
#define F_LOADW(p) (*(const float*)(p))
#define F_LOADF(p) (*(p))
#define F_SET1(v) (v)
#define F_FMA(a, b, c) fmaf((a), (b), (c))
#define F_ADD(a, b) ((a) + (b))
#define F_STORE(out, v) (*(out) = (v))
#define F_LOADC(p) (*(p))
#endif

#define F_NV (F_NR / F_LANES)
#define F_WSIZE (F_HALF ? 2 : 4) /* bytes per packed weight */
#define QRT_F16_BLOCK 512        /* fbgemm restarts the chain every 512 k in its tail block */
#define QRT_F16_TAIL 32          /* ... the last partial block of 32 output columns */

static inline ptrdiff_t qrt_f16_packed_size(ptrdiff_t n, ptrdiff_t k) { return qrt_round_up(n, F_NR) * k * F_WSIZE; }

/* w[n][k] float32 holding float16 values (exact) -> panels of F_NR columns, each k's F_NR values together. */
static void qrt_f16_pack(const float* w, ptrdiff_t n, ptrdiff_t k, void* out) {
    ptrdiff_t j, t;
    memset(out, 0, (size_t)qrt_f16_packed_size(n, k));
    for (j = 0; j < n; j++) {
        ptrdiff_t at = (j / F_NR) * F_NR * k + j % F_NR;
        for (t = 0; t < k; t++) {
#if F_HALF
            ((uint16_t*)out)[at + t * F_NR] = (uint16_t)_cvtss_sh(w[j * k + t], 0);
#else
            ((float*)out)[at + t * F_NR] = w[j * k + t];
#endif
        }
    }
}

/* Floats of packed x for m x k. */
static inline ptrdiff_t qrt_f16_packed_x_size(ptrdiff_t m, ptrdiff_t k) { return qrt_round_up(m, F_MR) * k; }

/* x[m][k] -> tiles of F_MR rows, each k's F_MR values together (one stream per tile; rows
 * 4*K bytes apart would share L1 sets when K is a multiple of 1024). Padding rows are 0. */
static void qrt_f16_pack_x(const float* x, ptrdiff_t m, ptrdiff_t k, float* out) {
    for (ptrdiff_t i0 = 0; i0 < m; i0 += F_MR) {
        float* tile = out + i0 * k;
        int rows = (int)(m - i0 < F_MR ? m - i0 : F_MR);
        for (ptrdiff_t t = 0; t < k; t++)
            for (int r = 0; r < F_MR; r++)
                tile[t * F_MR + r] = r < rows ? x[(i0 + r) * k + t] : 0.0f;
    }
}

/* For the r < mr rows of a packed x tile, over `count` k from those at xt and w: the fma chain
 * of x[r][t] * w[col][t] in k order, into c[r][col] (rows F_NR apart). w is the panel's packed
 * weights, or (wide) the same slice already widened to float32.
 *   plain panels: the chain starts at 0 (first) or continues from c, and c takes its value;
 *   blocked panels (the tail quirk; the k are one 512 block): the chain starts at 0 and
 *   c = (first ? 0 : c) + chain, a plain float add. */
QRT_INLINE void f_tile(const float* xt, const int mr, const void* w, const int wide, ptrdiff_t count, int first,
                       int blocked, float* c) {
    f_vec acc[F_MR][F_NV];
    ptrdiff_t t;
    int r, v;
    QRT_UNROLL for (r = 0; r < F_MR; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < F_NV; v++)
                acc[r][v] = first || blocked ? F_ZERO() : F_LOADC(c + r * F_NR + v * F_LANES);
    for (t = 0; t < count; t++) {
        f_vec wv[F_NV];
        QRT_UNROLL for (v = 0; v < F_NV; v++)
            wv[v] = wide ? F_LOADF((const float*)w + t * F_NR + v * F_LANES)
                         : F_LOADW((const char*)w + (t * F_NR + v * F_LANES) * F_WSIZE);
        QRT_UNROLL for (r = 0; r < F_MR; r++) {
            if (r < mr) {
                f_vec xr = F_SET1(xt[t * F_MR + r]);
                QRT_UNROLL for (v = 0; v < F_NV; v++)
                    acc[r][v] = F_FMA(xr, wv[v], acc[r][v]);
            }
        }
    }
    QRT_UNROLL for (r = 0; r < F_MR; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < F_NV; v++) {
                float* cv = c + r * F_NR + v * F_LANES;
                F_STORE(cv, blocked ? F_ADD(first ? F_ZERO() : F_LOADC(cv), acc[r][v]) : acc[r][v]);
            }
}

/* One instance per (mr, wide), both constants, so the accumulators live in registers. */
#define F_TILE_MR(R) f_tile(xt, R, w, wide, count, first, blocked, c)
#define F_TILE_WIDE(W)                                                                                                \
    do {                                                                                                              \
        const int wide = W;                                                                                           \
        switch (mr) {                                                                                                 \
        case 1: F_TILE_MR(1); break;                                                                                  \
        case 2: F_TILE_MR(2); break;                                                                                  \
        case 3: F_TILE_MR(3); break;                                                                                  \
        case 4: F_TILE_MR(4); break;                                                                                  \
        case 5: F_TILE_MR(5); break;                                                                                  \
        case 6: F_TILE_MR(6); break;                                                                                  \
        case 7: F_TILE_MR(7); break;                                                                                  \
        default: F_TILE_MR(8); break;                                                                                 \
        }                                                                                                             \
    } while (0)

static void f_tile_any(const float* xt, int mr, const void* w, int wide_, ptrdiff_t count, int first, int blocked,
                       float* c) {
    if (wide_)
        F_TILE_WIDE(1);
    else
        F_TILE_WIDE(0);
}

/* Cache blocking as for int8: F_KC k of a panel stay in L1 while up to F_MC rows sweep them.
 * When several row tiles share a slice, it is widened to float32 once (wbuf) instead of in
 * every tile: the conversions would otherwise compete with the FMAs for the same port.
 * F_KC divides QRT_F16_BLOCK, so the tail quirk's blocks are whole numbers of slices. */
#define F_KC 128
#define F_MC (F_MR * 16)

/* y[i][j] = chain(x[i], w[j]) (+ bias[j], a separate float add) for rows [i0, i1) (i0 a multiple of
 * F_MR) and panels [p0, p1), from x packed by qrt_f16_pack_x. */
static void qrt_gemm_f16(const float* xpacked, const void* packed, const float* bias, ptrdiff_t n, ptrdiff_t k,
                         ptrdiff_t i0, ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, float* y, ptrdiff_t ldy) {
    float c[F_MC * F_NR], wbuf[F_KC * F_NR];
    ptrdiff_t tail_start = n - n % QRT_F16_TAIL, p, ib, ie, i, kb, j, j0, j1, t;
    for (p = p0; p < p1; p++) {
        const char* panel = (const char*)packed + p * F_NR * k * F_WSIZE;
        j0 = p * F_NR;
        j1 = j0 + F_NR < n ? j0 + F_NR : n;
        /* F_NR divides 32, so a panel lies wholly inside or outside the tail block */
        int blocked = j0 >= tail_start && k > QRT_F16_BLOCK;
        ptrdiff_t slice = blocked ? QRT_F16_BLOCK : F_KC;
        for (ib = i0; ib < i1; ib += F_MC) {
            ie = ib + F_MC < i1 ? ib + F_MC : i1;
            int widen = F_HALF && !blocked && ie - ib > F_MR;
            for (kb = 0; kb < k || kb == 0; kb += slice) {
                ptrdiff_t ke = kb + slice < k ? kb + slice : k;
                const void* w = panel + kb * F_NR * F_WSIZE;
                if (widen) {
                    for (t = 0; t < (ke - kb) * F_NR; t += F_LANES)
                        F_STORE(wbuf + t, F_LOADW((const char*)w + t * F_WSIZE));
                    w = wbuf;
                }
                for (i = ib; i < ie; i += F_MR)
                    f_tile_any(xpacked + i * k + kb * F_MR, (int)(ie - i < F_MR ? ie - i : F_MR), w, widen, ke - kb,
                               kb == 0, blocked, c + (i - ib) * F_NR);
            }
            for (i = ib; i < ie; i++) {
                const float* ci = c + (i - ib) * F_NR - j0;
                for (j = j0; j < j1; j++)
                    y[i * ldy + j] = bias ? ci[j] + bias[j] : ci[j];
            }
        }
    }
}

/* ------------------------------------------------------------------ dynamic quantization, vectorisable loops */

/* Min and max of x[0..n) (n >= 1); returns 1 if any is NaN or infinite (torch's parameter choice has
 * no defined result for those: its zero point becomes a cast of NaN). Kept in 8 lanes (GCC/Clang vector
 * extensions), so it runs as vector compares and selects: only the sign of a zero result may
 * differ from a serial scan, and callers extend the range to include 0, making both zeros +0. */
static int qrt_min_max(const float* x, ptrdiff_t n, float* lo, float* hi) {
    float mn = x[0], mx = x[0];
    int nan = 0;
    ptrdiff_t i = 0;
#if defined(__GNUC__)
    typedef float f8 __attribute__((vector_size(32)));
    typedef int32_t i8 __attribute__((vector_size(32)));
    f8 vmn = {0}, vmx, v;
    i8 vnan = {0}, less, more;
    vmn += mn;
    vmx = vmn;
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, x + i, sizeof v);
        vnan |= v != v;
        less = v < vmn;
        more = v > vmx;
        vmn = (f8)((less & (i8)v) | (~less & (i8)vmn));
        vmx = (f8)((more & (i8)v) | (~more & (i8)vmx));
    }
    for (int l = 0; l < 8; l++) {
        nan |= vnan[l] != 0;
        mn = vmn[l] < mn ? vmn[l] : mn;
        mx = vmx[l] > mx ? vmx[l] : mx;
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

#endif /* QRT_GEMM_H */
