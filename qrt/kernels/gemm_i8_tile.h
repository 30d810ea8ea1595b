/* One tile flavour of the int8 product, included by gemm_i8.h once per flavour (no include guard).
 * Expects the flavour's primitives as T_* macros (see isa/i8_avx2.h for both flavours):
 *   T_TILE, T_TILE_ANY  names of the two functions defined here
 *   T_ACC, T_W, T_X     accumulator, weight and broadcast x types
 *   T_COLS, T_ROWS      columns per accumulator; most rows one call keeps in registers
 *   T_ROW, T_ROW_PART, T_ROW_STREAM  names of the one-row functions; T_ROW_NV: accumulators a one-row pass keeps
 *   T_LOADW(p), T_SETX(word), T_DOT(acc, x, w), T_STORE(out, acc), T_LOADC(p), T_ADD(a, b) (a + b, lane by lane)
 *   T_OFFSET(p, f)      where a sum starts: p[col] * f (wrapping), in the accumulator's form
 *   T_DEQUANTIZE(y, acc, scale, bias, separate, relu, lanes)  optional: the dynamic linear's epilogue on one
 *                       accumulator (i8_out), its first `lanes` outputs stored
 *   T_AT(panel, ss, g, col)  optional: where T_LOADW finds a group's columns (I8_AT: the packed layout)
 *   T_PREFETCH          optional, 0: the tiles ask for no weights ahead (weights already in L1)
 *   T_XWORD             optional, uint64_t: the tiles read x widened to int16 (8 bytes a row's group of 4 k),
 *                       T_SETX taking that word; by default uint32_t, x's packed bytes (which the one-row
 *                       functions always read, as they read I8_AT's weights whatever T_AT says)
 * and undefines them at the end. Without T_ROW, only the tiles are defined.
 */
#define T_NV (I8_NR / T_COLS)
#define T_STRIP_NV (QRT_STRIP / T_COLS)
#if QRT_STRIP % T_COLS
#error "a register's columns must lie in one strip"
#endif
#if defined(T_ROW) && (T_ROW_NV * T_COLS % QRT_STRIP || T_ROW_NV > 16)
#error "a one-row pass must cover whole strips"
#endif
#if T_ROWS > 6
#error "T_TILE_ANY's switch runs at most 6 rows a call: rows past them would be skipped"
#endif
#ifndef QRT_I8_PREFETCH
/* bytes ahead, a page: from DRAM, 1 KiB ahead left Zen 5's M=8 K=N=4096 products 1.3-1.7x slower than from
 * cache (avx2 1.41 ms cold, 1.09 warm; avx-vnni 1.14, 0.65); 4 KiB ahead, 1.08 and 0.74 cold, and no slower
 * warm at M = 1, 8 or 64 on any x86 variant (8 KiB: avx512-vnni M=8 slower again) */
#define QRT_I8_PREFETCH 4096
#endif
#ifndef I8_ROW_PREFETCH
#define I8_ROW_PREFETCH 1 /* whether one-row tiles prefetch too */
#endif
#ifndef T_AT
#define T_AT I8_AT
#endif
#ifndef T_PREFETCH
#define T_PREFETCH 1
#endif
#ifndef T_XWORD
#define T_XWORD uint32_t
#endif
/* x's bytes per packed byte: 1, or 2 where T_XWORD holds 4 values widened to int16 */
#define T_XSCALE ((ptrdiff_t)sizeof(T_XWORD) / 4)

/* Independent sums per output for a tile of mr rows: a product's latency (vpdpbusd: 5 cycles) bounds a
 * tile with few accumulators, so a tile of few rows keeps 2 or 4 sums per output over alternate k groups
 * and adds them at the end. Integer sums are exact modulo 2^32 in any order: the result is the same. */
#ifndef T_SUMS
#define T_SUMS(mr) ((mr) * T_NV >= 8 ? 1 : (mr) * T_NV >= 4 ? 2 : 4)
#endif

/* The finished sums of row r, columns [col, col + T_COLS) of a tile: into c (c[col]), or, with out, as the
 * dynamic linear's floats straight from the register (only a flavour with T_DEQUANTIZE is given out), none
 * past out's columns. */
QRT_INLINE void T_FINISH(const i8_out* out, ptrdiff_t r, ptrdiff_t col, T_ACC acc, int32_t* c) {
#if defined(T_DEQUANTIZE)
    if (out) {
        float* y = out->y + r * out->ldy + col;
        if (col + T_COLS <= out->cols) /* a whole register: the lane count a constant, a plain store */
            T_DEQUANTIZE(y, acc, out->scale + col, out->bias + col, out->separate, out->relu, T_COLS);
        else if (col < out->cols)
            T_DEQUANTIZE(y, acc, out->scale + col, out->bias + col, out->separate, out->relu, (int)(out->cols - col));
        return;
    }
#else
    (void)out;
    (void)r;
    (void)col;
#endif
    T_STORE(c, acc);
}

