/* The u8 x s8 -> int32 product (exact), generic over the primitives of one ISA (isa/i8_*.h).
 *
 * Weights are packed once, by whoever wrote them (layout.h: strips of 16 output columns, each group of
 * 4 k holding 16 x 4 bytes, column-major within the group: what one vpdpbusd / sdot lane consumes);
 * every variant reads that one layout, a panel of I8_NR columns being I8_NR / 16 strips side by side.
 * A tile is I8_MR rows of x times one panel, accumulated in registers over the whole of K; the driver
 * walks panels outside and row tiles inside, so a panel stays in L2 while x streams past. Every output
 * is computed by one tile with one fixed order of operations, whatever the tiling or the number of
 * threads, and integer sums are exact modulo 2^32 in any order: every ISA gives the same bits.
 *
 * Included once per variant (variant.h); everything here is static to that variant.
 */
#include "gate_math.h"
#include "layout.h"

#include <stdlib.h>

#ifndef I8_ROWS
#define I8_ROWS I8_MR /* rows the exact flavour keeps in registers per call */
#endif
#ifndef I8_XALIGN
#define I8_XALIGN 4 /* packed x holds each row's k padded to a multiple of this */
#endif
#if QRT_I8_NPAD % I8_NR || I8_NR % QRT_STRIP
#error "a panel must be whole strips, and whole panels must cover the padded columns"
#endif

/* The 4 bytes of packed weights for column `col` of a panel (strips ss bytes apart), k group g. */
#define I8_AT(panel, ss, g, col) ((panel) + ((col) / QRT_STRIP) * (ss) + ((g) * QRT_STRIP + (col) % QRT_STRIP) * 4)

/* Bytes of packed x for m x k. */
static inline ptrdiff_t qrt_i8_packed_x_size(ptrdiff_t m, ptrdiff_t k) {
    return qrt_round_up(m, I8_MR) * qrt_round_up(k, I8_XALIGN);
}

/* Rows i0 .. i0 + rows - 1 of x into a tile's whole groups of 4 k: inlined with rows a constant for a whole
 * tile, so the copies unroll (M=35 K=64, avx512-vnni: 195 -> 131 ns a call). */
QRT_INLINE void i8_pack_rows(uint8_t* tile, const uint8_t* x, ptrdiff_t k, ptrdiff_t i0, const int rows) {
    for (ptrdiff_t g = 0; g < k / 4; g++)
        QRT_UNROLL for (int r = 0; r < rows; r++)
            memcpy(tile + (g * I8_MR + r) * 4, x + (i0 + r) * k + 4 * g, 4);
}

/* Rows [i0, i0 + rows) of x into the tile at `tile`: each group of 4 k holds the rows' 4 bytes in turn,
 * so a tile reads one contiguous stream (rows of x K bytes apart would share L1 sets when K is a multiple
 * of 4096). Padding is left as it is (0: qrt_i8_pack_x). */
static void i8_pack_tile(uint8_t* tile, const uint8_t* x, ptrdiff_t k, ptrdiff_t i0, int rows) {
    const ptrdiff_t g = k / 4; /* the last, partial group */
    if (rows == I8_MR)
        i8_pack_rows(tile, x, k, i0, I8_MR);
    else
        i8_pack_rows(tile, x, k, i0, rows);
    for (ptrdiff_t i = i0; i < i0 + rows; i++)
        memcpy(tile + (g * I8_MR + i - i0) * 4, x + i * k + 4 * g, (size_t)(k % 4));
}

/* The largest value of x[0 .. count), which decides the product's flavour (qrt_gemm_u8s8). */
static int i8_largest(const uint8_t* x, ptrdiff_t count) {
    uint8_t largest = 0;
    for (ptrdiff_t i = 0; i < count; i++)
        largest = x[i] > largest ? x[i] : largest;
    return largest;
}

/* Dynamic quantization's parameters (qrt_quantize_u8's): the packers quantize x on the way. */
typedef struct {
    float inv, zp;
    int round_first;
} i8_qparams;

#define I8_QK 256 /* k a row quantizes at a time into the stack before the tile takes it: I8_MR x 256 bytes */

