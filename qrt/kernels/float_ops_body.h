/* The kernels of float_ops.h, compiled once per table by the including file (float_ops_portable.c,
 * float_ops_fma.c, float_ops_avx512.c), which names the table qrt_float_ops_<QRT_FLOAT_OPS_ID>.
 *
 * Reductions (sum, mean, softmax, log_softmax) all use one order, whatever the layout:
 * the reduced dimension is cut into blocks of 256 elements; in a block, element j goes to lane
 * j % 16, each lane combines its elements in order, and the 16 lanes are folded in halves (lane l
 * with lane l + 8, then l + 4, l + 2, l + 1); the blocks' results are combined in order. A sum of
 * n terms so goes through at most ceil(min(n, 256) / 16) + 3 + ceil(n / 256) - 1 roundings.
 * A contiguous row runs it as 16-wide vector accumulators; a reduced dimension that is not the last
 * runs it on slabs of 64 columns at once, vectorised across the columns, and gives the same bits.
 */
#include "float_ops.h"

#include "common.h"
#include "float_math.h"
#include "torch_gelu.h"
#define QRT_LN_ROWS 8
#include "torch_layer_norm.h"

#define QRT_LANES 16
#define QRT_BLOCK 256
#define QRT_SLAB 64

enum { QRT_RED_SUM, QRT_RED_MAX };

/* max propagates NaN, as torch's does */
QRT_INLINE float qrt_red_combine(int op, float acc, float v) {
    if (op == QRT_RED_MAX)
        return (v > acc || v != v) ? v : acc;
    return acc + v;
}

/* out[c] = the reduction (op) of x[j * stride + c] over j < n, for c < cols <= QRT_SLAB, in the
 * order above; stride 1 means one contiguous row (cols 1), of which `over` more floats may be read past
 * its end (later rows: their values are masked off). Inlined with a constant op. */
