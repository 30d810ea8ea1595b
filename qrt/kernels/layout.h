/* The one layout of packed weights that every kernel variant reads (docs/FORMAT.md, "Packed matrices"),
 * so that a file can store weights as the kernels read them and load without copying them.
 *
 * A matrix w[n][k] is cut into strips of QRT_STRIP = 16 output columns. n is padded with zero columns
 * to a multiple of the widest panel a variant reads at once (64 int8 columns, 32 float columns), so
 * that no variant reads past the end.
 *   int8:  k is padded with zeros to a multiple of 4; strip s holds, for each group g of 4 k, its 16
 *          columns' 4 bytes in turn: byte [s][g][c][b] = w[16 s + c][4 g + b] (what one vpdpbusd or
 *          sdot lane takes).
 *   float: strip s holds, for each k, its 16 columns' values: [s][t][c] = w[16 s + c][t], as float16
 *          bits (half) or float32.
 */
#ifndef QRT_LAYOUT_H
#define QRT_LAYOUT_H

#include "common.h"

#define QRT_STRIP 16
#define QRT_I8_NPAD 64
#define QRT_FP_NPAD 32

static inline ptrdiff_t qrt_i8_packed_size(ptrdiff_t n, ptrdiff_t k) {
    return qrt_round_up(n, QRT_I8_NPAD) * qrt_round_up(k, 4);
}

/* w[n][k] (row-major) -> strips, zero padded. */
static inline void qrt_i8_pack(const int8_t* w, ptrdiff_t n, ptrdiff_t k, int8_t* out) {
    ptrdiff_t kp = qrt_round_up(k, 4), j, t;
    memset(out, 0, (size_t)qrt_i8_packed_size(n, k));
    for (j = 0; j < n; j++) {
        int8_t* col = out + (j / QRT_STRIP) * QRT_STRIP * kp + (j % QRT_STRIP) * 4;
        for (t = 0; t + 4 <= k; t += 4)
            memcpy(col + t * QRT_STRIP, w + j * k + t, 4);
        memcpy(col + t * QRT_STRIP, w + j * k + t, (size_t)(k - t));
    }
}

/* Elements (of `size` bytes: 2 for float16 bits, 4 for float32) of a packed float matrix. */
static inline ptrdiff_t qrt_fp_packed_size(ptrdiff_t n, ptrdiff_t k) { return qrt_round_up(n, QRT_FP_NPAD) * k; }

/* w[n][k] of `size`-byte elements (row-major) -> strips, zero padded. */
static inline void qrt_fp_pack(const void* w, ptrdiff_t n, ptrdiff_t k, size_t size, void* out) {
    const char* src = (const char*)w;
    char* dst = (char*)out;
    memset(out, 0, (size_t)qrt_fp_packed_size(n, k) * size);
    for (ptrdiff_t j = 0; j < n; j++) {
        char* col = dst + ((j / QRT_STRIP) * QRT_STRIP * k + j % QRT_STRIP) * (ptrdiff_t)size;
        for (ptrdiff_t t = 0; t < k; t++)
            memcpy(col + t * QRT_STRIP * (ptrdiff_t)size, src + (j * k + t) * (ptrdiff_t)size, size);
    }
}

#endif /* QRT_LAYOUT_H */