/* Rows [i0, i0 + rows) of float x quantized into the tile at `tile` as i8_pack_tile lays them out, through a
 * stack buffer of I8_QK k a row (in L1) rather than a q buffer of all of x. */
static void i8_quantize_tile(uint8_t* tile, const float* x, ptrdiff_t k, ptrdiff_t i0, int rows, const i8_qparams* z) {
    uint8_t q[I8_MR * I8_QK];
    for (ptrdiff_t t0 = 0; t0 < k; t0 += I8_QK) {
        const ptrdiff_t w = k - t0 < I8_QK ? k - t0 : I8_QK;
        for (int r = 0; r < rows; r++)
            qrt_quantize_span(x + (i0 + r) * k + t0, w, z->inv, z->zp, z->round_first, q + r * w);
        i8_pack_tile(tile + t0 / 4 * I8_MR * 4, q, w, 0, rows); /* w is a multiple of 4 but at the end */
    }
}

#if !defined(I8_AMX) /* which packs x its own way (gemm_i8_amx.h) */
/* qrt_i8_pack_x of x quantized by qrt_quantize_u8 (inv, zp, round_first), without q in memory. */
static void qrt_i8_quantize_pack_x(const float* x, ptrdiff_t m, ptrdiff_t k, float inv, float zp, int round_first,
                                   uint8_t* out) {
    const ptrdiff_t kx = qrt_round_up(k, I8_XALIGN);
    const i8_qparams z = {inv, zp, round_first};
    if (m % I8_MR || k % I8_XALIGN)
        memset(out, 0, (size_t)qrt_i8_packed_x_size(m, k));
    for (ptrdiff_t i0 = 0; i0 < m; i0 += I8_MR)
        i8_quantize_tile(out + i0 * kx, x, k, i0, (int)(m - i0 < I8_MR ? m - i0 : I8_MR), &z);
}
#endif

#if !defined(I8_AMX) /* which packs x its own way (gemm_i8_amx.h) */
/* x[m][k] -> tiles of I8_MR rows (i8_pack_tile), padding rows and k 0. Returns the largest value of x. */
static int qrt_i8_pack_x(const uint8_t* x, ptrdiff_t m, ptrdiff_t k, uint8_t* out) {
    const ptrdiff_t kx = qrt_round_up(k, I8_XALIGN);
    if (m % I8_MR || k % I8_XALIGN)
        memset(out, 0, (size_t)qrt_i8_packed_x_size(m, k));
    for (ptrdiff_t i0 = 0; i0 < m; i0 += I8_MR)
        i8_pack_tile(out + i0 * kx, x, k, i0, (int)(m - i0 < I8_MR ? m - i0 : I8_MR));
    return i8_largest(x, m * k);
}
#endif

/* Where a tile puts its finished sums when they are a dynamic linear's outputs and its flavour has the ISA's
 * form of qrt_dequantize_row for one register (T_DEQUANTIZE): straight from the registers to y, not through
 * the int32 buffer and qrt_epilogue_rows (Zen 5, avx512-vnni, M=35 K=64 N=256: 2.2 -> 1.6-1.7 us; one-row
 * passes gained nothing so, and keep the buffer); where n ends inside a register, its first lanes only (N=94:
 * 1.0 -> 0.8-0.9 us, its last panel 30 columns). Columns count from the panel's first. */
typedef struct {
    float* y;            /* the output of the tile's first row and column */
    ptrdiff_t ldy;       /* its row stride */
    ptrdiff_t cols;      /* columns that are outputs: fewer than a panel's where n ends */
    const float* scale;  /* fl(x_scale * w_scale[j]) from the first column */
    const float* bias;   /* e->bias from the first column (a copy where n ends inside the panel); -0.0 for a
                          * layer without bias: fma(a, s, -0.0) and fl(a * s) + -0.0 are fl(a * s), zeros' signs
                          * included */
    int separate;        /* e->qnnpack: fl(fl(a * s) + bias), qnnpack's multiply then add, not the fma */
    int relu;            /* e->relu */
} i8_out;

