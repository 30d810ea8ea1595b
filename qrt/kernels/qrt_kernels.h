/* The CPU kernels of qrt as one table per instruction-set variant, chosen at run time.
 *
 * Each variant_*.c compiles the same generic kernels (gemm_i8.h, gemm_f16.h, quantize.h,
 * gates.h) over one ISA's primitives (isa/) with that ISA's target flags, and exports one
 * qrt_kernels table. One build holds every variant of its architecture; dispatch.c picks the
 * best the CPU can run (cpuid on x86-64, getauxval(AT_HWCAP) on Linux/aarch64), and the
 * environment variable QRT_KERNELS forces another. Every variant reads weights in the one packed
 * layout of layout.h, so a file can store them packed.
 *
 * Every variant gives the same bits for every entry point (docs/NUMERICS.md); the tests hold
 * each one the host can run to the portable variant and the scalar oracles.
 */
#ifndef QRT_KERNELS_H
#define QRT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* GCC compiles the dotprod variant under a target pragma in any aarch64 build; clang's arm_neon.h
 * declares sdot only when the whole build targets dotprod, so a clang build without it leaves the
 * variant out (and runs "neon" on dotprod cores). */
#if defined(__aarch64__) && (!defined(__clang__) || defined(__ARM_FEATURE_DOTPROD))
#define QRT_HAVE_NEON_DOTPROD 1
#endif

/* The AMX variant needs a compiler with the tile intrinsics (GCC 11, clang 12) and an OS that grants the
 * tile state on request (Linux 5.16: dispatch.c asks); elsewhere the build leaves it out. */
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define QRT_HAVE_AMX 1
#endif

/* What the int8 product does with each exact int32 result a = acc[i][j], while its tile is in cache. */
typedef struct {
    int32_t* acc;         /* if not NULL: acc[i][j] = a */
    float* y;             /* dynamic linear: y[i][j] = fma(fl(a), fl(x_scale * w_scale[j]), bias[j]) */
    float x_scale;        /* ... or fl(a) * fl(x_scale * w_scale[j]) without bias; then relu(y) if relu */
    const float* w_scale;
    const float* bias;
    int relu;
    uint8_t* q;           /* static linear: q[i][j] = requantized a */
    const float* bias_q;  /* per-channel folded bias, or NULL */
    const float* bias_t;  /* per-tensor bias, or NULL */
    float bias_inv;
    const float* mult;
    int32_t zp, lo;
    int qnnpack;          /* torch's qnnpack engine: y = fl(fl(a) * fl(x_scale * w_scale[j])) + bias[j], two roundings */
    const int32_t* bias_i; /* static linear, qnnpack: the bias in int32, added to a (wrapping) before the requantization */
    const float* x_scales; /* dynamic linear with one activation scale per row (torchao's Int8Tensor linear), in place
                            * of x_scale: y[i][j] = fl(fl(fl(a) * x_scales[i]) * w_scale[j]) + bias[j], three roundings */
} qrt_epilogue;