QRT_INLINE void qrt_lane_reduce(int op, const float* restrict x, ptrdiff_t n, ptrdiff_t stride, ptrdiff_t cols,
                                ptrdiff_t over, float* restrict out) {
    const float init = op == QRT_RED_MAX ? -INFINITY : 0.0f;
    const int fold = op == QRT_RED_MAX ? QRT_RED_MAX : QRT_RED_SUM;
    if (stride == 1) {
        float total = init;
        for (ptrdiff_t j0 = 0; j0 < n; j0 += QRT_BLOCK) {
            const float* restrict block = x + j0;
            const ptrdiff_t nb = n - j0 < QRT_BLOCK ? n - j0 : QRT_BLOCK;
            float acc[QRT_LANES];
            for (int l = 0; l < QRT_LANES; l++)
                acc[l] = init;
            ptrdiff_t j = 0;
#if defined(__GNUC__)
            /* the lanes as one vector (GCC/Clang vector extensions): written lane by lane, GCC compiled
             * max's NaN test into a branch per element (measured: 35x94 log_softmax 1.25-1.4x faster).
             * The lane-by-lane loop below is what other compilers run; here it finds nothing left. */
            typedef float lanes_f __attribute__((vector_size(QRT_LANES * sizeof(float))));
            typedef int32_t lanes_i __attribute__((vector_size(QRT_LANES * sizeof(float))));
            lanes_f va;
            memcpy(&va, acc, sizeof va);
            ptrdiff_t vend = nb / QRT_LANES * QRT_LANES; /* where the vectors stop */
#if defined(QRT_FLOAT_OPS_LANES_IN_ONE)
            /* the block's last lanes as one more vector, read past the row where later rows are there to read,
             * the lanes past it set to what leaves a lane as it is (-inf for max; -0.0 for the sum: a sum
             * from +0.0 is never -0.0): 35x94 log_softmax 3.1 -> 2.3 us on AVX-512;
             * with AVX2's two registers a vector, 6.7 -> 7.3 us, so only where one register holds the lanes */
            if (vend < nb && j0 + vend + QRT_LANES <= n + over)
                vend += QRT_LANES;
#else
            (void)over;
#endif
            for (; j < vend; j += QRT_LANES) {
                lanes_f v;
                memcpy(&v, block + j, sizeof v);
#if defined(QRT_FLOAT_OPS_LANES_IN_ONE)
                if (j + QRT_LANES > nb) {
                    static const int32_t lanes[QRT_LANES] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
                    lanes_i lane;
                    memcpy(&lane, lanes, sizeof lane);
                    const lanes_i in = lane < (lanes_i){0} + (int32_t)(nb - j);
                    const lanes_f ident = (lanes_f){0} + (op == QRT_RED_MAX ? -INFINITY : -0.0f);
                    v = (lanes_f)((in & (lanes_i)v) | (~in & (lanes_i)ident));
                }
#endif
                if (op == QRT_RED_MAX) { /* qrt_red_combine's max, lane by lane */
                    const lanes_i take = (v > va) | (v != v);
                    va = (lanes_f)((take & (lanes_i)v) | (~take & (lanes_i)va));
                } else {
                    va = va + v;
                }
            }
            memcpy(acc, &va, sizeof va);
#endif
            for (; j + QRT_LANES <= nb; j += QRT_LANES)
                for (int l = 0; l < QRT_LANES; l++)
                    acc[l] = qrt_red_combine(op, acc[l], block[j + l]);
            for (int l = 0; j + l < nb; l++)
                acc[l] = qrt_red_combine(op, acc[l], block[j + l]);
            for (int half = QRT_LANES / 2; half > 0; half /= 2)
                for (int l = 0; l < half; l++)
                    acc[l] = qrt_red_combine(fold, acc[l], acc[l + half]);
            total = qrt_red_combine(fold, total, acc[0]);
        }
        out[0] = total;
        return;
    }
    float acc[QRT_LANES][QRT_SLAB];
    for (ptrdiff_t c = 0; c < cols; c++)
        out[c] = init;
    for (ptrdiff_t j0 = 0; j0 < n; j0 += QRT_BLOCK) {
        const ptrdiff_t nb = n - j0 < QRT_BLOCK ? n - j0 : QRT_BLOCK;
        for (int l = 0; l < QRT_LANES; l++)
            for (ptrdiff_t c = 0; c < cols; c++)
                acc[l][c] = init;
        for (ptrdiff_t j = 0; j < nb; j++) {
            float* restrict lane = acc[j % QRT_LANES];
            const float* restrict row = x + (j0 + j) * stride;
            for (ptrdiff_t c = 0; c < cols; c++)
                lane[c] = qrt_red_combine(op, lane[c], row[c]);
        }
        for (int half = QRT_LANES / 2; half > 0; half /= 2)
            for (int l = 0; l < half; l++)
                for (ptrdiff_t c = 0; c < cols; c++)
                    acc[l][c] = qrt_red_combine(fold, acc[l][c], acc[l + half][c]);
        for (ptrdiff_t c = 0; c < cols; c++)
            out[c] = qrt_red_combine(fold, out[c], acc[0][c]);
    }
}

/* Runs BODY for each element of an [n, cols] block whose rows are `stride` apart, with i its offset
 * and c its column; a contiguous row (stride 1, one column) as one flat loop that vectorises. */
#define QRT_FOR_BLOCK(n, stride, cols, BODY)                                                   \
    do {                                                                                        \
        if ((stride) == 1) {                                                                    \
            const ptrdiff_t c = 0;                                                              \
            for (ptrdiff_t i = 0; i < (n); i++) {                                               \
                BODY;                                                                           \
            }                                                                                   \
        } else {                                                                                \
            for (ptrdiff_t j = 0; j < (n); j++)                                                 \
                for (ptrdiff_t c = 0; c < (cols); c++) {                                        \
                    const ptrdiff_t i = j * (stride) + c;                                       \
                    BODY;                                                                       \
                }                                                                               \
        }                                                                                       \
    } while (0)

