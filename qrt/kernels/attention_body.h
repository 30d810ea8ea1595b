/* The kernels of attention.h, compiled once per build of the float ops right after float_ops_body.h
 * (whose reductions and exp they share) by float_ops_portable.c, float_ops_fma.c and
 * float_ops_avx512.c, as the table qrt_attention_ops_<QRT_FLOAT_OPS_ID>.
 *
 * Every output of a product is one fma chain over k in order, from +0: acc = fma(a[i][t], b[t][j], acc)
 * for t = 0, 1, ..., k - 1, linear_float's chain (without its fp16 tail blocks: no fbgemm order to
 * follow here). The vectors run across j, each lane its own chain, so every build, tile and thread
 * split gives the same bits; the portable build runs the same fmaf calls one by one.
 */
#include "attention.h"
#include "torch_exp.h"

/* A tile: QRT_MM_R rows by QRT_MM_W columns, two vectors a row: 16 accumulators of AVX-512's 32 registers,
 * 12 of AVX2's 16 (more rows per broadcast column; 8 rows on AVX-512 ran L=S=128, E=32 attention heads' two
 * products about 1.3x faster than 4). */
#if defined(QRT_FLOAT_OPS_LANES_IN_ONE)
#define QRT_MM_R 8
#define QRT_MM_W 32 /* two 512-bit registers a row */
#else
#define QRT_MM_R 6
#define QRT_MM_W 16 /* two 256-bit registers a row */
#endif
#if QRT_MM_R > QRT_ATTENTION_ROWS
#error "attention.h's score tile must hold a product tile's rows"
#endif
/* Floats of b per column block of a matrix product (QRT_MM_BLOCK_FLOATS / k columns, whole tiles, at least
 * one), which stay in L2 while every row tile passes them. */
#define QRT_MM_BLOCK_FLOATS (64 * 1024)

/* y[r][c] = the chain over t < k of a[r * lda + t] * b[t * ldb + c], r < rows, c < w. Inlined with constant
 * rows and w, the accumulators stay in registers and each row's w lanes are whole vectors. */
QRT_INLINE void qrt_mm_tile(const float* restrict a, ptrdiff_t lda, const float* restrict b, ptrdiff_t ldb,
                            float* restrict y, ptrdiff_t ldy, const int rows, const int w, ptrdiff_t k) {
    float acc[QRT_MM_R][QRT_MM_W];
    QRT_UNROLL for (int r = 0; r < rows; r++)
        QRT_UNROLL for (int c = 0; c < w; c++)
            acc[r][c] = 0.0f;
    for (ptrdiff_t t = 0; t < k; t++) {
        const float* restrict bt = b + t * ldb;
        QRT_UNROLL for (int r = 0; r < rows; r++) {
            const float x = a[r * lda + t];
            QRT_UNROLL for (int c = 0; c < w; c++)
                acc[r][c] = fmaf(x, bt[c], acc[r][c]);
        }
    }
    QRT_UNROLL for (int r = 0; r < rows; r++)
        QRT_UNROLL for (int c = 0; c < w; c++)
            y[r * ldy + c] = acc[r][c];
}

/* Columns [c, c + W) of rows [0, rows), W constant: one instance per row count up to QRT_MM_R (the larger
 * ones never run). */
#define QRT_MM_COLUMNS(W)                                                                                    \
    do {                                                                                                     \
        switch (rows) {                                                                                      \
            QRT_MM_CASE(1, W);                                                                               \
            QRT_MM_CASE(2, W);                                                                               \
            QRT_MM_CASE(3, W);                                                                               \
            QRT_MM_CASE(4, W);                                                                               \
            QRT_MM_CASE(5, W);                                                                               \
            QRT_MM_CASE(6, W);                                                                               \
            QRT_MM_CASE(7, W);                                                                               \
        default: qrt_mm_tile(a, lda, b + c, ldb, y + c, ldy, QRT_MM_R, W, k); break;                         \
        }                                                                                                    \
    } while (0)
#define QRT_MM_CASE(R, W) \
    case R: qrt_mm_tile(a, lda, b + c, ldb, y + c, ldy, R < QRT_MM_R ? R : QRT_MM_R, W, k); break

