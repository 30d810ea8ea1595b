// Embedding lookups and bags (qrt/gpu/tensor_ops.py): the CPU's qrt/kernels/embedding.h, one thread
// per output value, each running the CPU's loop for that value in the same order, so both give the
// same bits. A quantized value is fmaf(scale, q, bias); a quantized bag sums as
// acc = fmaf(scale, q, acc + bias), a float32 one as acc + w, both from +0.0; mean divides that sum
// by the count; max takes the first value, then each greater one; an empty bag is +0.0.
//
// The CPU checks every index (and offset) before it reads a row; a kernel cannot raise, so
// embedding_check records the first bad ones in a flag array (read once the run is done, see
// qrt.gpu.runtime.add_check), and the gathers never read an out-of-range row (zeros instead).
#include "common.cuh"

typedef long long i64;

// The flag array's words: the smallest bad index position and its index; offsets[0]; the first bag g
// whose end lies before its start, and those two ends. Positions start at FLAG_NONE.
enum { F_POS, F_INDEX, F_OFFSET0, F_BAG, F_START, F_END, F_WORDS };
#define FLAG_NONE 0x7fffffffffffffffLL

// Bag g's bounds: offsets[g] .. offsets[g + 1] (the last bag to n), or g * per .. (g + 1) * per
// without offsets (indices [bags, per]).
__device__ __forceinline__ i64 bag_start(const i64* offsets, unsigned per, unsigned g) {
    return offsets ? offsets[g] : (i64)g * per;
}
__device__ __forceinline__ i64 bag_end(const i64* offsets, unsigned per, unsigned bags, unsigned n, unsigned g) {
    return g + 1 == bags ? (i64)n : bag_start(offsets, per, g + 1);
}

// Thread i < n checks index i; thread g < bags checks bag g's bounds.
extern "C" __global__ void embedding_check(const i64* idx, unsigned n, i64 num, const i64* offsets, unsigned per,
                                           unsigned bags, i64* flag) {
    const unsigned total = n > bags ? n : bags;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        if (i < n && (idx[i] < 0 || idx[i] >= num)) atomicMin(&flag[F_POS], (i64)i);
        if (i < bags && bag_end(offsets, per, bags, n, i) < bag_start(offsets, per, i))
            atomicMin(&flag[F_BAG], (i64)i);
    }
}

// After embedding_check, one thread: the values its positions point at, for the message.
extern "C" __global__ void embedding_check_values(const i64* idx, unsigned n, const i64* offsets, unsigned per,
                                                  unsigned bags, i64* flag) {
    if (flag[F_POS] != FLAG_NONE) flag[F_INDEX] = idx[flag[F_POS]];
    if (bags) flag[F_OFFSET0] = bag_start(offsets, per, 0);
    if (flag[F_BAG] != FLAG_NONE) {
        const unsigned g = (unsigned)flag[F_BAG];
        flag[F_START] = bag_start(offsets, per, g);
        flag[F_END] = bag_end(offsets, per, bags, n, g);
    }
}

// A table of num rows of dim values: float32 (BITS 32) or uint8 values (BITS 8) or two 4-bit values
// a byte, the low nibble first (BITS 4), each quantized row with a scale and bias.
struct Table {
    const u8* data;
    const float* scale;
    const float* bias;
    i64 num;
    unsigned row_bytes, dim;
};

template <int BITS>
__device__ __forceinline__ float table_q(const u8* row, unsigned j) {
    return BITS == 8 ? (float)row[j] : (float)((row[j >> 1] >> ((j & 1) * 4)) & 15);
}

// out[i, j] = value j of row idx[i]: float32 rows copied as bits (-0.0 and NaN payloads kept)
template <int BITS>
__device__ void rows(const Table& t, const i64* idx, unsigned n, float* out) {
    const unsigned total = n * t.dim;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned i = e / t.dim, j = e - i * t.dim;
        const i64 r = idx[i];
        if (r < 0 || r >= t.num) {
            out[e] = 0.0f;
            continue;
        }
        const u8* row = t.data + r * t.row_bytes;
        if (BITS == 32)
            out[e] = __uint_as_float(((const unsigned*)row)[j]);
        else
            out[e] = __fmaf_rn(t.scale[r], table_q<BITS>(row, j), t.bias[r]);
    }
}

enum { BAG_SUM = 0, BAG_MEAN = 1, BAG_MAX = 2 };

// out[g, j] over the rows idx[start(g)] .. idx[end(g) - 1] in order (bounds clamped to the indices,
// out-of-range rows skipped: only for reads that stay in bounds, the run then raises)
template <int BITS>
__device__ void bags(const Table& t, const i64* idx, unsigned n, const i64* offsets, unsigned per, unsigned nbags,
                     int mode, float* out) {
    const unsigned total = nbags * t.dim;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned g = e / t.dim, j = e - g * t.dim;
        i64 start = bag_start(offsets, per, g), end = bag_end(offsets, per, nbags, n, g);
        start = start < 0 ? 0 : (start > n ? n : start);
        end = end < start ? start : (end > n ? n : end);
        float acc = 0.0f;
        for (i64 k = start; k < end; k++) {
            const i64 r = idx[k];
            if (r < 0 || r >= t.num) continue;
            const u8* row = t.data + r * t.row_bytes;
            if (mode == BAG_MAX) {
                const float v = BITS == 32 ? ((const float*)row)[j]
                                           : __fmaf_rn(t.scale[r], table_q<BITS>(row, j), t.bias[r]);
                acc = k == start || v > acc ? v : acc;
            } else if (BITS == 32) {
                acc = __fadd_rn(acc, ((const float*)row)[j]);
            } else {
                acc = __fmaf_rn(t.scale[r], table_q<BITS>(row, j), __fadd_rn(acc, t.bias[r]));
            }
        }
        if (mode == BAG_MEAN && end > start) acc = __fdiv_rn(acc, (float)(end - start));
        out[e] = acc;
    }
}

#define QRT_TABLE_PARAMS const u8 *data, const float *scale, const float *bias, i64 num, unsigned row_bytes, unsigned dim
#define QRT_TABLE Table{data, scale, bias, num, row_bytes, dim}
#define QRT_EMBEDDING_ENTRIES(BITS)                                                                          \
    extern "C" __global__ void embedding_rows_##BITS(QRT_TABLE_PARAMS, const i64* idx, unsigned n, float* out) { \
        rows<BITS>(QRT_TABLE, idx, n, out);                                                                  \
    }                                                                                                        \
    extern "C" __global__ void embedding_bags_##BITS(QRT_TABLE_PARAMS, const i64* idx, unsigned n,             \
                                                     const i64* offsets, unsigned per, unsigned nbags, int mode, \
                                                     float* out) {                                           \
        bags<BITS>(QRT_TABLE, idx, n, offsets, per, nbags, mode, out);                                       \
    }
QRT_EMBEDDING_ENTRIES(32)
QRT_EMBEDDING_ENTRIES(8)
QRT_EMBEDDING_ENTRIES(4)