static void qrt_unary(int op, const float* restrict x, float* restrict y, ptrdiff_t n) {
    switch (op) {
    case QRT_SIGMOID:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_sigmoid(x[i]);
        break;
    case QRT_TANH:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_tanh(x[i]);
        break;
    case QRT_SILU:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_silu(x[i]);
        break;
    case QRT_GELU: /* torch's (oneDNN's) polynomials, torch_gelu.h: the table's lookup in registers where the
                    * including file has it (QRT_GELU_ROW); else GCC emulates its gathers with bit selects */
#if defined(QRT_GELU_ROW)
        QRT_GELU_ROW(x, y, n);
#else
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_gelu_onednn(x[i]);
#endif
        break;
    case QRT_GELU_TANH: /* qrt_gelu_tanh in two loops over a block, each of which vectorises */
        for (ptrdiff_t i0 = 0; i0 < n; i0 += QRT_BLOCK) {
            const ptrdiff_t m = n - i0 < QRT_BLOCK ? n - i0 : QRT_BLOCK;
            float hi[QRT_BLOCK], lo[QRT_BLOCK];
            for (ptrdiff_t i = 0; i < m; i++)
                hi[i] = qrt_gelu_tanh_arg(x[i0 + i], &lo[i]);
            for (ptrdiff_t i = 0; i < m; i++)
                y[i0 + i] = qrt_times_sigmoid(x[i0 + i], hi[i], lo[i]);
        }
        break;
    case QRT_SQRT: /* IEEE sqrt, correctly rounded (one instruction where the CPU has it) */
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = sqrtf(x[i]);
        break;
    case QRT_RSQRT: /* two roundings, as torch's rsqrt: fl(1 / fl(sqrt(x))) */
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = 1.0f / sqrtf(x[i]);
        break;
    case QRT_LOG: /* msun's logf (float_math.h), log_softmax's: its branches keep the loop scalar */
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_logf(x[i]);
        break;
    case QRT_SIN: /* float_math.h's, in double: scalar too */
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_sinf(x[i]);
        break;
    case QRT_COS:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = qrt_cosf(x[i]);
        break;
    case QRT_CEIL: /* exact (no rounding mode enters): one vector rounding per element on every build */
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = ceilf(x[i]);
        break;
    case QRT_FLOOR:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = floorf(x[i]);
        break;
    }
}

/* One row of a binary op, operand strides 0 (broadcast) or 1; inlined with constant strides, so each
 * case is its own vector loop. Each element is one IEEE operation: exact, whatever the loop. */
QRT_INLINE void qrt_binary_row(int op, const float* restrict a, ptrdiff_t sa, const float* restrict b, ptrdiff_t sb,
                               float* restrict y, ptrdiff_t n) {
    switch (op) {
    case QRT_ADD:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = a[i * sa] + b[i * sb];
        break;
    case QRT_SUB:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = a[i * sa] - b[i * sb];
        break;
    case QRT_MUL:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = a[i * sa] * b[i * sb];
        break;
    case QRT_DIV:
        for (ptrdiff_t i = 0; i < n; i++)
            y[i] = a[i * sa] / b[i * sb];
        break;
    }
}

