/* The float32 x float16 -> float32 product as fbgemm's AVX-512 kernel rounds it, generic over the
 * primitives of one ISA (isa/f16_*.h); float32 weights (linear_float) take the same order.
 *
 * Each output is one fma chain over k in order (an explicit fused multiply-add per product, so
 * every ISA rounds alike); in the last partial block of 32 output columns, when K > 512, the chain
 * restarts every 512 k and the block sums are added with plain float adds (docs/NUMERICS.md).
 * Weights are packed once, by whoever wrote them, in the strips of layout.h (16 columns, each k's 16
 * values together) as float16 bits (`half`) or float32 values; a panel of F_NR columns is F_NR / 16
 * strips side by side.
 *
 * Included once per variant (variant.h); everything here is static to that variant.
 */
#include "layout.h"

#define F_NV (F_NR / F_LANES)
#define QRT_F16_BLOCK 512 /* fbgemm restarts the chain every 512 k in its tail block */
#define QRT_F16_TAIL 32   /* ... the last partial block of 32 output columns */

#if QRT_FP_NPAD % F_NR || F_NR % QRT_STRIP
#error "a panel must be whole strips, and whole panels must cover the padded columns"
#endif
#if F_ROW_NV * F_LANES % F_NR
#error "a one-row pass must cover whole panels"
#endif

/* Bytes per packed weight: float16 bits (half) or float32. */
static inline ptrdiff_t qrt_fp_wsize(int half) { return half ? 2 : 4; }

/* The packed weight of column `col` of a panel (strips ws weights apart) at k index t. */
#define F_AT(w, ws, t, col) ((w) + ((col) / QRT_STRIP) * (ws) + (t) * QRT_STRIP + (col) % QRT_STRIP)

/* Row tiles: m rows make f_tiles(m) tiles of near-equal height, tile j rows [f_tile_row(j), f_tile_row(j + 1)),
 * at most F_MR and (once m > F_MR) at least F_MR / 2. A remainder tile of one or two rows would keep too few
 * fma chains in flight to hide the latency (AVX2 M=8 K=N=4096 on Zen 5 as 6 + 2 rows: 3.2 ms; as 4 + 4:
 * 2.7 ms). */
static inline ptrdiff_t f_tiles(ptrdiff_t m) { return (m + F_MR - 1) / F_MR; }
static inline ptrdiff_t f_tile_row(ptrdiff_t j, ptrdiff_t m) { return j * m / f_tiles(m); }

/* Floats of packed x for m x k. */
static inline ptrdiff_t qrt_fp_packed_x_size(ptrdiff_t m, ptrdiff_t k) { return m * k; }

/* x[m][k] -> row tiles in turn, tile j (its rows from r0 = f_tile_row(j) on) at r0 * k, each k's values
 * of its rows together (one stream per tile; rows 4*K bytes apart would share L1 sets when K is a
 * multiple of 1024). */
static void qrt_fp_pack_x(const float* x, ptrdiff_t m, ptrdiff_t k, float* out) {
    for (ptrdiff_t j = 0; j < f_tiles(m); j++) {
        const ptrdiff_t r0 = f_tile_row(j, m), rows = f_tile_row(j + 1, m) - r0;
        float* tile = out + r0 * k;
        for (ptrdiff_t t = 0; t < k; t++)
            for (ptrdiff_t r = 0; r < rows; r++)
                tile[t * rows + r] = x[(r0 + r) * k + t];
    }
}

/* For the mr rows of a packed x tile, over `count` k from those at xt and w: the fma chain
 * of x[r][t] * w[col][t] in k order into c[r][col] (rows F_NR apart). w is the panel's
 * packed weights (strips ws weights apart), float16 bits or (wide) float32.
 *   plain panels: the chain goes on from c (from 0 when `first`), so slices of k in turn make the one
 *   chain over all of k: a float stored and loaded again is the same float;
 *   blocked panels (the tail quirk; the k are one 512 block): c = (first ? 0 : c) + chain from 0, a
 *   plain float add. */
