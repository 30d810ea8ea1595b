/* The int8 product on AMX tiles (isa/i8_amx.h) for whole row tiles of x, gemm_i8.h's avx512-vnni product for
 * the rest: the same sums (tdpbusd and vpdpbusd both add exact u8 x s8 products into int32, modulo 2^32 in
 * any order), started from the same column offsets and finished by the same epilogue (qrt_epilogue_rows), so
 * the same bits.
 *
 * x is packed in tiles of I8_MR = 16 rows, each row's k padded to kx, a multiple of 64, with zeros. A tile
 * of at least I8_AMX_ROWS rows is laid out as AMX reads it: blocks of 64 k, each 16 rows x 64 bytes (one tile
 * register, 1 KiB in a row); a tile of fewer (a last tile of one row) as gemm_i8.h packs it, for
 * avx512-vnni's register tiles. The weights keep the one layout (layout.h): a strip's 16
 * groups of 4 k x 16 columns, 64 bytes each, are what tdpbusd takes as its second tile. The packed x starts
 * at the first 64-byte boundary of its buffer, so that each tile row is one cache line.
 *
 * Tile registers (palette 1, every tile 16 rows x 64 bytes): sums 0-3, x 4-5, weights 6-7. The OS grants
 * the tile state per process (dispatch.c); its configuration is per thread, loaded at each call and
 * released at its end, so no thread leaves state behind for the OS to save.
 */

/* Rows a tile needs to go to AMX: a tile costs the same at any number of rows, and from 2 rows on it beat
 * avx512-vnni's registers (K=N=1024: M=2 9.7 against 12.0 us, M=8 10.8 against 26.5; K=N=256 M=2 0.7 against
 * 0.8); one row reads its weights once either way, and avx512-vnni's one-row passes do that faster (7.8
 * against 9.5 us). */
#define I8_AMX_ROWS 2
#define I8_AMX_BLOCK 1024 /* bytes of one tile register: 16 rows x 64 bytes */
/* A task's rows: i8_amx_rows' blocks of 32 rows, in which each weight tile loaded serves two x tiles; tasks
 * of 16 rows loaded the weights twice as often (a dynamic linear on 2 threads, M=128 K=N=384: 24 -> 17-18 us;
 * K=384 N=1536: 48-52 -> 43-45 us). */
#define I8_TASK_ROWS 32

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
} i8_amx_config;

static uint8_t* i8_amx_base(const uint8_t* buffer) {
    return (uint8_t*)(((uintptr_t)buffer + 63) & ~(uintptr_t)63);
}

static ptrdiff_t qrt_i8_amx_packed_x_size(ptrdiff_t m, ptrdiff_t k) {
    return qrt_i8_packed_x_size(m, k) + 63; /* room to start on a cache line */
}

/* Rows [i0, i0 + rows) of x into an AMX tile: row r's k [64 b, 64 b + 64) at block b, row r. */
static void i8_amx_pack_tile(uint8_t* tile, const uint8_t* x, ptrdiff_t k, ptrdiff_t i0, int rows) {
    for (int r = 0; r < rows; r++) {
        const uint8_t* row = x + (i0 + r) * k;
        ptrdiff_t t = 0;
        for (; t + 64 <= k; t += 64) /* a constant size: one vector copy */
            memcpy(tile + t / 64 * I8_AMX_BLOCK + r * 64, row + t, 64);
        memcpy(tile + t / 64 * I8_AMX_BLOCK + r * 64, row + t, (size_t)(k - t));
    }
}

/* x[m][k] -> tiles of 16 rows, each as the product reads it (above). Returns the largest value of x. */
static int qrt_i8_amx_pack_x(const uint8_t* x, ptrdiff_t m, ptrdiff_t k, uint8_t* out) {
    uint8_t* base = i8_amx_base(out);
    const ptrdiff_t kx = qrt_round_up(k, I8_XALIGN);
    if (m % I8_MR || k % I8_XALIGN)
        memset(base, 0, (size_t)qrt_i8_packed_x_size(m, k));
    for (ptrdiff_t i0 = 0; i0 < m; i0 += I8_MR) {
        const int rows = (int)(m - i0 < I8_MR ? m - i0 : I8_MR);
        if (rows >= I8_AMX_ROWS)
            i8_amx_pack_tile(base + i0 * kx, x, k, i0, rows);
        else
            i8_pack_tile(base + i0 * kx, x, k, i0, rows);
    }
    return i8_largest(x, m * k);
}

/* Rows [i0, i0 + rows) of float x quantized into an AMX tile as i8_amx_pack_tile lays q out: each whole 64 k a
 * constant span, whose quantization inlines as straight vector code. */