static void qrt_binary(int op, const float* a, const ptrdiff_t* a_shape, const float* b, const ptrdiff_t* b_shape,
                       float* y, int rank) {
    /* The output's dimensions innermost first, each operand's stride along them (0 where it is
     * broadcast), and adjacent dimensions merged where both operands continue contiguously. */
    ptrdiff_t shape[QRT_BINARY_MAX_RANK], sa[QRT_BINARY_MAX_RANK], sb[QRT_BINARY_MAX_RANK];
    ptrdiff_t step_a = 1, step_b = 1;
    int d = 0;
    for (int k = rank - 1; k >= 0; k--) {
        const ptrdiff_t n = a_shape[k] == 1 ? b_shape[k] : a_shape[k];
        if (n == 0)
            return;
        const ptrdiff_t ta = a_shape[k] == 1 ? 0 : step_a, tb = b_shape[k] == 1 ? 0 : step_b;
        step_a *= a_shape[k];
        step_b *= b_shape[k];
        if (n == 1)
            continue;
        if (d > 0 && ta == sa[d - 1] * shape[d - 1] && tb == sb[d - 1] * shape[d - 1]) {
            shape[d - 1] *= n;
            continue;
        }
        shape[d] = n;
        sa[d] = ta;
        sb[d] = tb;
        d++;
    }
    if (d == 0) { /* one element */
        shape[0] = 1;
        sa[0] = sb[0] = 0;
        d = 1;
    }
    ptrdiff_t idx[QRT_BINARY_MAX_RANK] = {0}, oa = 0, ob = 0, oy = 0;
    for (;;) {
        if (sa[0] == 1 && sb[0] == 1)
            qrt_binary_row(op, a + oa, 1, b + ob, 1, y + oy, shape[0]);
        else if (sa[0] == 0 && sb[0] == 1)
            qrt_binary_row(op, a + oa, 0, b + ob, 1, y + oy, shape[0]);
        else if (sa[0] == 1)
            qrt_binary_row(op, a + oa, 1, b + ob, 0, y + oy, shape[0]);
        else
            qrt_binary_row(op, a + oa, 0, b + ob, 0, y + oy, shape[0]);
        oy += shape[0];
        int k = 1;
        for (; k < d; k++) { /* the next row: an odometer over the outer dimensions */
            oa += sa[k];
            ob += sb[k];
            if (++idx[k] < shape[k])
                break;
            oa -= sa[k] * shape[k];
            ob -= sb[k] * shape[k];
            idx[k] = 0;
        }
        if (k == d)
            return;
    }
}

/* Contiguous rows (softmax along the last dimension, n >= 1): up to QRT_SLAB rows at a time, fewer
 * when long, so a chunk (QRT_SOFTMAX_CHUNK floats) stays in L1 between its passes. The exponentials
 * of a whole chunk are one loop over its x_j - m values, so short rows (a vocabulary of 94, say) leave
 * no scalar remainder each; every element goes through the same operations as row by row. */
#define QRT_SOFTMAX_CHUNK 4096

/* y[j] = x[j] - m (minus ls too, when log) over a row of n, in whole blocks of QRT_LANES where the rows after
 * it (`after` floats of x and y) take the overrun: the block past the row's end writes the next row's first
 * values, which that row writes again after (rows go in order, and nothing reads y's values in between),
 * and leaves no scalar remainder (35x94 log_softmax on AVX-512 2.3 -> 2.0 us). x and y do not overlap. */
QRT_INLINE void qrt_row_minus(int log, const float* restrict x, float* restrict y, ptrdiff_t n, ptrdiff_t after,
                              float m, float ls) {
    const ptrdiff_t whole = qrt_round_up(n, QRT_LANES), span = whole - n <= after ? whole : n;
    ptrdiff_t j = 0;
    for (; j + QRT_LANES <= span; j += QRT_LANES)
        for (int l = 0; l < QRT_LANES; l++)
            y[j + l] = log ? (x[j + l] - m) - ls : x[j + l] - m;
    for (; j < n; j++)
        y[j] = log ? (x[j] - m) - ls : x[j] - m;
}

