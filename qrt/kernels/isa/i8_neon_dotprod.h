/* u8 x s8 primitives, ARMv8.2 dotprod: one sdot per 4 columns x 4 k. */
#include <arm_neon.h>
#define QRT_I8_ISA "neon-dotprod"
#define I8_NR 16
#define I8_MR 4
#define I8_COLS 4
#define I8_ROW_NV 16 /* a one-row pass: 16 of the 32 registers, 64 columns */
/* sdot is s8 x s8: feed x - 128 (x ^ 0x80) and add 128 * rowsum(w) back (qrt_i8_col_offset) */
#define I8_XBIAS 128
typedef int32x4_t i8_acc;
typedef int8x16_t i8_w;
typedef int8x16_t i8_x;
#define I8_LOADW(p) vld1q_s8((const int8_t*)(p))
#define I8_SETX(word) vreinterpretq_s8_u32(vdupq_n_u32((uint32_t)(word) ^ 0x80808080u))
#define I8_DOT(acc, x, w) vdotq_s32((acc), (w), (x))
#define I8_STORE(out, acc) vst1q_s32((out), (acc))
#define I8_LOADC(p) vld1q_s32(p)
#define I8_OFFSET(p, f) vmulq_n_s32(vld1q_s32(p), (f))
#define I8_ADD(a, b) vaddq_s32((a), (b))

/* The dynamic linear's epilogue (gemm_i8.h's qrt_dequantize_row) on one accumulator, 4 columns:
 * y = fma(fl(acc), scale, bias) (i8_out's tables), or fl(fl(acc) * scale) + bias where separate (qnnpack's), then
 * +0.0 where y < 0 under relu (torch.relu: -0.0 and NaN kept); the first `lanes` stored */
#define I8_DEQUANTIZE i8_dequantize
QRT_INLINE void i8_dequantize(float* y, int32x4_t acc, const float* scale, const float* bias, int separate, int relu,
                              int lanes) {
    const float32x4_t a = vcvtq_f32_s32(acc), s = vld1q_f32(scale), b = vld1q_f32(bias);
    float32x4_t v = separate ? vaddq_f32(vmulq_f32(a, s), b) : vfmaq_f32(b, a, s);
    if (relu)
        v = vbslq_f32(vcltq_f32(v, vdupq_n_f32(0.0f)), vdupq_n_f32(0.0f), v);
    if (lanes == 4) {
        vst1q_f32(y, v);
    } else { /* where n ends inside the register: no masked store on NEON */
        float part[4];
        vst1q_f32(part, v);
        memcpy(y, part, (size_t)lanes * sizeof(float));
    }
}