QRT_INLINE void f_tile(const float* xt, const int mr, const void* w, ptrdiff_t ws, const int wide, ptrdiff_t count,
                       int first, int blocked, float* c) {
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
            wv[v] = wide ? F_LOADF(F_AT((const float*)w, ws, t, v * F_LANES))
                         : F_LOADW(F_AT((const uint16_t*)w, ws, t, v * F_LANES));
        QRT_UNROLL for (r = 0; r < F_MR; r++) {
            if (r < mr) {
                f_vec xr = F_SET1(xt[t * mr + r]);
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
#define F_TILE_MR(R) f_tile(xt, R, w, ws, wide, count, first, blocked, c)
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

static void f_tile_any(const float* xt, int mr, const void* w, ptrdiff_t ws, int wide_, ptrdiff_t count, int first,
                       int blocked, float* c) {
    if (wide_)
        F_TILE_WIDE(1);
    else
        F_TILE_WIDE(0);
}

/* One row against F_ROW_NV registers of columns from `w` on (strips ws weights apart, across panel
 * boundaries: a panel's strips follow the previous panel's), over all k: c[col] = chain(x, w[col]). A
 * row's tile keeps only F_NV chains, too few to hide the fma's latency (AVX2 M=1 K=N=4096: 0.5x torch on
 * Zen 4); each output is still one chain in k order, so the bits are the same. */
QRT_INLINE void f_row(const float* x, const void* w, ptrdiff_t ws, const int wide, ptrdiff_t k, float* c) {
    f_vec acc[F_ROW_NV];
    QRT_UNROLL for (int v = 0; v < F_ROW_NV; v++)
        acc[v] = F_ZERO();
    for (ptrdiff_t t = 0; t < k; t++) {
        f_vec xr = F_SET1(x[t]);
        QRT_UNROLL for (int v = 0; v < F_ROW_NV; v++)
            acc[v] = F_FMA(xr,
                           wide ? F_LOADF(F_AT((const float*)w, ws, t, v * F_LANES))
                                : F_LOADW(F_AT((const uint16_t*)w, ws, t, v * F_LANES)),
                           acc[v]);
    }
    QRT_UNROLL for (int v = 0; v < F_ROW_NV; v++)
        F_STORE(c + v * F_LANES, acc[v]);
}

/* Whether the panel at column j0 lies in the tail quirk's block, whose chains restart every 512 k (F_NR
 * divides 32, so a panel lies wholly inside or outside it). */
static inline int f_blocked(ptrdiff_t j0, ptrdiff_t tail_start, ptrdiff_t k) {
    return j0 >= tail_start && k > QRT_F16_BLOCK;
}

/* y[j] = c[j - j0] for j in [j0, j1), + bias[j] (a separate float add) when there is a bias. */
QRT_INLINE void f_store_row(float* y, const float* c, const float* bias, ptrdiff_t j0, ptrdiff_t j1) {
    for (ptrdiff_t j = j0; j < j1; j++)
        y[j] = bias ? c[j - j0] + bias[j] : c[j - j0];
}

/* Cache blocking: blocks of F_MT row tiles are the outer loop, so a block of x stays in L2 while every
 * panel passes it; a panel (K x F_NR weights) stays in L2 while the block's row tiles run over it, each
 * tile's chains over the whole of k in registers.
 *
 * Widening (`widen` > 0, at most QRT_F16_WIDEN_MAX): a plain float16 panel is widened to float32 a slice
 * of `widen` k at a time, into L1, once for the F_WIDEN_TILES or more row tiles of the block that read
 * it, each tile's chains going on from c between slices. Where the float16 conversion takes the fma's
 * ports (Intel) that is up to 1.27x faster at 32 rows and more; where it has ports of its own (AMD) a
 * scheme of the same kind ran slower (Zen 5, AVX2: M=512 K=N=4096 140 -> 155 ms). Who calls chooses
 * (qrt_fp_widen_default; docs/PERFORMANCE.md, "float16 weights widened once"). */
#define F_MT 16
#define F_WIDEN_TILES 4 /* shared by fewer tiles, widening cost more than it saved (16 and 24 rows) */

/* The float16 weights of a panel (strips ws apart) at k [kb, kb + count) as float32, strips QRT_STRIP *
 * count apart: a float16 widens to float32 exactly. */
static void f_widen(const uint16_t* panel, ptrdiff_t ws, ptrdiff_t kb, ptrdiff_t count, float* out) {
    for (int s = 0; s < F_NR / QRT_STRIP; s++)
        for (ptrdiff_t t = 0; t < count; t++)
            QRT_UNROLL for (int v = 0; v < QRT_STRIP / F_LANES; v++)
                F_STORE(out + (s * count + t) * QRT_STRIP + v * F_LANES,
                        F_LOADW(panel + s * ws + (kb + t) * QRT_STRIP + v * F_LANES));
}

/* y[i][j] = chain(x[i], w[j]) (+ bias[j], a separate float add) for the rows of row tiles [t0, t1) of
 * the m rows and panels [p0, p1), from x packed by qrt_fp_pack_x and weights packed by qrt_fp_pack
 * with the same `half`; float16 weights widened `widen` k at a time (0: never), as above. */
static void qrt_gemm_fp(const float* xpacked, const void* packed, int half, const float* bias, ptrdiff_t n,
                        ptrdiff_t k, ptrdiff_t m, ptrdiff_t t0, ptrdiff_t t1, ptrdiff_t p0, ptrdiff_t p1, float* y,
                        ptrdiff_t ldy, ptrdiff_t widen) {
    float c[F_MT * F_MR * F_NR]; /* a block's tile j: rows F_MR * j on, F_NR apart */
    float wide[QRT_F16_WIDEN_MAX * F_NR];
    const ptrdiff_t wsize = qrt_fp_wsize(half);
    ptrdiff_t tail_start = n - n % QRT_F16_TAIL, p, jb, je, j, r, kb, c0, c1, row0[F_MT + 1];
    if (m == 1) { /* one row: whole passes of F_ROW_NV registers, until the tail quirk's block */
        const ptrdiff_t per = F_ROW_NV * F_LANES / F_NR;
        for (; p0 + per <= p1 && !f_blocked((p0 + per - 1) * F_NR, tail_start, k); p0 += per) {
            c0 = p0 * F_NR;
            c1 = c0 + per * F_NR < n ? c0 + per * F_NR : n;
            f_row(xpacked, (const char*)packed + c0 * k * wsize, QRT_STRIP * k, wsize == 4, k, c);
            f_store_row(y, c, bias, c0, c1);
        }
    }
    for (jb = t0; jb < t1; jb += F_MT) {
        je = jb + F_MT < t1 ? jb + F_MT : t1;
        for (j = jb; j <= je; j++) /* the block's tiles: tile j holds rows [row0[j - jb], row0[j - jb + 1]) */
            row0[j - jb] = f_tile_row(j, m);
        for (p = p0; p < p1; p++) {
            const char* panel = (const char*)packed + p * F_NR * k * wsize; /* strips QRT_STRIP * k apart */
            c0 = p * F_NR;
            c1 = c0 + F_NR < n ? c0 + F_NR : n;
            int blocked = f_blocked(c0, tail_start, k);
            int widened = half && !blocked && widen > 0 && widen <= QRT_F16_WIDEN_MAX && je - jb >= F_WIDEN_TILES;
            ptrdiff_t slice = blocked ? QRT_F16_BLOCK : widened ? widen : k > 0 ? k : 1; /* 1: a pass when k is 0 */
            for (kb = 0; kb < k || kb == 0; kb += slice) {
                ptrdiff_t ke = kb + slice < k ? kb + slice : k;
                const void* w = panel + kb * QRT_STRIP * wsize; /* the slice's weights, strips ws apart */
                ptrdiff_t ws = QRT_STRIP * k;
                if (widened) {
                    f_widen((const uint16_t*)panel, ws, kb, ke - kb, wide);
                    w = wide;
                    ws = QRT_STRIP * (ke - kb);
                }
                for (j = 0; j < je - jb; j++) {
                    const ptrdiff_t rows = row0[j + 1] - row0[j];
                    f_tile_any(xpacked + row0[j] * k + kb * rows, (int)rows, w, ws, widened || wsize == 4, ke - kb,
                               kb == 0, blocked, c + j * F_MR * F_NR);
                }
            }
            for (j = 0; j < je - jb; j++)
                for (r = 0; r < row0[j + 1] - row0[j]; r++)
                    f_store_row(y + (row0[j] + r) * ldy, c + (j * F_MR + r) * F_NR, bias, c0, c1);
        }
    }
}