static void qrt_softmax_rows(int log, const float* x, float* y, ptrdiff_t rows, ptrdiff_t n) {
    float m[QRT_SLAB], s[QRT_SLAB];
    ptrdiff_t chunk = QRT_SOFTMAX_CHUNK / n;
    chunk = chunk < 1 ? 1 : (chunk > QRT_SLAB ? QRT_SLAB : chunk);
    for (ptrdiff_t r0 = 0; r0 < rows; r0 += chunk) {
        const ptrdiff_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        const float* restrict xs = x + r0 * n;
        float* restrict ys = y + r0 * n;
        for (ptrdiff_t r = 0; r < nr; r++) {
            const ptrdiff_t after = (rows - r0 - r - 1) * n; /* floats of the rows after this one */
            qrt_lane_reduce(QRT_RED_MAX, xs + r * n, n, 1, 1, after, &m[r]);
            qrt_row_minus(0, xs + r * n, ys + r * n, n, after, m[r], 0.0f);
        }
        for (ptrdiff_t i = 0; i < nr * n; i++)
            ys[i] = qrt_exp_full(ys[i]);
        for (ptrdiff_t r = 0; r < nr; r++)
            qrt_lane_reduce(QRT_RED_SUM, ys + r * n, n, 1, 1, (rows - r0 - r - 1) * n, &s[r]);
        for (ptrdiff_t r = 0; r < nr; r++) { /* every row's sum is taken: log's overrun no longer meets an e_j */
            if (log)
                qrt_row_minus(1, xs + r * n, ys + r * n, n, (rows - r0 - r - 1) * n, m[r], qrt_logf(s[r]));
            else
                for (ptrdiff_t j = r * n; j < (r + 1) * n; j++)
                    ys[j] = ys[j] / s[r];
        }
    }
}

/* Softmax: m = max, e_j = exp(x_j - m), s = the lane sum of e, y_j = e_j / s.
 * log_softmax: y_j = (x_j - m) - log(s). A row holding +inf or NaN, or only -inf, gives NaN
 * throughout (x_j - m is NaN somewhere), as torch's does. */
static void qrt_softmax(int log, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n, ptrdiff_t inner) {
    float m[QRT_SLAB], s[QRT_SLAB];
    if (inner == 1) {
        qrt_softmax_rows(log, x, y, outer, n);
        return;
    }
    for (ptrdiff_t o = 0; o < outer; o++)
        for (ptrdiff_t c0 = 0; c0 < inner; c0 += QRT_SLAB) {
            const ptrdiff_t cols = inner - c0 < QRT_SLAB ? inner - c0 : QRT_SLAB, at = o * n * inner + c0;
            const float* restrict xs = x + at;
            float* restrict ys = y + at;
            qrt_lane_reduce(QRT_RED_MAX, xs, n, inner, cols, 0, m);
            QRT_FOR_BLOCK(n, inner, cols, ys[i] = qrt_exp_full(xs[i] - m[c]));
            qrt_lane_reduce(QRT_RED_SUM, ys, n, inner, cols, 0, s);
            if (log) {
                for (ptrdiff_t c = 0; c < cols; c++)
                    s[c] = qrt_logf(s[c]);
                QRT_FOR_BLOCK(n, inner, cols, ys[i] = (xs[i] - m[c]) - s[c]);
            } else {
                QRT_FOR_BLOCK(n, inner, cols, ys[i] = ys[i] / s[c]);
            }
        }
}

/* sum: the lane sum (0 for n = 0); mean: fl(sum / fl(n)), as torch's sum-then-divide */
static void qrt_sum(int mean, const float* x, float* y, ptrdiff_t outer, ptrdiff_t n, ptrdiff_t inner) {
    const float count = (float)n;
    for (ptrdiff_t o = 0; o < outer; o++)
        for (ptrdiff_t c0 = 0; c0 < inner; c0 += QRT_SLAB) {
            const ptrdiff_t cols = inner - c0 < QRT_SLAB ? inner - c0 : QRT_SLAB;
            float* restrict out = y + o * inner + c0;
            qrt_lane_reduce(QRT_RED_SUM, x + o * n * inner + c0, n, inner, cols, 0, out);
            if (mean)
                for (ptrdiff_t c = 0; c < cols; c++)
                    out[c] = out[c] / count;
        }
}