typedef struct {
    const char* name;     /* "amx-int8", "avx512-vnni", "avx-vnni", "avx2", "neon-dotprod", "neon", "portable" */
    const char* i8_isa;   /* the primitives of each product */
    const char* fp_isa;
    int i8_nr, i8_mr;     /* panel columns and tile rows of the int8 product */
    int i8_task_rows;     /* rows a task of it takes a multiple of: whole row tiles, or blocks of them */
    int i8_small_x;       /* whether the product has a faster flavour for activations <= 128 (its small_x) */
    int fp_nr, fp_mr;     /* ... and of the float product */
    int fp_row_nr;        /* columns of the float product's one-row pass (whole panels): a one-row task takes
                           * whole passes, or runs its columns a panel at a time with too few chains */

    /* int8, weights packed as layout.h says: x[m][k] -> row tiles; the product with its epilogue (w_rowsum: the
     * weights' row sums, zero past n to a whole QRT_I8_NPAD; small_x: max(x) <= 128) */
    ptrdiff_t (*i8_packed_x_size)(ptrdiff_t m, ptrdiff_t k);
    int (*i8_pack_x)(const uint8_t* x, ptrdiff_t m, ptrdiff_t k, uint8_t* out); /* returns max(x) */
    void (*i8_quantize_pack_x)(const float* x, ptrdiff_t m, ptrdiff_t k, float inv, float zp, int round_first,
                               uint8_t* out); /* i8_pack_x of quantize_u8's q for x, without q in memory */
    void (*gemm_u8s8)(const uint8_t* xpacked, int32_t x_zp, const int32_t* w_rowsum, const int8_t* packed,
                      const int32_t* w_zp, const int32_t* x_rowsum, ptrdiff_t n, ptrdiff_t k, ptrdiff_t i0, ptrdiff_t i1,
                      ptrdiff_t p0, ptrdiff_t p1, int small_x, int x_plain, const qrt_epilogue* e);

    /* float16 (half) or float32 weights packed as layout.h says: the same steps, fma chains in fbgemm's
     * fp16 order, bias added after the chain; x's m rows make ceil(m / fp_mr) row tiles (t0, t1 count them);
     * float16 weights widened to float32 `widen` k at a time where row tiles share them (0: never; at most
     * QRT_F16_WIDEN_MAX; the bits are the same either way: gemm_f16.h) */
    ptrdiff_t (*fp_packed_x_size)(ptrdiff_t m, ptrdiff_t k);
    void (*fp_pack_x)(const float* x, ptrdiff_t m, ptrdiff_t k, float* out);
    void (*gemm_fp)(const float* xpacked, const void* packed, int half, const float* bias, ptrdiff_t n, ptrdiff_t k,
                    ptrdiff_t m, ptrdiff_t t0, ptrdiff_t t1, ptrdiff_t p0, ptrdiff_t p1, float* y, ptrdiff_t ldy,
                    ptrdiff_t widen);

    /* dynamic quantization of activations */
    int (*min_max)(const float* x, ptrdiff_t n, float* lo, float* hi);
    void (*quantize_u8)(const float* x, ptrdiff_t n, float inv, float zp, int round_first, uint8_t* q); /* not NaN */
    int (*u8_max)(const uint8_t* x, ptrdiff_t n);
    int (*quantize_dynamic)(const float* x, ptrdiff_t n, int reduce_range, int round_first, uint8_t* q, float* scale,
                            int32_t* zero_point); /* min_max, torch's parameters, quantize_u8; 1: NaN or inf */
    int (*quantize_rows_s8)(const float* x, ptrdiff_t m, ptrdiff_t k, uint8_t* q, float* scales); /* torchao's
                            * per-row symmetric int8, stored + 128; 1: NaN or inf */

    /* recurrent gates: units [j0, j1) of every batch row of one step (gates.h) */
    void (*gate_update)(int kind, const float* gi, float* gh, const float* h, const float* c, float* h_out,
                        float* c_out, ptrdiff_t batch, ptrdiff_t hidden, ptrdiff_t j0, ptrdiff_t j1);
} qrt_kernels;

/* The variants compiled into this build, best first; *count receives their number. */
const qrt_kernels* const* qrt_kernels_compiled(int* count);
/* Whether this CPU (and its OS) can run the variant. */
int qrt_kernels_runnable(const qrt_kernels* k);
/* The best variant this CPU can run. */
const qrt_kernels* qrt_kernels_best(void);
/* The variant of this name if this build holds it and this CPU runs it, else NULL (the C harnesses in bench/). */
const qrt_kernels* qrt_kernels_named(const char* name);
/* The most k of float16 weights gemm_fp widens at once: 16 KiB of float32 for a panel of 32 columns, beside a row
 * tile's x in L1. */
#define QRT_F16_WIDEN_MAX 128
/* gemm_fp's `widen` for variant k on this CPU: QRT_F16_WIDEN_MAX where widening float16 weights once is faster,
 * else 0. */
ptrdiff_t qrt_fp_widen_default(const qrt_kernels* k);

#endif /* QRT_KERNELS_H */