/* Columns [c, c + W) where at least W are left, W constant. */
#define QRT_MM_PIECE(W)             \
    if (c + (W) <= n) {             \
        QRT_MM_COLUMNS(W);          \
        c += (W);                   \
    }

/* Rows [0, rows) (rows <= QRT_MM_R) of y = a b over columns [0, n): whole tiles, then pieces of half their
 * width, a quarter, ... one column (a head of 16 keys on AVX-512, say; the last 4 of 100 keys), each of a
 * constant width. The last columns as one tile of a width known only at run time kept its accumulators in
 * memory, scalar by scalar: 100 keys took more time than 128. */
static void qrt_mm_rows(const float* a, ptrdiff_t lda, const float* b, ptrdiff_t ldb, float* y, ptrdiff_t ldy,
                        int rows, ptrdiff_t k, ptrdiff_t n) {
    ptrdiff_t c = 0;
    for (; c + QRT_MM_W <= n; c += QRT_MM_W)
        QRT_MM_COLUMNS(QRT_MM_W);
    QRT_MM_PIECE(QRT_MM_W / 2)
    QRT_MM_PIECE(QRT_MM_W / 4)
    QRT_MM_PIECE(QRT_MM_W / 8)
    QRT_MM_PIECE(QRT_MM_W / 16)
#if QRT_MM_W > 16
    QRT_MM_PIECE(QRT_MM_W / 32)
#endif
}
#undef QRT_MM_PIECE
#undef QRT_MM_CASE
#undef QRT_MM_COLUMNS

/* Columns [c, n) of y = a b (n - c < QRT_MM_TAIL), a [m, k]: b's columns copied into bt ([k][QRT_MM_TAIL], zero
 * past them), each tile of rows run as QRT_MM_TAIL columns into yt, its first n - c copied out. As pieces of
 * 8, 4, 2 and 1 columns (qrt_mm_rows) each cost a whole tile's broadcasts of a: the scores [57, 32] x [32, 57]
 * took 2.1x the time of [64, 32] x [32, 64]. */
static void qrt_matmul_tail(const float* a, const float* b, float* y, ptrdiff_t m, ptrdiff_t k, ptrdiff_t n,
                            ptrdiff_t c, float* restrict scratch) {
    float* restrict bt = scratch;
    float* restrict yt = bt + k * QRT_MM_TAIL;
    const ptrdiff_t w = n - c;
    for (ptrdiff_t t = 0; t < k; t++)
        for (ptrdiff_t j = 0; j < QRT_MM_TAIL; j++)
            bt[t * QRT_MM_TAIL + j] = j < w ? b[t * n + c + j] : 0.0f;
    for (ptrdiff_t i = 0; i < m; i += QRT_MM_R) {
        const int rows = m - i < QRT_MM_R ? (int)(m - i) : QRT_MM_R;
        qrt_mm_rows(a + i * k, k, bt, QRT_MM_TAIL, yt, QRT_MM_TAIL, rows, k, QRT_MM_TAIL);
        for (int r = 0; r < rows; r++)
            for (ptrdiff_t j = 0; j < w; j++)
                y[(i + r) * n + c + j] = yt[r * QRT_MM_TAIL + j];
    }
}

static void qrt_matmul(const float* a, const float* b, float* y, ptrdiff_t m, ptrdiff_t k, ptrdiff_t n,
                       float* scratch) {
    const ptrdiff_t whole = n / QRT_MM_TAIL * QRT_MM_TAIL;
    ptrdiff_t cols = k > 0 ? QRT_MM_BLOCK_FLOATS / k / QRT_MM_W * QRT_MM_W : whole;
    cols = cols < QRT_MM_W ? QRT_MM_W : cols;
    for (ptrdiff_t c0 = 0; c0 < whole; c0 += cols) {
        const ptrdiff_t nc = whole - c0 < cols ? whole - c0 : cols;
        for (ptrdiff_t i = 0; i < m; i += QRT_MM_R) {
            const int rows = m - i < QRT_MM_R ? (int)(m - i) : QRT_MM_R;
            qrt_mm_rows(a + i * k, k, b + c0, n, y + i * n + c0, n, rows, k, nc);
        }
    }
    if (whole < n)
        qrt_matmul_tail(a, b, y, m, k, n, whole, scratch);
}