static void i8_amx_quantize_tile(uint8_t* tile, const float* x, ptrdiff_t k, ptrdiff_t i0, int rows,
                                 const i8_qparams* z) {
    for (int r = 0; r < rows; r++) {
        const float* row = x + (i0 + r) * k;
        ptrdiff_t t = 0;
        if (z->round_first)
            for (; t + 64 <= k; t += 64)
                qrt_quantize_span(row + t, 64, z->inv, z->zp, 1, tile + t / 64 * I8_AMX_BLOCK + r * 64);
        else
            for (; t + 64 <= k; t += 64)
                qrt_quantize_span(row + t, 64, z->inv, z->zp, 0, tile + t / 64 * I8_AMX_BLOCK + r * 64);
        qrt_quantize_span(row + t, k - t, z->inv, z->zp, z->round_first, tile + t / 64 * I8_AMX_BLOCK + r * 64);
    }
}

/* qrt_i8_amx_pack_x of x quantized by qrt_quantize_u8 (inv, zp, round_first), without q in memory: one pass
 * over x after its range where quantize, pack and largest took three (a dynamic linear on one thread, M=128
 * K=1536 N=384: 107 -> 96 us). */
static void qrt_i8_amx_quantize_pack_x(const float* x, ptrdiff_t m, ptrdiff_t k, float inv, float zp, int round_first,
                                       uint8_t* out) {
    uint8_t* base = i8_amx_base(out);
    const ptrdiff_t kx = qrt_round_up(k, I8_XALIGN);
    const i8_qparams z = {inv, zp, round_first};
    if (m % I8_MR || k % I8_XALIGN)
        memset(base, 0, (size_t)qrt_i8_packed_x_size(m, k));
    for (ptrdiff_t i0 = 0; i0 < m; i0 += I8_MR) {
        const int rows = (int)(m - i0 < I8_MR ? m - i0 : I8_MR);
        if (rows >= I8_AMX_ROWS)
            i8_amx_quantize_tile(base + i0 * kx, x, k, i0, rows, &z);
        else
            i8_quantize_tile(base + i0 * kx, x, k, i0, rows, &z);
    }
}

