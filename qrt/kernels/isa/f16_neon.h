/* float x float16 primitives, ARMv8.0 NEON: 4 columns per register, weights widened by fcvtl,
 * vfmaq_f32 a fused multiply-add with one rounding (the same as fmaf). */
#include <arm_neon.h>
#define QRT_F16_ISA "neon"
#define F_NR 16
#define F_MR 4
#define F_LANES 4
#define F_ROW_NV 16 /* a one-row pass: 16 chains of the 32 registers, 64 columns */
typedef float32x4_t f_vec;
#define F_ZERO() vdupq_n_f32(0.0f)
#define F_LOADW(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)(p))))
#define F_LOADF(p) vld1q_f32(p)
#define F_SET1(v) vdupq_n_f32(v)
#define F_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define F_ADD(a, b) vaddq_f32((a), (b))
#define F_STORE(out, v) vst1q_f32((out), (v))
#define F_LOADC(p) vld1q_f32(p)