/* The exact flavour, on every ISA: any u8 activations. */
#define T_TILE i8_tile_exact
#define T_TILE_ANY i8_tile_any_exact
#define T_ROW i8_row_exact
#define T_ROW_PART i8_row_part_exact
#define T_ROW_STREAM i8_row_stream_exact
#define T_FINISH i8_finish_exact
#if defined(I8_DEQUANTIZE)
#define T_DEQUANTIZE I8_DEQUANTIZE
#define I8_FUSES 1
#else
#define I8_FUSES 0
#endif
#define T_ROW_NV I8_ROW_NV
#define T_ACC i8_acc
#define T_W i8_w
#define T_X i8_x
#define T_COLS I8_COLS
#define T_ROWS I8_ROWS
#define T_LOADW I8_LOADW
#define T_SETX I8_SETX
#define T_DOT I8_DOT
#define T_STORE I8_STORE
#define T_LOADC I8_LOADC
#define T_OFFSET I8_OFFSET
#define T_ADD I8_ADD
#include "gemm_i8_tile.h"

/* A faster flavour for activations of at most 128 (every dynamic linear with reduce_range, every
 * static linear fed 7-bit activations), where the ISA has one (I8_U7_COLS). */
#if defined(I8_U7_COLS)
#define T_TILE i8_tile_u7
#define T_TILE_ANY i8_tile_any_u7
#define T_ROW i8_row_u7
#define T_ROW_PART i8_row_part_u7
#define T_ROW_STREAM i8_row_stream_u7
#define T_FINISH i8_finish_u7
#if defined(I8_U7_DEQUANTIZE)
#define T_DEQUANTIZE I8_U7_DEQUANTIZE
#define I8_U7_FUSES 1
#else
#define I8_U7_FUSES 0
#endif
#define T_ROW_NV I8_U7_ROW_NV
#define T_ACC i8u7_acc
#define T_W i8u7_w
#define T_X i8u7_x
#define T_COLS I8_U7_COLS
#define T_ROWS I8_U7_ROWS
#define T_LOADW I8_U7_LOADW
#define T_SETX I8_U7_SETX
#define T_DOT I8_U7_DOT
#define T_STORE I8_U7_STORE
#define T_LOADC I8_U7_LOADC
#define T_OFFSET I8_U7_OFFSET
#define T_ADD I8_U7_ADD
#include "gemm_i8_tile.h"
#endif

/* Where the ISA's exact product widens each weight in the loop (I8_WIDE: AVX2's vpmovsxbw, a port-5 shuffle for
 * every 2 vpmaddwd of a 2-row tile), a flavour that reads a panel's slice widened once into a buffer
 * (i8_widen), shared by all the row tiles of a block: its products take their weights straight from L1. Same
 * sums, same order; only where the weights come from differs. AVX2, 8-bit activations, one thread (shared
 * Sapphire Rapids VM): M=64 K=N=256 100 -> 75 us, M=32 K=64 N=512 39 -> 27 us, M=8 K=N=256 13.1 -> 10.9 us. */
#if defined(I8_WIDE)
#if I8_NR != QRT_STRIP
#error "the widened slice holds one strip"
#endif
#define T_TILE i8_tile_wide
#define T_TILE_ANY i8_tile_any_wide
#define T_FINISH i8_finish_wide
#if defined(I8_DEQUANTIZE)
#define T_DEQUANTIZE I8_DEQUANTIZE
#endif
#define T_ACC i8_acc
#define T_W i8_w
#define T_X i8_x
#define T_COLS I8_COLS
#define T_ROWS I8_WIDE_ROWS
#define T_LOADW I8_WIDE_LOADW
#define T_SETX I8_WIDE_SETX
#define T_XWORD I8_WIDE_XWORD
#define T_DOT I8_DOT
#define T_STORE I8_STORE
#define T_LOADC I8_LOADC
#define T_OFFSET I8_OFFSET
#define T_ADD I8_ADD
/* group g's 16 columns, 4 int16 each, in turn (byte offsets: the tile passes them to T_LOADW) */
#define T_AT(wide, ss, g, col) ((wide) + ((g) * QRT_STRIP + (col)) * 4 * (ptrdiff_t)sizeof(int16_t))
#define T_PREFETCH 0
#include "gemm_i8_tile.h"

