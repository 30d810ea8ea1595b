/* u8 x s8 primitives, ARMv8.0 NEON (no dotprod): smull of s8 pairs into int16, sadalp into int32.
 * As with sdot, x is fed as x - 128 so both factors are s8: each product lies in
 * [-16256, 16384] and fits int16 exactly; sadalp adds adjacent products into int32 lanes, so
 * nothing saturates. A column's sum lives in two lanes (k pairs 0-1 and 2-3) until stored. */
#include <arm_neon.h>
#define QRT_I8_ISA "neon"
#define I8_NR 16
#define I8_MR 3
#define I8_COLS 4
#define I8_ROW_NV 12 /* a one-row pass: 12 sums of 2 registers each, of the 32 */
#define I8_XBIAS 128
typedef int32x4x2_t i8_acc; /* val[0]: columns 0, 1 in pair form; val[1]: columns 2, 3 */
typedef int8x16_t i8_w;
typedef int8x16_t i8_x;
#define I8_LOADW(p) vld1q_s8((const int8_t*)(p))
#define I8_SETX(word) vreinterpretq_s8_u32(vdupq_n_u32((uint32_t)(word) ^ 0x80808080u))
QRT_INLINE i8_acc I8_DOT(i8_acc acc, i8_x x, i8_w w) {
    acc.val[0] = vpadalq_s16(acc.val[0], vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    acc.val[1] = vpadalq_s16(acc.val[1], vmull_high_s8(w, x));
    return acc;
}
QRT_INLINE void I8_STORE(int32_t* out, i8_acc acc) { vst1q_s32(out, vpaddq_s32(acc.val[0], acc.val[1])); }
/* 4 sums into pair form: (c, 0) per column */
QRT_INLINE i8_acc i8_pair_form(int32x4_t c) {
    const int32x4_t zero = vdupq_n_s32(0);
    i8_acc a = {{vzip1q_s32(c, zero), vzip2q_s32(c, zero)}};
    return a;
}
#define I8_LOADC(p) i8_pair_form(vld1q_s32(p))
#define I8_OFFSET(p, f) i8_pair_form(vmulq_n_s32(vld1q_s32(p), (f)))
QRT_INLINE i8_acc I8_ADD(i8_acc a, i8_acc b) { /* pair forms add lane by lane */
    a.val[0] = vaddq_s32(a.val[0], b.val[0]);
    a.val[1] = vaddq_s32(a.val[1], b.val[1]);
    return a;
}
