/* float x float16 primitives in plain C, one column per lane; float16 bits widened in software (exactly). */
#define QRT_F16_ISA "portable"
#define F_NR 16
#define F_MR 4
#define F_LANES 1
#define F_ROW_NV 16 /* a one-row pass: one strip */
typedef float f_vec;

static inline float qrt_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    float f;
    if (e == 0 && m) /* subnormal: m * 2^-24, exact in float */
        return sign ? -(float)m * 0x1p-24f : (float)m * 0x1p-24f;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | m << 13; /* infinity, NaN (payload kept) */
    else
        bits = e ? sign | (e + 112) << 23 | m << 13 : sign;
    memcpy(&f, &bits, 4);
    return f;
}
#define F_ZERO() 0.0f
#define F_LOADW(p) qrt_half_to_float(*(p))
#define F_LOADF(p) (*(p))
#define F_SET1(v) (v)
#define F_FMA(a, b, c) fmaf((a), (b), (c))
#define F_ADD(a, b) ((a) + (b))
#define F_STORE(out, v) (*(out) = (v))
#define F_LOADC(p) (*(p))