/* Groups [g0, g1) of one strip's packed weights, each byte as an int16 in the same order: what I8_LOADW would
 * make of them, once for every tile that reads them. */
static void i8_widen(const int8_t* strip, ptrdiff_t g0, ptrdiff_t g1, int16_t* wide) {
    const int8_t* w = strip + g0 * QRT_STRIP * 4;
    for (ptrdiff_t t = 0; t < (g1 - g0) * QRT_STRIP * 4; t++)
        wide[t] = w[t];
}

/* n bytes of packed x, each as an int16 in the same place (i8_tile_wide's T_XWORD): once a call, where the tiles
 * read each of x's groups once per panel. */
static void i8_widen_x(const uint8_t* x, ptrdiff_t n, int16_t* wide) {
    for (ptrdiff_t t = 0; t < n; t++)
        wide[t] = x[t];
}
#endif

/* Cache blocking: a panel's slice of I8_KC k values (I8_NR * I8_KC bytes, 16 KiB) stays in L1
 * while up to I8_MC rows of x sweep it; their sums wait in c between slices. */
#ifndef I8_KC
#define I8_KC 256
#endif
#ifndef I8_MC
#define I8_MC (I8_MR * 16)
#endif

/* Static linear requantization of columns [j0, j0 + cols) of one row (NUMERICS.md): v = fl(a) plus the
 * folded bias, v + bias_q[j] (per-channel) or fma(bias[j], bias_inv, v) (per-tensor); then
 * clamp(sat_int16(rne(fl(v * mult[j]))) + zp, lo, 255). Fields are read into locals first: stores through
 * uint8_t* may alias anything, and the compiler would reload them at every element otherwise. */