/* c[r][col] = start[col] + sum over the k of groups [g0, g1) of (x[r][t] - I8_XBIAS) * panel column col,
 * for the r < mr rows of one x tile: row r's group g at xtile + (g * xs + 4 * r) * T_XSCALE; the panel's strips are
 * ss bytes apart (where T_AT reads them so); start is init[col] * f (one row, shared by all rows) or, when init is
 * NULL, c itself (continuing an earlier slice). c rows are I8_NR apart; with out (the last slice), the rows go to out
 * instead. */
QRT_INLINE void T_TILE(const uint8_t* xtile, ptrdiff_t xs, const int mr, const int8_t* panel, ptrdiff_t ss,
                       ptrdiff_t g0, ptrdiff_t g1, const int32_t* init, int32_t f, int32_t* c, const i8_out* out) {
    static const int32_t zeros[I8_NR];
    const int sums = T_SUMS(mr);
    T_ACC acc[4][T_ROWS][T_NV], start[T_NV];
    ptrdiff_t g;
    int r, v, s;
    (void)ss; /* where T_AT has no use for it */
    if (init)
        QRT_UNROLL for (v = 0; v < T_NV; v++)
            start[v] = T_OFFSET(init + v * T_COLS, f);
    QRT_UNROLL for (r = 0; r < T_ROWS; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < T_NV; v++) {
                acc[0][r][v] = init ? start[v] : T_LOADC(c + r * I8_NR + v * T_COLS);
                QRT_UNROLL for (s = 1; s < sums; s++)
                    acc[s][r][v] = T_LOADC(zeros);
            }
    for (g = g0; g < g1; g += sums) {
        QRT_UNROLL for (s = 0; s < sums; s++) {
            if (s > 0 && g + s >= g1)
                break;
            /* the weights stream from memory when few rows share them: ask for them ahead of the hardware
             * prefetcher, which stops at each 4 KiB page (one row too, unless the ISA says otherwise) */
            if (T_PREFETCH && (mr > 1 || I8_ROW_PREFETCH))
                QRT_UNROLL for (v = 0; v < I8_NR; v += QRT_STRIP)
                    __builtin_prefetch(T_AT(panel, ss, g + s, v) + QRT_I8_PREFETCH);
            T_W w[T_NV];
            QRT_UNROLL for (v = 0; v < T_NV; v++)
                w[v] = T_LOADW(T_AT(panel, ss, g + s, v * T_COLS));
            QRT_UNROLL for (r = 0; r < T_ROWS; r++) {
                if (r < mr) {
                    T_XWORD word;
                    memcpy(&word, xtile + ((g + s) * xs + r * 4) * T_XSCALE, sizeof(word));
                    T_X xr = T_SETX(word);
                    QRT_UNROLL for (v = 0; v < T_NV; v++)
                        acc[s][r][v] = T_DOT(acc[s][r][v], xr, w[v]);
                }
            }
        }
    }
    const i8_out o = out ? *out : (i8_out){0}; /* a local copy: no store to y can change its fields */
    QRT_UNROLL for (r = 0; r < T_ROWS; r++)
        if (r < mr)
            QRT_UNROLL for (v = 0; v < T_NV; v++) {
                QRT_UNROLL for (s = 1; s < sums; s++)
                    acc[0][r][v] = T_ADD(acc[0][r][v], acc[s][r][v]);
                T_FINISH(out ? &o : NULL, r, v * T_COLS, acc[0][r][v], c + r * I8_NR + v * T_COLS);
            }
}

#if defined(T_ROW)
/* One row against nv registers of columns from `strips` on (strips ss bytes apart; nv a constant once
 * inlined): c[col] = init[col] * f + sum over the k of `groups` groups of (x[t] - I8_XBIAS) * w[col][t], the
 * row's group g at x + g * xs. Fewer than 8 registers keep 8 / nv sums each over alternate groups, added
 * at the end, as T_TILE does: 8 chains at least (avx512-vnni K=512 N=10, one register: 0.15 -> 0.06 us). */
QRT_INLINE void T_ROW_PART(const uint8_t* x, ptrdiff_t xs, const int8_t* strips, ptrdiff_t ss, ptrdiff_t groups,
                           const int nv, const int32_t* init, int32_t f, int32_t* c) {
    static const int32_t zeros[T_COLS];
    const int sums = nv >= 8 ? 1 : 8 / nv;
    T_ACC acc[8][T_ROW_NV];
    int v, s;
    QRT_UNROLL for (v = 0; v < nv; v++) {
        acc[0][v] = T_OFFSET(init + v * T_COLS, f);
        QRT_UNROLL for (s = 1; s < sums; s++)
            acc[s][v] = T_LOADC(zeros);
    }
    for (ptrdiff_t g = 0; g < groups; g += sums)
        QRT_UNROLL for (s = 0; s < sums; s++) {
            if (s > 0 && g + s >= groups)
                break;
            uint32_t word;
            memcpy(&word, x + (g + s) * xs, 4);
            T_X xr = T_SETX(word);
            QRT_UNROLL for (v = 0; v < nv; v++)
                acc[s][v] = T_DOT(acc[s][v], xr, T_LOADW(I8_AT(strips, ss, g + s, v * T_COLS)));
        }
    QRT_UNROLL for (v = 0; v < nv; v++) {
        QRT_UNROLL for (s = 1; s < sums; s++)
            acc[0][v] = T_ADD(acc[0][v], acc[s][v]);
        T_STORE(c + v * T_COLS, acc[0][v]);
    }
}