/* torch 2.13's layer_norm (torch_layer_norm.h): the Welford moments of 8 rows at a time, their 64 lanes as
 * vector code (one row's 8 alone wait on each step's latency; [128, 384] against 4 rows: fma 16.1 -> 13.5 us,
 * avx512 12.1 -> 11.2, portable unchanged), the tails and lane merges scalar, then one fma per output.
 * With x2, of x + x2 (a residual add whose sum nothing else reads): each group's sums fl(x + x2), the add's own
 * bits, go into y and are normalised there in place while in cache (no pass over memory of their own). */
static void qrt_layer_norm(const float* x, const float* x2, const float* w, const float* b, float eps, float* y,
                           ptrdiff_t rows, ptrdiff_t n) {
    for (ptrdiff_t r0 = 0; r0 < rows; r0 += QRT_LN_ROWS) {
        float m1[QRT_LN_ALL], m2[QRT_LN_ALL];
        const ptrdiff_t nr = rows - r0 < QRT_LN_ROWS ? rows - r0 : QRT_LN_ROWS;
        const float* xs = x + r0 * n; /* the group's input: x's rows, or their sums in y */
        if (x2) {
            const float* restrict a = x + r0 * n;
            const float* restrict c = x2 + r0 * n;
            float* restrict s = y + r0 * n;
            for (ptrdiff_t i = 0; i < nr * n; i++)
                s[i] = a[i] + c[i];
            xs = s;
        }
        if (nr == QRT_LN_ROWS)
            qrt_ln_lane_moments(xs, n, n / QRT_LN_LANES, QRT_LN_ROWS, 0, QRT_LN_LANES, m1, m2);
        else
            qrt_ln_lane_moments(xs, n, n / QRT_LN_LANES, (int)nr, 0, QRT_LN_LANES, m1, m2);
        for (ptrdiff_t r = 0; r < nr; r++) {
            float* yr = y + (r0 + r) * n;
            float mean, rstd;
            qrt_ln_finish(xs + r * n, n, m1 + r * QRT_LN_LANES, m2 + r * QRT_LN_LANES, eps, &mean, &rstd);
            if (x2) { /* in place: one pointer, so no restrict is broken */
                for (ptrdiff_t j = 0; j < n; j++)
                    yr[j] = qrt_ln_out(yr[j], mean, rstd, w, b, j);
            } else {
                const float* restrict xr = xs + r * n;
                float* restrict yo = yr;
                for (ptrdiff_t j = 0; j < n; j++) /* GCC takes w and b's tests out of the loop */
                    yo[j] = qrt_ln_out(xr[j], mean, rstd, w, b, j);
            }
        }
    }
}

static void qrt_batch_norm(const float* x, const float* alpha, const float* beta, float* y, ptrdiff_t outer,
                           ptrdiff_t channels, ptrdiff_t inner) {
    for (ptrdiff_t o = 0; o < outer; o++) {
        const float* restrict xo = x + o * channels * inner;
        float* restrict yo = y + o * channels * inner;
        if (inner == 1) { /* [batch, channels]: vectors across the channels */
            for (ptrdiff_t c = 0; c < channels; c++)
                yo[c] = fmaf(xo[c], alpha[c], beta[c]);
            continue;
        }
        for (ptrdiff_t c = 0; c < channels; c++) {
            const float a = alpha[c], b = beta[c];
            for (ptrdiff_t i = 0; i < inner; i++)
                yo[c * inner + i] = fmaf(xo[c * inner + i], a, b);
        }
    }
}

#define QRT_FO_CAT_(a, b) a##b
#define QRT_FO_CAT(a, b) QRT_FO_CAT_(a, b)

const qrt_float_ops QRT_FO_CAT(qrt_float_ops_, QRT_FLOAT_OPS_ID) = {
    QRT_FLOAT_OPS_NAME, qrt_unary, qrt_binary, qrt_softmax, qrt_sum, qrt_layer_norm, qrt_batch_norm,
};