QRT_INLINE void qrt_requantize_row(const qrt_epilogue* e, uint8_t* restrict out, const int32_t* restrict a,
                                   ptrdiff_t j0, const ptrdiff_t cols) {
    const float *restrict bias_q = e->bias_q, *restrict bias_t = e->bias_t, *restrict mult = e->mult + j0;
    const float bias_inv = e->bias_inv;
    const int32_t zp = e->zp, lo = e->lo;
    ptrdiff_t j = 0;
#if defined(I8_REQUANTIZE_COLS) /* the ISA's vector form of the loop below */
    for (; j + I8_REQUANTIZE_COLS <= cols; j += I8_REQUANTIZE_COLS)
        i8_requantize(a + j, mult + j, bias_q ? bias_q + j0 + j : NULL, bias_t ? bias_t + j0 + j : NULL, bias_inv, zp,
                      lo, out + j);
#endif
    for (; j < cols; j++) {
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
}

/* out[j] = relu(out[j]) for j < cols: gate_math.h's qrt_relu, torch.relu's NaN and -0.0 kept */
QRT_INLINE void qrt_relu_row(float* restrict out, const ptrdiff_t cols) {
    for (ptrdiff_t j = 0; j < cols; j++)
        out[j] = qrt_relu(out[j]);
}

/* Dynamic linear: y = fma(fl(a), fl(x_scale * w_scale[j]), bias[j]), or fl(a) * fl(x_scale * w_scale[j])
 * without bias, for columns [j0, j0 + cols) of one row; then relu(y) if relu (0 where y < 0). The scale product rounds
 * here as it would in a table made per call. */
QRT_INLINE void qrt_dequantize_row(const qrt_epilogue* e, float* restrict out, const int32_t* restrict a,
                                   ptrdiff_t j0, const ptrdiff_t cols) {
    const float *restrict w_scale = e->w_scale + j0, *restrict bias = e->bias;
    const float x_scale = e->x_scale;
    ptrdiff_t j;
    if (bias && e->qnnpack) /* qnnpack's q8gemm_dq: a multiply, then an add */
        for (j = 0; j < cols; j++)
            out[j] = (float)a[j] * (x_scale * w_scale[j]) + bias[j0 + j];
    else if (bias)
        for (j = 0; j < cols; j++)
            out[j] = fmaf((float)a[j], x_scale * w_scale[j], bias[j0 + j]);
    else
        for (j = 0; j < cols; j++)
            out[j] = (float)a[j] * (x_scale * w_scale[j]);
    if (e->relu)
        qrt_relu_row(out, cols);
}

/* Dynamic linear with per-row activation scales (torchao's Int8Tensor linear, NUMERICS.md): y = fl(fl(fl(a) * x_scale)
 * * w_scale[j]) + bias[j], in torchao's order (the product scaled by the row's scale, then by the column's, then
 * the bias added), for columns [j0, j0 + cols) of one row whose activation scale is x_scale; then relu(y) if relu. */
QRT_INLINE void qrt_dequantize_row_scaled(const qrt_epilogue* e, float* restrict out, const int32_t* restrict a,
                                          float x_scale, ptrdiff_t j0, const ptrdiff_t cols) {
    const float *restrict w_scale = e->w_scale + j0, *restrict bias = e->bias;
    ptrdiff_t j;
    if (bias)
        for (j = 0; j < cols; j++)
            out[j] = (float)a[j] * x_scale * w_scale[j] + bias[j0 + j];
    else
        for (j = 0; j < cols; j++)
            out[j] = (float)a[j] * x_scale * w_scale[j];
    if (e->relu)
        qrt_relu_row(out, cols);
}

/* Rows [i0, i1), columns [j0, j1), of the epilogue from the sums a (row i at a + (i - i0) * lda), one call
 * per block of rows: at small K a call per row cost as much as the row's products. The sums first get the
 * expansion's last term (qrt_gemm_u8s8), a -= w_zp[j] * x_rowsum[i], when x_rowsum is given. A whole
 * panel's row is a constant count, so its loop becomes straight vector code (AVX2's 16-column panels:
 * 10-15% of a static M=512 K=N=256 product). */
static void qrt_epilogue_rows(const qrt_epilogue* e, ptrdiff_t i0, ptrdiff_t i1, ptrdiff_t n, ptrdiff_t j0,
                              ptrdiff_t j1, int32_t* a, ptrdiff_t lda, const int32_t* w_zp, const int32_t* x_rowsum) {
    const ptrdiff_t cols = j1 - j0;
    for (ptrdiff_t i = i0; i < i1; i++) {
        int32_t* ai = a + (i - i0) * lda;
        if (x_rowsum)
            for (ptrdiff_t j = 0; j < cols; j++)
                ai[j] = (int32_t)((uint32_t)ai[j] - (uint32_t)w_zp[j0 + j] * (uint32_t)x_rowsum[i]);
        if (e->bias_i) /* qnnpack starts its sums at the int32 bias: the same as adding it here, modulo 2^32 */
            for (ptrdiff_t j = 0; j < cols; j++)
                ai[j] = (int32_t)((uint32_t)ai[j] + (uint32_t)e->bias_i[j0 + j]);
        if (e->acc)
            memcpy(e->acc + i * n + j0, ai, (size_t)cols * sizeof(int32_t));
        else if (e->q && cols == I8_NR)
            qrt_requantize_row(e, e->q + i * n + j0, ai, j0, I8_NR);
        else if (e->q)
            qrt_requantize_row(e, e->q + i * n + j0, ai, j0, cols);
        else if (e->x_scales)
            qrt_dequantize_row_scaled(e, e->y + i * n + j0, ai, e->x_scales[i], j0, cols);
        else if (cols == I8_NR)
            qrt_dequantize_row(e, e->y + i * n + j0, ai, j0, I8_NR);
        else
            qrt_dequantize_row(e, e->y + i * n + j0, ai, j0, cols);
    }
}

/* One row whose weights are at most I8_ROW_BYTES takes them all in passes of T_ROW_NV registers (T_ROW):
 * measured on Ice Lake, M=1 K=64 N=256 ran in 0.6-0.7x the time of panel tiles, and still faster up to
 * 64 KiB of weights, slower from 96 KiB (a pass streams up to 16 strips at once: from L2 the line fill
 * buffers run out). 32 KiB: weights in the L1 of every core qrt targets. */
#define I8_ROW_BYTES (32 * 1024)
#define I8_ROW_CHUNK 1024 /* columns a call of T_ROW takes (whole strips): 4 KiB of sums on the stack */

/* One row whose weights are past L1 but at most I8_STREAM_BYTES takes them a strip at a time (T_ROW_STREAM);
 * beyond, from L3 or DRAM, the panel tiles' few streams at once kept up with the memory better (Zen 5: K=1024
 * N=4096 in 37 us against 42 us a strip at a time; K=N=1024, 1 MiB, 7.3-7.8 against 6.9 us). */
#define I8_STREAM_BYTES (1024 * 1024)

/* Whether a product's tiles may put their sums to e's floats straight from the registers (i8_out): a dynamic
 * linear's outputs (not raw sums, not requantized), with no w_zp * rowsum(x) to subtract first, in a flavour
 * that has the ISA's one-register epilogue. */
static int i8_fused(const qrt_epilogue* e, const int32_t* x_rowsum, int small_x) {
    if (e->acc || e->q || x_rowsum || e->x_scales) /* per-row scales: through qrt_dequantize_row_scaled */
        return 0;
#if defined(I8_U7_COLS)
    if (small_x)
        return I8_U7_FUSES;
#else
    (void)small_x;
#endif
    return I8_FUSES;
}

/* out for columns [j0, j1) of e (y still to be set), its tables filled in (room for I8_NR each: scale, and
 * bias where e has none or n ends inside the panel, so a register's loads stay in the tables; the lanes past
 * j1 of the register where n ends, read but never stored, are 0) */
static i8_out i8_out_at(const qrt_epilogue* e, ptrdiff_t n, ptrdiff_t j0, ptrdiff_t j1, float* scale, float* bias) {
    const ptrdiff_t cols = j1 - j0, end = qrt_round_up(cols, QRT_STRIP);
    for (ptrdiff_t j = 0; j < cols; j++)
        scale[j] = e->x_scale * e->w_scale[j0 + j];
    const int copy = !e->bias || cols < I8_NR;
    if (copy)
        for (ptrdiff_t j = 0; j < cols; j++)
            bias[j] = e->bias ? e->bias[j0 + j] : -0.0f;
    for (ptrdiff_t j = cols; j < end; j++)
        scale[j] = bias[j] = 0.0f;
    i8_out out = {NULL, n, cols, scale, copy ? bias : e->bias + j0, e->qnnpack, e->relu};
    return out;
}

/* The part of qrt_gemm_u8s8's expansion that depends on the column only, for columns [0, n) of weights with row
 * sums w_rowsum and zero points w_zp, against x_zp: what each sum starts from. Symmetric weights (torch's
 * dynamic linears) need none of it: their sums start from w_rowsum[j] * (I8_XBIAS - x_zp) (i8_offsets below). */
static void qrt_i8_col_offset(int32_t x_zp, const int32_t* w_rowsum, const int32_t* w_zp, ptrdiff_t n, ptrdiff_t k,
                              int32_t* out) {
    uint32_t zx = (uint32_t)x_zp, kz = (uint32_t)k * zx;
    for (ptrdiff_t j = 0; j < n; j++)
        out[j] = (int32_t)(((uint32_t)I8_XBIAS - zx) * (uint32_t)w_rowsum[j] + kz * (uint32_t)w_zp[j]);
}

/* Where the sums of columns [j0, j0 + cols) start (qrt_gemm_u8s8's expansion), as init[col] * f: the weights'
 * row sums times I8_XBIAS - x_zp, multiplied in the registers that take them; with weight zero points, offsets
 * computed into start (room for cols), times 1. Columns past n start from 0. */
static const int32_t* i8_offsets(int32_t x_zp, const int32_t* w_rowsum, const int32_t* w_zp, ptrdiff_t n, ptrdiff_t k,
                                 ptrdiff_t j0, ptrdiff_t cols, int32_t* start, int32_t* f) {
    if (!w_zp) {
        *f = (int32_t)((uint32_t)I8_XBIAS - (uint32_t)x_zp);
        return w_rowsum + j0;
    }
    const ptrdiff_t real = n - j0 < cols ? n - j0 : cols;
    qrt_i8_col_offset(x_zp, w_rowsum + j0, w_zp + j0, real, k, start);
    memset(start + real, 0, (size_t)(cols - real) * sizeof(int32_t));
    *f = 1;
    return start;
}

/* Row i of x (group g at xrow + g * xs) against the columns of panels [p0, p1), to the epilogue e: in passes
 * of registers across strips (T_ROW), or a strip at a time (stream, T_ROW_STREAM). */
static void qrt_gemm_row(const uint8_t* xrow, ptrdiff_t xs, int small_x, int32_t x_zp, const int32_t* w_rowsum,
                         const int8_t* packed, const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k,
                         ptrdiff_t i, ptrdiff_t p0, ptrdiff_t p1, const qrt_epilogue* e) {
    /* strips wholly past n are padding, whose sums no one reads: a row stops at the strip holding column n - 1
     * (a 10-column layer reads one 16-column strip of avx512-vnni's 64-column panel, not four) */
    const ptrdiff_t kp = qrt_round_up(k, 4), last = p1 * I8_NR, end = last < n ? last : n;
    const ptrdiff_t stop = qrt_round_up(end, QRT_STRIP);
    const int stream = (stop - p0 * I8_NR) * kp > I8_ROW_BYTES;
    void (*row)(const uint8_t*, ptrdiff_t, const int8_t*, ptrdiff_t, ptrdiff_t, ptrdiff_t, const int32_t*, int32_t,
                int32_t*) = stream ? i8_row_stream_exact : i8_row_exact;
#if defined(I8_U7_COLS)
    if (small_x)
        row = stream ? i8_row_stream_u7 : i8_row_u7;
#else
    (void)small_x;
#endif
    int32_t c[I8_ROW_CHUNK], start[I8_ROW_CHUNK], f;
    for (ptrdiff_t j0 = p0 * I8_NR; j0 < end; j0 += I8_ROW_CHUNK) {
        const ptrdiff_t cols = stop - j0 < I8_ROW_CHUNK ? stop - j0 : I8_ROW_CHUNK;
        const int32_t* init = i8_offsets(x_zp, w_rowsum, w_zp, n, k, j0, cols, start, &f);
        row(xrow, xs, packed + j0 * kp, QRT_STRIP * kp, kp / 4, cols, init, f, c);
        qrt_epilogue_rows(e, i, i + 1, n, j0, j0 + cols < end ? j0 + cols : end, c, 0, w_zp, x_rowsum);
    }
}

/* acc[i][j] = sum_t (x[i][t] - x_zp) * (w[j][t] - w_zp[j]) in int32 (wrapping), for
 * rows [i0, i1) (i0 a multiple of I8_MR) and columns of panels [p0, p1) (clipped to n),
 * from x packed by qrt_i8_pack_x.
 *
 * Expanded as dot(x, w) + col_offset[j] - w_zp[j] * rowsum(x)[i], where col_offset holds
 * - x_zp * rowsum(w)[j] + k * x_zp * w_zp[j] (i8_offsets: w_rowsum holds rowsum(w), zero past n to a
 * whole QRT_I8_NPAD, which tiles read): the dot products start from it, so a sum needs no fixing
 * afterwards unless x_rowsum is given (it may be NULL when w_zp is, every w_zp being 0). All exact
 * modulo 2^32. Each result goes to the epilogue e (row stride n). Activations of at most 128 (small_x) take the faster flavour where the ISA has
 * one; both are exact, so the choice never changes a result. x_plain: xpacked is one row of x as it is
 * (i0 = 0, i1 = 1, k a multiple of 4), which needs no packing. */
static void qrt_gemm_u8s8(const uint8_t* xpacked, int32_t x_zp, const int32_t* w_rowsum, const int8_t* packed,
                          const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0,
                          ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, int small_x, int x_plain, const qrt_epilogue* e) {
    void (*tile)(const uint8_t*, ptrdiff_t, int, const int8_t*, ptrdiff_t, ptrdiff_t, ptrdiff_t, const int32_t*,
                 int32_t, int32_t*, const i8_out*) = i8_tile_any_exact;
#if defined(I8_U7_COLS)
    if (small_x)
        tile = i8_tile_any_u7;
#endif
    const int fused = i8_fused(e, x_rowsum, small_x);
    int32_t c[I8_MC * I8_NR], start[I8_NR], f;
#if defined(I8_WIDE)
    int16_t wide[I8_KC * QRT_STRIP]; /* a slice of the panel, widened (I8_WIDE) */
#endif
    float scale[I8_NR], bias[I8_NR];
    ptrdiff_t kp = qrt_round_up(k, 4), groups = kp / 4, xs = x_plain ? 4 : 4 * I8_MR, p, ib, ie, i, gb, j0, j1;
    const ptrdiff_t kx = qrt_round_up(k, I8_XALIGN); /* a packed row of x */
    const ptrdiff_t bytes = (p1 - p0) * I8_NR * kp; /* of the weights this call reads */
    if (i1 - i0 == 1 && kp >= 4 && bytes <= I8_STREAM_BYTES) {
        qrt_gemm_row(xpacked + i0 * kx, xs, small_x, x_zp, w_rowsum, packed, w_zp, x_rowsum, n, k, i0, p0, p1, e);
        return;
    }
#if defined(I8_WIDE)
    /* the rows widened once where blocks of more than I8_MR rows will read widened weights (i0 starts a row tile;
     * the rows to i1's tile end are packed); if memory runs out, their tiles widen in the loop as small blocks do */
    const ptrdiff_t xwide_n = (qrt_round_up(i1, I8_MR) - i0) * kx;
    int16_t* xwide = !small_x && i1 - i0 > I8_MR ? (int16_t*)malloc((size_t)xwide_n * sizeof(int16_t)) : NULL;
    if (xwide)
        i8_widen_x(xpacked + i0 * kx, xwide_n, xwide);
#endif
    /* K slices let a block of rows share a panel's slice in L1; one row reads each weight once: no slices */
    ptrdiff_t kc = i1 - i0 == 1 && groups ? groups : I8_KC / 4;
    for (p = p0; p < p1; p++) {
        const int8_t* panel = packed + p * I8_NR * kp;
        j0 = p * I8_NR;
        j1 = j0 + I8_NR < n ? j0 + I8_NR : n;
        const int32_t* init = i8_offsets(x_zp, w_rowsum, w_zp, n, k, j0, I8_NR, start, &f);
        i8_out out = fused ? i8_out_at(e, n, j0, j1, scale, bias) : (i8_out){0};
        for (ib = i0; ib < i1; ib += I8_MC) {
            ie = ib + I8_MC < i1 ? ib + I8_MC : i1;
            for (gb = 0; gb < groups || gb == 0; gb += kc) {
                ptrdiff_t ge = gb + kc < groups ? gb + kc : groups;
#if defined(I8_WIDE)
                /* widened weights pay where more than one row tile reads them: up to 6 rows, widening in the
                 * loop was as fast or faster (M=6 K=N=256: 1.80x u7's time against 1.88x; M=12: 1.77 against
                 * 1.70; M=64: 1.75 against 1.52), and still is with x widened too (M=4 K=N=1024: 73.5 against
                 * 84 us, M=6 108.6 against 113.6). Several rows: kc is I8_KC / 4, what the buffer holds. */
                const int widen = xwide && ie - ib > I8_MR;
                if (widen)
                    i8_widen(panel, gb, ge, wide);
#endif
                for (i = ib; i < ie; i += I8_MR) {
                    const int rows = (int)(ie - i < I8_MR ? ie - i : I8_MR);
                    const int32_t* first = gb == 0 ? init : NULL;
                    int32_t* ci = c + (i - ib) * I8_NR;
                    if (fused) /* the last slice's sums are outputs */
                        out.y = e->y + i * n + j0;
                    const i8_out* o = fused && ge == groups ? &out : NULL;
#if defined(I8_WIDE)
                    if (widen) { /* the slice's groups count from 0 in the buffer */
                        i8_tile_any_wide((const uint8_t*)(xwide + (i - i0) * kx + gb * xs), xs, rows,
                                         (const int8_t*)wide, 0, 0, ge - gb, first, f, ci, o);
                        continue;
                    }
#endif
                    tile(xpacked + i * kx, xs, rows, panel, QRT_STRIP * kp, gb, ge, first, f, ci, o);
                }
            }
            if (!fused)
                qrt_epilogue_rows(e, ib, ie, n, j0, j1, c, I8_NR, w_zp, x_rowsum);
        }
    }
#if defined(I8_WIDE)
    free(xwide);
#endif
}