#if QRT_MM_TAIL % (QRT_MM_W / 2) || QRT_MM_TAIL > QRT_MM_W
#error "attention.h's QRT_MM_TAIL must be a whole tile or half of one (no narrower piece)"
#endif

/* torch's vector width in its softmax (AVX-512's 16 floats): exp_u20 and lane sums on whole vectors of
 * keys, then exp in double and a running sum over the last s % 16. */
#define QRT_TORCH_LANES 16

/* 16 lanes of floats, each its own chain of sums or maxes, folded at the end in halves: in registers where
 * the compiler has vector extensions and shuffles (GCC, Clang), as 16 / QRT_VW vectors of the build's width
 * (wider ones GCC splits into scalars on AVX2), else an array; the same operations lane by lane either way.
 * In registers the folds no longer pass through the stack (the arrays' scalar folds took an eighth of
 * attention's own time at L=S=128, E=32, perf). */
#if defined(__GNUC__)
#define QRT_ATTENTION_VECTORS 1
#if defined(QRT_FLOAT_OPS_LANES_IN_ONE)
#define QRT_VW 16
#define QRT_FOLD_STEPS(STEP)                                              \
    STEP(8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)      \
    STEP(4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7)                  \
    STEP(2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3)                  \
    STEP(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
#elif defined(__AVX__) /* GCC defines it under float_ops_fma.c's target pragma */
#define QRT_VW 8
#define QRT_FOLD_STEPS(STEP) STEP(4, 5, 6, 7, 4, 5, 6, 7) STEP(2, 3, 2, 3, 2, 3, 2, 3) STEP(1, 1, 1, 1, 1, 1, 1, 1)
#else
#define QRT_VW 4
#define QRT_FOLD_STEPS(STEP) STEP(2, 3, 2, 3) STEP(1, 1, 1, 1)
#endif
typedef float qrt_vf __attribute__((vector_size(QRT_VW * sizeof(float))));
typedef int32_t qrt_vi __attribute__((vector_size(QRT_VW * sizeof(float))));
#if defined(__clang__) || __GNUC__ >= 12
#define QRT_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define QRT_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (int32_t __attribute__((vector_size(sizeof(a))))){__VA_ARGS__})
#endif
#else
#define QRT_ATTENTION_VECTORS 0
#define QRT_VW 1
typedef float qrt_vf;
#endif
typedef struct {
    qrt_vf part[16 / QRT_VW]; /* lanes [p * QRT_VW, (p + 1) * QRT_VW) */
} qrt_lanes;

QRT_INLINE qrt_lanes qrt_lanes_set(float x) {
    qrt_lanes v;
    for (int p = 0; p < 16 / QRT_VW; p++)
        v.part[p] = (qrt_vf){0} + x;
    return v;
}

QRT_INLINE qrt_lanes qrt_lanes_load(const float* x) {
    qrt_lanes v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* qrt_red_combine (float_ops_body.h) lane by lane: a + v, or the max that propagates NaN */
QRT_INLINE qrt_vf qrt_vf_combine(int op, qrt_vf a, qrt_vf v) {
#if QRT_ATTENTION_VECTORS
    if (op == QRT_RED_SUM)
        return a + v;
    const qrt_vi take = (v > a) | (v != v);
    return (qrt_vf)((take & (qrt_vi)v) | (~take & (qrt_vi)a));
#else
    return qrt_red_combine(op, a, v);
#endif
}

QRT_INLINE qrt_lanes qrt_lanes_combine(int op, qrt_lanes a, qrt_lanes v) {
    for (int p = 0; p < 16 / QRT_VW; p++)
        a.part[p] = qrt_vf_combine(op, a.part[p], v.part[p]);
    return a;
}

/* Lane 0 of the lanes folded as (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1): whole vectors first, then
 * within the first (the lanes past each half take copies, never read). */
QRT_INLINE float qrt_lanes_fold(int op, qrt_lanes v) {
    for (int n = 16 / QRT_VW / 2; n >= 1; n /= 2)
        for (int p = 0; p < n; p++)
            v.part[p] = qrt_vf_combine(op, v.part[p], v.part[p + n]);
    qrt_vf x = v.part[0];
#if QRT_ATTENTION_VECTORS
#define QRT_FOLD_STEP(...) x = qrt_vf_combine(op, x, QRT_SHUFFLE(x, x, __VA_ARGS__));
    QRT_FOLD_STEPS(QRT_FOLD_STEP)
#undef QRT_FOLD_STEP
    return x[0];
#else
    return x;
#endif
}

/* NaN lanes as -inf: what std::max(m, x_j), torch's max over the last s % 16 scores, makes of them */
QRT_INLINE qrt_lanes qrt_lanes_without_nan(qrt_lanes a) {
    for (int p = 0; p < 16 / QRT_VW; p++) {
#if QRT_ATTENTION_VECTORS
        const qrt_vi nan = a.part[p] != a.part[p];
        a.part[p] = (qrt_vf)((nan & (qrt_vi)((qrt_vf){0} - INFINITY)) | (~nan & (qrt_vi)a.part[p]));
#else
        a.part[p] = a.part[p] != a.part[p] ? -INFINITY : a.part[p];
#endif
    }
    return a;
}

/* out[r] = the max of row r's x[0, n) (rows ldx floats apart), r < rows, as torch 2.13's flash attention takes
 * it: over the whole vectors of 16 the max that propagates NaN, over the last n % 16 keys, where torch_tail (no
 * mask: its _mul_reduce_max_fusion_kernel), std::max(m, x_j), which skips NaN, then the larger of the two unless
 * the vectors' is NaN (its guard). So a row of fewer than 16 scores, all NaN, has max -inf there: a row masked
 * out entirely, whose context is 0, as torch gives it; with a mask torch's max propagates NaN throughout. The
 * same as one max that propagates NaN over the whole vectors and the last one with its NaN lanes made -inf, in
 * qrt_lane_reduce's order (float_ops_body.h: blocks of QRT_BLOCK, 16 lanes each), the last vector read whole,
 * x[n, n rounded up to 16) holding -inf (a score row's padding, qrt_attention), which leaves a lane as it is.
 * The rows advance together, a vector each in turn, their chains overlapping: row after row, each row's chain of
 * compares and blends waited on the last (Zen 5, 12 heads at 128 keys: 1.06x the attention's time). Inlined with
 * a constant row count. */
QRT_INLINE void qrt_lane_max_rows(const float* restrict x, ptrdiff_t ldx, ptrdiff_t n, const int rows, int torch_tail,
                                  float* restrict out) {
    const ptrdiff_t whole = n / 16 * 16;
    for (int r = 0; r < rows; r++)
        out[r] = -INFINITY;
    for (ptrdiff_t j0 = 0; j0 < n; j0 += QRT_BLOCK) {
        const ptrdiff_t nb = n - j0 < QRT_BLOCK ? n - j0 : QRT_BLOCK;
        qrt_lanes acc[QRT_MM_R];
        QRT_UNROLL for (int r = 0; r < rows; r++)
            acc[r] = qrt_lanes_set(-INFINITY);
        for (ptrdiff_t j = j0; j < j0 + nb; j += 16)
            QRT_UNROLL for (int r = 0; r < rows; r++) {
                const qrt_lanes v = qrt_lanes_load(x + r * ldx + j);
                acc[r] = qrt_lanes_combine(QRT_RED_MAX, acc[r],
                                           torch_tail && j >= whole ? qrt_lanes_without_nan(v) : v);
            }
        for (int r = 0; r < rows; r++)
            out[r] = qrt_red_combine(QRT_RED_MAX, out[r], qrt_lanes_fold(QRT_RED_MAX, acc[r]));
    }
}

/* The p_j = exp(t_j - m) of the whole vectors of one row of scores (the first s / 16 * 16) in place, m their
 * max (finite), and their sum, in torch 2.13's AVX-512 order (_exp_reduce_sum_fusion_kernel): lane l of 16 sums
 * the p_j with j = l mod 16 in order from +0, vec_reduce_all folds the lanes as (l, l + 8), (l, l + 4),
 * (l, l + 2), (l, l + 1). torch takes the last s % 16 through exp in double rounded to float, added one by one:
 * qrt_torch_exp_tails. */
static float qrt_torch_exp_whole(float* restrict t, ptrdiff_t s, float m) {
    const ptrdiff_t whole = s / QRT_TORCH_LANES * QRT_TORCH_LANES;
    for (ptrdiff_t j = 0; j < whole; j++)
        t[j] = qrt_exp_u20(t[j] - m);
    qrt_lanes acc = qrt_lanes_set(0.0f);
    for (ptrdiff_t j = 0; j < whole; j += QRT_TORCH_LANES)
        acc = qrt_lanes_combine(QRT_RED_SUM, acc, qrt_lanes_load(t + j));
    return qrt_lanes_fold(QRT_RED_SUM, acc);
}

/* qrt_torch_exp_whole of rows [0, rows) of t (ldt floats apart), no max m[r] -inf, their sums into z:
 * with the build's QRT_EXP_ROWS (torch_exp_rows.h: the rows together, in intrinsics) where it has one, else row
 * by row. */
static void qrt_torch_exp_rows(float* restrict t, ptrdiff_t ldt, ptrdiff_t s, int rows, const float* m, float* z) {
#if defined(QRT_EXP_ROWS)
    const ptrdiff_t whole = s / QRT_TORCH_LANES * QRT_TORCH_LANES;
    float lanes[QRT_MM_R * QRT_TORCH_LANES];
    if (rows == QRT_MM_R)
        QRT_EXP_ROWS(t, ldt, whole, QRT_MM_R, m, lanes);
    else
        QRT_EXP_ROWS(t, ldt, whole, rows, m, lanes);
    for (int r = 0; r < rows; r++)
        z[r] = qrt_lanes_fold(QRT_RED_SUM, qrt_lanes_load(lanes + r * QRT_TORCH_LANES));
#else
    for (int r = 0; r < rows; r++)
        z[r] = qrt_torch_exp_whole(t + r * ldt, s, m[r]);
#endif
}

/* The last s % 16 scores of each row r < rows (row r at t + r * ldt, its max m[r], its whole vectors' sum z[r])
 * as torch takes them: p_j = exp(t_j - m) correctly rounded (qrt_exp_rounded), then z[r] + p_j one by one in
 * order. Rows whose m is -inf are left. The exps of every row run as one loop over a buffer, which vectorises
 * whole (one row's 1 to 15 ran mostly in its scalar remainder). */
static void qrt_torch_exp_tails(float* restrict t, ptrdiff_t ldt, ptrdiff_t s, int rows, const float* m, float* z) {
    const ptrdiff_t whole = s / QRT_TORCH_LANES * QRT_TORCH_LANES, n = s - whole;
    float p[QRT_MM_R * QRT_TORCH_LANES];
    for (int r = 0; r < rows; r++)
        for (ptrdiff_t j = 0; j < n; j++)
            p[r * n + j] = t[r * ldt + whole + j] - m[r];
    for (ptrdiff_t i = 0; i < rows * n; i++)
        p[i] = qrt_exp_rounded(p[i]);
    for (int r = 0; r < rows; r++) {
        if (m[r] == -INFINITY)
            continue;
        float sum = z[r]; /* in a register: z[r] in memory, which the stores to t may alias, went through
                             a store and a load per key */
        for (ptrdiff_t j = 0; j < n; j++) {
            t[r * ldt + whole + j] = p[r * n + j];
            sum = sum + p[r * n + j];
        }
        z[r] = sum;
    }
}

/* kt[d][j] = k[j][d] (k's rows ldk apart, kt's ldkt >= s, the columns from s to ldkt zero): 8 x 8 blocks
 * through registers where the compiler has shuffles and 8-float vectors (one unpack, one 128-bit shuffle, one
 * lane swap per output: AVX2's transpose; one by one it took an eighth of attention's own time at L=S=128,
 * E=32), the edges one by one, written in order and read across k's rows (1.5x faster than the other way). */
static void qrt_transpose(const float* restrict k, ptrdiff_t ldk, float* restrict kt, ptrdiff_t ldkt, ptrdiff_t s,
                          ptrdiff_t e) {
    ptrdiff_t e8 = 0, s8 = 0; /* the dimensions and keys the blocks cover */
#if QRT_ATTENTION_VECTORS && QRT_VW >= 8
    typedef float qrt_f8 __attribute__((vector_size(8 * sizeof(float))));
    e8 = e / 8 * 8, s8 = s / 8 * 8;
    for (ptrdiff_t d = 0; d < e8; d += 8)
        for (ptrdiff_t j = 0; j < s8; j += 8) {
            qrt_f8 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                memcpy(&r[i], k + (j + i) * ldk + d, sizeof r[i]);
            for (int i = 0; i < 8; i += 2) { /* t[i]: dims 0, 1, 4, 5 of rows i, i + 1; t[i + 1]: 2, 3, 6, 7 */
                t[i] = QRT_SHUFFLE(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
                t[i + 1] = QRT_SHUFFLE(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
            }
            for (int i = 0; i < 8; i += 4) /* u[i + c]: dims c and c + 4 of rows i to i + 3 */
                for (int c = 0; c < 2; c++) {
                    u[i + 2 * c] = QRT_SHUFFLE(t[i + c], t[i + c + 2], 0, 1, 8, 9, 4, 5, 12, 13);
                    u[i + 2 * c + 1] = QRT_SHUFFLE(t[i + c], t[i + c + 2], 2, 3, 10, 11, 6, 7, 14, 15);
                }
            for (int c = 0; c < 4; c++) {
                const qrt_f8 lo = QRT_SHUFFLE(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
                const qrt_f8 hi = QRT_SHUFFLE(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
                memcpy(kt + (d + c) * ldkt + j, &lo, sizeof lo);
                memcpy(kt + (d + c + 4) * ldkt + j, &hi, sizeof hi);
            }
        }
#endif
    for (ptrdiff_t d = 0; d < e; d++) {
        for (ptrdiff_t j = d < e8 ? s8 : 0; j < s; j++)
            kt[d * ldkt + j] = k[j * ldk + d];
        for (ptrdiff_t j = s; j < ldkt; j++)
            kt[d * ldkt + j] = 0.0f;
    }
}

/* Row i's scores from their chains in place, as torch takes them: t_j = fl(t_j * scale), or fma(t_j, scale,
 * mask_j) with a float mask, a bool mask being the float mask 0 / -inf torch makes of it (so a NaN or +inf score
 * it masks stays NaN, as in torch); -inf from key `causal_from` on (torch fills them). One pass (the scaling, the
 * mask and the causal cut each took one). Inlined with a constant kind. */
QRT_INLINE void qrt_scores(float* restrict t, ptrdiff_t s, float scale, int mask_kind, const void* mask,
                           ptrdiff_t causal_from) {
    if (mask_kind == QRT_MASK_FLOAT) {
        const float* restrict add = (const float*)mask;
        for (ptrdiff_t j = 0; j < s; j++)
            t[j] = fmaf(t[j], scale, add[j]);
    } else if (mask_kind == QRT_MASK_BOOL) {
        const unsigned char* restrict keep = (const unsigned char*)mask;
        for (ptrdiff_t j = 0; j < s; j++)
            t[j] = fmaf(t[j], scale, keep[j] ? 0.0f : -INFINITY);
    } else {
        for (ptrdiff_t j = 0; j < s; j++)
            t[j] = t[j] * scale;
    }
    for (ptrdiff_t j = causal_from; j < s; j++)
        t[j] = -INFINITY;
}

/* y (+)= the product of rows [0, rows) of a ([rows, k], row stride lda) and b ([k, n], row stride ldb), y's rows
 * ldy apart, as torch's sgemm (MKL) sums its context product (p v): one chain over k from +0 where k <=
 * QRT_TORCH_GEMM_K, else a chain over the first ceil(k / 2) and one over the rest, each added to y in turn
 * (measured at k = 385 to 512). `add` 0: y is the first chain. tmp holds rows * n. */
#define QRT_TORCH_GEMM_K 384
static void qrt_torch_gemm_rows(const float* a, ptrdiff_t lda, const float* b, ptrdiff_t ldb, float* restrict y,
                                ptrdiff_t ldy, float* restrict tmp, int rows, ptrdiff_t k, ptrdiff_t n, int add) {
    const ptrdiff_t half = k > QRT_TORCH_GEMM_K ? (k + 1) / 2 : k;
    for (int part = 0; part < (half < k ? 2 : 1); part++) {
        const ptrdiff_t t0 = part ? half : 0, kt = part ? k - half : half;
        if (!add && !part) {
            qrt_mm_rows(a, lda, b, ldb, y, ldy, rows, kt, n);
            continue;
        }
        qrt_mm_rows(a + t0, lda, b + t0 * ldb, ldb, tmp, n, rows, kt, n);
        for (int r = 0; r < rows; r++)
            for (ptrdiff_t c = 0; c < n; c++)
                y[r * ldy + c] = y[r * ldy + c] + tmp[r * n + c];
    }
}

/* Per query row i, torch 2.13's CPU flash attention for float32 (docs/NUMERICS.md): s_j = the chain q_i . k_j
 * (its sgemm's sums up to E = 384, measured; above, MKL's are not this); t_j = fl(s_j * scale), or fma(s_j, scale, mask_j) with a float mask (its
 * compiler contracts the product and sum; a bool mask as the float mask 0 / -inf), then -inf where, causal, j > i. Then over blocks of
 * QRT_TORCH_KV_BLOCK keys in turn, its online softmax: m' = the larger of the running max m and the block's (qrt_lane_max_rows: NaN skipped
 * in the last kb % 16 keys without a mask); p_j = exp(fl(t_j - m')) and their sum z in torch's AVX-512 order
 * (qrt_torch_exp_whole, qrt_torch_exp_tails); c = glibc's expf(fl(m - m')), Z = fma(c, Z, z), the context so far times c (from the
 * second block on), plus the block's p_j v_j (its sgemm's sums); m = m'. A block whose m' is -inf takes p_j = 0
 * and leaves the rest. y_i = fl(context * fl(1 / Z)), Z = 0 taken as 1: a row masked out entirely gives the
 * chain of 0 * v_j, as torch does. Scores live in a tile of QRT_MM_R rows only. */
#define QRT_TORCH_KV_BLOCK 512
static void qrt_attention(const float* q, ptrdiff_t ldq, const float* k, ptrdiff_t ldk, const float* v, ptrdiff_t ldv,
                          const void* mask, int mask_kind, ptrdiff_t mask_stride, float scale, int causal,
                          ptrdiff_t row0, ptrdiff_t l, ptrdiff_t s, ptrdiff_t e, ptrdiff_t ev, float* y, ptrdiff_t ldy,
                          float* scratch) {
    const ptrdiff_t sp = qrt_attention_keys_padded(s);
    float* restrict kt = scratch;                         /* k transposed, [e][sp]: the scores run across keys */
    float* restrict tile = kt + e * sp;                    /* QRT_MM_R rows of s scores, then -inf to sp */
    float* restrict part = tile + QRT_ATTENTION_ROWS * sp; /* QRT_MM_R rows of a partial context */
    qrt_transpose(k, ldk, kt, sp, s, e);
    for (ptrdiff_t i0 = 0; i0 < l; i0 += QRT_MM_R) {
        const int rows = l - i0 < QRT_MM_R ? (int)(l - i0) : QRT_MM_R;
        float* restrict yi = y + i0 * ldy;
        float run_max[QRT_MM_R], run_sum[QRT_MM_R];
        qrt_mm_rows(q + i0 * ldq, ldq, kt, sp, tile, sp, rows, e, sp);
        for (int r = 0; r < rows; r++) {
            const ptrdiff_t i = i0 + r, causal_from = causal && row0 + i + 1 < s ? row0 + i + 1 : s;
            if (mask_kind == QRT_MASK_FLOAT)
                qrt_scores(tile + r * sp, s, scale, QRT_MASK_FLOAT, (const float*)mask + i * mask_stride, causal_from);
            else if (mask_kind == QRT_MASK_BOOL)
                qrt_scores(tile + r * sp, s, scale, QRT_MASK_BOOL, (const unsigned char*)mask + i * mask_stride,
                           causal_from);
            else
                qrt_scores(tile + r * sp, s, scale, QRT_MASK_NONE, NULL, causal_from);
            run_max[r] = -INFINITY;
            run_sum[r] = 0.0f;
        }
        if (sp > s) /* the padding, for qrt_lane_max_rows */
            for (int r = 0; r < rows; r++)
                for (ptrdiff_t j = s; j < sp; j++)
                    tile[r * sp + j] = -INFINITY;
        if (s == 0) /* no key: the context is the empty sum */
            for (int r = 0; r < rows; r++)
                for (ptrdiff_t d = 0; d < ev; d++)
                    yi[r * ldy + d] = 0.0f;
        for (ptrdiff_t n0 = 0; n0 < s; n0 += QRT_TORCH_KV_BLOCK) {
            const ptrdiff_t kb = s - n0 < QRT_TORCH_KV_BLOCK ? s - n0 : QRT_TORCH_KV_BLOCK;
            float block_max[QRT_MM_R];
            if (rows == QRT_MM_R)
                qrt_lane_max_rows(tile + n0, sp, kb, QRT_MM_R, mask_kind == QRT_MASK_NONE, block_max);
            else
                qrt_lane_max_rows(tile + n0, sp, kb, rows, mask_kind == QRT_MASK_NONE, block_max);
            /* m as long as the rows-together exp's loop (QRT_ATTENTION_ROWS), which reads m[r] only for r < rows
             * but which GCC, under -fsanitize=address, warned could read past QRT_MM_R */
            float m[QRT_ATTENTION_ROWS], z[QRT_MM_R];
            int none_masked = 1; /* no row masked out entirely so far */
            for (int r = 0; r < rows; r++) {
                m[r] = run_max[r] > block_max[r] ? run_max[r] : block_max[r];
                none_masked &= m[r] != -INFINITY;
            }
            if (none_masked)
                qrt_torch_exp_rows(tile + n0, sp, kb, rows, m, z);
            else
                for (int r = 0; r < rows; r++) {
                    float* restrict t = tile + r * sp + n0;
                    if (m[r] == -INFINITY)
                        for (ptrdiff_t j = 0; j < kb; j++)
                            t[j] = 0.0f;
                    else
                        z[r] = qrt_torch_exp_whole(t, kb, m[r]);
                }
            if (kb % QRT_TORCH_LANES)
                qrt_torch_exp_tails(tile + n0, sp, kb, rows, m, z);
            for (int r = 0; r < rows; r++) {
                if (m[r] == -INFINITY)
                    continue;
                const float c = qrt_expf_glibc(run_max[r] - m[r]);
                run_sum[r] = fmaf(c, run_sum[r], z[r]);
                run_max[r] = m[r];
                if (n0 > 0)
                    for (ptrdiff_t d = 0; d < ev; d++)
                        yi[r * ldy + d] = yi[r * ldy + d] * c;
            }
            qrt_torch_gemm_rows(tile + n0, sp, v + n0 * ldv, ldv, yi, ldy, part, rows, kb, ev, n0 > 0);
        }
        for (int r = 0; r < rows; r++) {
            const float recip = 1.0f / (run_sum[r] == 0.0f ? 1.0f : run_sum[r]);
            for (ptrdiff_t d = 0; d < ev; d++)
                yi[r * ldy + d] = yi[r * ldy + d] * recip;
        }
    }
}

const qrt_attention_ops QRT_FO_CAT(qrt_attention_ops_, QRT_FLOAT_OPS_ID) = {
    QRT_FLOAT_OPS_NAME, qrt_matmul, qrt_attention,
};
