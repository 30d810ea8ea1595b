/* The body of one variant: the generic kernels over the ISA primitives the including file chose
 * (isa/i8_*.h, isa/f16_*.h), and its table, named qrt_kernels_<QRT_VARIANT_ID>. */
#include "qrt_kernels.h"

#include "gates.h"
#include "gemm_f16.h"
#include "quantize.h" /* before gemm_i8.h, whose packers quantize */
#include "gemm_i8.h"

#if defined(I8_AMX) /* whole row tiles on AMX, the rest as gemm_i8.h computes them */
#include "gemm_i8_amx.h"
#define I8_ENTRIES qrt_i8_amx_packed_x_size, qrt_i8_amx_pack_x, qrt_i8_amx_quantize_pack_x, qrt_gemm_u8s8_amx
#else
#define I8_ENTRIES qrt_i8_packed_x_size, qrt_i8_pack_x, qrt_i8_quantize_pack_x, qrt_gemm_u8s8
#endif

#ifndef I8_TASK_ROWS
#define I8_TASK_ROWS I8_MR
#endif

#define QRT_CAT_(a, b) a##b
#define QRT_CAT(a, b) QRT_CAT_(a, b)

#if defined(I8_U7_COLS)
#define I8_SMALL_X 1
#else
#define I8_SMALL_X 0
#endif

const qrt_kernels QRT_CAT(qrt_kernels_, QRT_VARIANT_ID) = {
    QRT_VARIANT_NAME, QRT_I8_ISA, QRT_F16_ISA, I8_NR, I8_MR, I8_TASK_ROWS, I8_SMALL_X, F_NR, F_MR,
    F_ROW_NV * F_LANES,
    I8_ENTRIES,
    qrt_fp_packed_x_size, qrt_fp_pack_x, qrt_gemm_fp,
    qrt_min_max, qrt_quantize_u8, qrt_u8_max, qrt_quantize_dynamic, qrt_quantize_rows_s8,
    qrt_gate_update,
};