/* The same for `cols` columns (whole strips), T_ROW_NV registers at a time across panel boundaries (a
 * panel's strips follow the previous panel's), the rest in passes of 8, 4, 2 and 1 registers: a one-row
 * product keeps as many independent sums as the registers hold, not a panel's few. */
static void T_ROW(const uint8_t* x, ptrdiff_t xs, const int8_t* strips, ptrdiff_t ss, ptrdiff_t groups,
                  ptrdiff_t cols, const int32_t* init, int32_t f, int32_t* c) {
    ptrdiff_t c0 = 0;
    for (; c0 + T_ROW_NV * T_COLS <= cols; c0 += T_ROW_NV * T_COLS)
        T_ROW_PART(x, xs, strips + c0 / QRT_STRIP * ss, ss, groups, T_ROW_NV, init + c0, f, c + c0);
    QRT_UNROLL for (int nv = 8; nv >= 1; nv /= 2)
        if (nv < T_ROW_NV && nv * T_COLS % QRT_STRIP == 0 && cols - c0 >= nv * T_COLS) {
            T_ROW_PART(x, xs, strips + c0 / QRT_STRIP * ss, ss, groups, nv, init + c0, f, c + c0);
            c0 += nv * T_COLS;
        }
}

/* The same, one strip (16 columns) at a time, straight through its k (T_ROW_PART: 8 sums over alternate
 * groups where the strip is fewer than 8 registers): the core reads one stream of weights, which the hardware
 * prefetcher follows from L2, where a pass over many strips at once reads as many streams (one row, K=256
 * N=512, 128 KiB of weights, Zen 5 avx512-vnni: 0.93-0.97 us in panels, 0.75 us so, the streaming floor 0.67). */
static void T_ROW_STREAM(const uint8_t* x, ptrdiff_t xs, const int8_t* strips, ptrdiff_t ss, ptrdiff_t groups,
                         ptrdiff_t cols, const int32_t* init, int32_t f, int32_t* c) {
    for (ptrdiff_t c0 = 0; c0 < cols; c0 += QRT_STRIP)
        T_ROW_PART(x, xs, strips + c0 / QRT_STRIP * ss, ss, groups, T_STRIP_NV, init + c0, f, c + c0);
}

#endif /* T_ROW */

/* The mr rows of a tile in calls of at most T_ROWS rows, each with its row count a constant, so the
 * accumulators live in registers. out (or NULL): as T_TILE's, for the tile's first row. */
static void T_TILE_ANY(const uint8_t* xtile, ptrdiff_t xs, int mr, const int8_t* panel, ptrdiff_t ss, ptrdiff_t g0,
                       ptrdiff_t g1, const int32_t* init, int32_t f, int32_t* c, const i8_out* out) {
    for (int r0 = 0; r0 < mr; r0 += T_ROWS) {
        const uint8_t* xt = xtile + r0 * 4 * T_XSCALE;
        int32_t* cr = c + r0 * I8_NR;
        i8_out o;
        if (out) { /* the same columns, r0 rows further down */
            o = *out;
            o.y += r0 * o.ldy;
        }
        const i8_out* ro = out ? &o : NULL;
        switch (mr - r0 < T_ROWS ? mr - r0 : T_ROWS) {
        case 1: T_TILE(xt, xs, 1, panel, ss, g0, g1, init, f, cr, ro); break;
        case 2: T_TILE(xt, xs, 2, panel, ss, g0, g1, init, f, cr, ro); break;
        case 3: T_TILE(xt, xs, 3, panel, ss, g0, g1, init, f, cr, ro); break;
        case 4: T_TILE(xt, xs, 4, panel, ss, g0, g1, init, f, cr, ro); break;
        case 5: T_TILE(xt, xs, 5, panel, ss, g0, g1, init, f, cr, ro); break;
        default: T_TILE(xt, xs, 6, panel, ss, g0, g1, init, f, cr, ro); break;
        }
    }
}

#undef T_NV
#undef T_STRIP_NV
#undef T_ROW
#undef T_ROW_PART
#undef T_ROW_STREAM
#undef T_ROW_NV
#undef T_SUMS
#undef T_TILE
#undef T_TILE_ANY
#undef T_FINISH
#undef T_DEQUANTIZE
#undef T_ACC
#undef T_W
#undef T_X
#undef T_COLS
#undef T_ROWS
#undef T_LOADW
#undef T_SETX
#undef T_DOT
#undef T_STORE
#undef T_LOADC
#undef T_OFFSET
#undef T_ADD
#undef T_AT
#undef T_PREFETCH
#undef T_XWORD
#undef T_XSCALE