/* One block of 64 k: sums 0, 1 (and 2, 3 when two) += x tile x0 (x1) times weight blocks w0, w1. */
QRT_INLINE void i8_amx_step(const uint8_t* x0, const uint8_t* x1, const int two, const int8_t* w0, const int8_t* w1) {
    _tile_loadd(4, x0, 64);
    _tile_loadd(6, w0, 64);
    _tile_loadd(7, w1, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    if (two) {
        _tile_loadd(5, x1, 64);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
}

/* The dynamic linear's epilogue (i8_fused) of rows of one panel's sums c (rows I8_NR apart), a register at a time
 * from o's tables: qrt_epilogue_rows' loop multiplied x_scale by w_scale[j] again on every row and tested e's
 * fields on every row (M=128 K=384 N=1536, one thread: 77-79 -> 74-76 us; N=384 the same). */
QRT_INLINE void i8_amx_dequantize(const i8_out* o, ptrdiff_t rows, const int32_t* c) {
    if (o->cols == I8_NR) {
        for (ptrdiff_t r = 0; r < rows; r++)
            QRT_UNROLL for (int v = 0; v < I8_NR / 16; v++)
                I8_DEQUANTIZE(o->y + r * o->ldy + 16 * v, I8_LOADC(c + r * I8_NR + 16 * v), o->scale + 16 * v,
                              o->bias + 16 * v, o->separate, o->relu, 16);
        return;
    }
    for (ptrdiff_t r = 0; r < rows; r++)
        for (ptrdiff_t v = 0; 16 * v < o->cols; v++)
            I8_DEQUANTIZE(o->y + r * o->ldy + 16 * v, I8_LOADC(c + r * I8_NR + 16 * v), o->scale + 16 * v,
                          o->bias + 16 * v, o->separate, o->relu, (int)(o->cols - 16 * v < 16 ? o->cols - 16 * v : 16));
}

/* A panel's sums in c waiting for their epilogue, which runs a few rows after each step of tdpbusd of the next
 * panel (i8_amx_epilogue), so the vector units dequantize while the AMX unit works through its queue, where
 * each had waited for the other. all-MiniLM-L6-v2 at 128 tokens (its products M=128, K=384 or 1536), calls
 * alternating in one process on this Xeon (Emerald Rapids class): 1.09x faster on one thread, 1.06x on two;
 * at 16 tokens 1.01-1.02x. Steps after the epilogue's rows, prefetching the panel's y for writing, lost 2-3%.
 * The product alone (M=128 K=384, weights past L2, old and new alternating) gains only where the core is shared with
 * another VM's thread (N=1536 and 1152 1.15-1.2x); on an idle core it is level, N=384 up to 5% slower. */
typedef struct {
    const qrt_epilogue* e;
    int fused;                          /* i8_fused: straight to floats (out), else qrt_epilogue_rows */
    i8_out out;                         /* fused: y at the panel's first row */
    int32_t* c;                         /* the sums, rows I8_NR apart */
    ptrdiff_t i, n, j0, j1;             /* the panel's first row and its columns of n */
    const int32_t *w_zp, *x_rowsum;     /* qrt_epilogue_rows' */
    ptrdiff_t rows, done, per;          /* rows [done, rows) still to go, per step of the next panel */
} i8_amx_pending;

/* The epilogue of d's rows [d->done, upto) (upto at most d->rows). */
QRT_INLINE void i8_amx_epilogue(i8_amx_pending* d, ptrdiff_t upto) {
    upto = upto < d->rows ? upto : d->rows;
    if (d->done >= upto)
        return;
    int32_t* c = d->c + d->done * I8_NR;
    if (d->fused) {
        i8_out o = d->out;
        o.y += d->done * o.ldy;
        i8_amx_dequantize(&o, upto - d->done, c);
    } else {
        qrt_epilogue_rows(d->e, d->i + d->done, d->i + upto, d->n, d->j0, d->j1, c, I8_NR, d->w_zp, d->x_rowsum);
    }
    d->done = upto;
}

/* c[r][col] = start[col] + the sums of x tile x0 (rows 0-15) and, when two, x1 (rows 16-31) against the two
 * strips from w (ss bytes apart, 32 columns), over `blocks` blocks of 64 k and then, if not NULL, the block
 * in `tail` (the two strips 1 KiB apart); c's rows I8_NR apart. After each step, d->per rows of the pending
 * epilogue d. */
QRT_INLINE void i8_amx_tile(const uint8_t* x0, const uint8_t* x1, const int two, const int8_t* w, ptrdiff_t ss,
                            ptrdiff_t blocks, const int8_t* tail, const int32_t* start, int32_t* c,
                            i8_amx_pending* d) {
    _tile_loadd(0, start, 0); /* a stride of 0: every row the same */
    _tile_loadd(1, start + 16, 0);
    if (two) {
        _tile_loadd(2, start, 0);
        _tile_loadd(3, start + 16, 0);
    }
    ptrdiff_t b;
    for (b = 0; b < blocks; b++) {
        const int8_t* wb = w + b * I8_AMX_BLOCK;
        i8_amx_step(x0 + b * I8_AMX_BLOCK, x1 + b * I8_AMX_BLOCK, two, wb, wb + ss);
        i8_amx_epilogue(d, d->done + d->per);
    }
    if (tail)
        i8_amx_step(x0 + b * I8_AMX_BLOCK, x1 + b * I8_AMX_BLOCK, two, tail, tail + I8_AMX_BLOCK);
    _tile_stored(0, c, I8_NR * 4);
    _tile_stored(1, c + 16, I8_NR * 4);
    if (two) {
        _tile_stored(2, c + 16 * I8_NR, I8_NR * 4);
        _tile_stored(3, c + 16 * I8_NR + 16, I8_NR * 4);
    }
}

/* Weights a group of panels may hold: each block of 32 rows runs over a whole group while its x stays in L1
 * (32 KiB at K = 1024) and the group in L2 (half of Sapphire and Granite Rapids' 2 MiB). Against panels
 * outside and rows inside, as avx512-vnni walks them: M=512 K=N=1024 510-590 -> 440 us; M=64 K=N=4096 (16
 * MiB) the same 1000-1060 us, where rows outside all panels read the weights from memory once per block of
 * rows (1330). */
#define I8_AMX_GROUP_BYTES (1024 * 1024)

/* qrt_gemm_u8s8 for rows [i0, i1), every row tile AMX-packed, from the packed x at base: in blocks of 32 rows
 * (2 x tiles) by 32 columns (2 strips), 4 tiles of sums over the whole of K, a panel's sums into one of two
 * buffers, whose epilogue runs while the next panel's tiles are computed into the other (i8_amx_pending).
 * Strips wholly past n are skipped. A strip's last, partial block of 64 k reads on into the next strip's
 * weights, which multiply x's zero padding; past the last strip is the end of the weights, so the last
 * panel's partial blocks come from a zero-padded copy. */
static void i8_amx_rows(const uint8_t* base, int32_t x_zp, const int32_t* w_rowsum, const int8_t* packed,
                        const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0,
                        ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, const qrt_epilogue* e) {
    const ptrdiff_t kp = qrt_round_up(k, 4), kx = qrt_round_up(k, I8_XALIGN), ss = QRT_STRIP * kp;
    const ptrdiff_t whole = kp / 64, tail_bytes = kp % 64 * QRT_STRIP, last = (n - 1) / I8_NR;
    const ptrdiff_t group = I8_AMX_GROUP_BYTES / (I8_NR * kp + 1) + 1;
    _Alignas(64) int32_t c[2][32 * I8_NR];
    _Alignas(64) int8_t tail[I8_NR / QRT_STRIP][I8_AMX_BLOCK];
    int32_t offsets[I8_NR], start[I8_NR], f;
    _Alignas(64) float scale[2][I8_NR], bias[2][I8_NR];
    /* no panel waiting yet (rows 0); AMX has one flavour: small x or not */
    i8_amx_pending d = {.e = e, .fused = i8_fused(e, x_rowsum, 0), .n = n, .w_zp = w_zp, .x_rowsum = x_rowsum};
    int buf = 0;
    if (tail_bytes && p1 > last)
        for (ptrdiff_t s = 0; s < I8_NR / QRT_STRIP; s++) {
            memcpy(tail[s], packed + last * I8_NR * kp + s * ss + whole * I8_AMX_BLOCK, (size_t)tail_bytes);
            memset(tail[s] + tail_bytes, 0, (size_t)(I8_AMX_BLOCK - tail_bytes));
        }
    i8_amx_config cfg = {1, 0, {0}, {0}, {0}};
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    for (ptrdiff_t g = p0; g < p1; g += group)
        for (ptrdiff_t i = i0; i < i1; i += 32)
            for (ptrdiff_t p = g; p < p1 && p < g + group; p++) {
                const ptrdiff_t j0 = p * I8_NR, j1 = j0 + I8_NR < n ? j0 + I8_NR : n, pairs = (j1 - j0 + 31) / 32;
                const int32_t* init = i8_offsets(x_zp, w_rowsum, w_zp, n, k, j0, I8_NR, offsets, &f);
                for (int j = 0; j < I8_NR; j++)
                    start[j] = (int32_t)((uint32_t)init[j] * (uint32_t)f);
                const int copy = tail_bytes && p == last;
                const uint8_t* x0 = base + i * kx;
                const ptrdiff_t blocks = copy ? whole : kx / 64, steps = pairs * blocks;
                d.per = steps ? (d.rows + steps - 1) / steps : d.rows;
                for (ptrdiff_t q = 0; q < pairs; q++) {
                    const int8_t* w = packed + p * I8_NR * kp + 2 * q * ss;
                    const int8_t* wt = copy ? tail[2 * q] : NULL;
                    if (i1 - i > 16)
                        i8_amx_tile(x0, x0 + 16 * kx, 1, w, ss, blocks, wt, start + 32 * q, c[buf] + 32 * q, &d);
                    else
                        i8_amx_tile(x0, x0, 0, w, ss, blocks, wt, start + 32 * q, c[buf] + 32 * q, &d);
                }
                i8_amx_epilogue(&d, d.rows);
                d.c = c[buf], d.i = i, d.j0 = j0, d.j1 = j1, d.done = 0;
                d.rows = (i + 32 < i1 ? i + 32 : i1) - i;
                if (d.fused) {
                    d.out = i8_out_at(e, n, j0, j1, scale[buf], bias[buf]);
                    d.out.y = e->y + i * n + j0;
                }
                buf = !buf;
            }
    i8_amx_epilogue(&d, d.rows);
    _tile_release();
}

/* qrt_gemm_u8s8 (gemm_i8.h) with x packed by qrt_i8_amx_pack_x: its AMX tiles here, a last tile of fewer than
 * I8_AMX_ROWS rows and one row as it is (x_plain) there. */
static void qrt_gemm_u8s8_amx(const uint8_t* xpacked, int32_t x_zp, const int32_t* w_rowsum, const int8_t* packed,
                              const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0,
                              ptrdiff_t i1, ptrdiff_t p0, ptrdiff_t p1, int small_x, int x_plain,
                              const qrt_epilogue* e) {
    if (x_plain || i1 <= i0) {
        qrt_gemm_u8s8(xpacked, x_zp, w_rowsum, packed, w_zp, x_rowsum, n, k, i0, i1, p0, p1, small_x, x_plain, e);
        return;
    }
    const uint8_t* base = i8_amx_base(xpacked);
    /* i0 is a tile's first row and i1 a tile's end or m's: only the last tile may be short */
    const ptrdiff_t last = i0 + (i1 - i0 - 1) / I8_MR * I8_MR, amx_end = i1 - last >= I8_AMX_ROWS ? i1 : last;
    if (amx_end > i0)
        i8_amx_rows(base, x_zp, w_rowsum, packed, w_zp, x_rowsum, n, k, i0, amx_end, p0, p1, e);
    if (i1 > amx_end)
        qrt_gemm_u8s8(base, x_zp, w_rowsum, packed, w_zp, x_rowsum, n, k, amx_end, i1, p0, p1, small_x, 0, e);
}
