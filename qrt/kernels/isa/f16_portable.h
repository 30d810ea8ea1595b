/* float x float16 primitives in plain C: weights kept as float32 (float16 values), one column per lane. */
#define QRT_F16_ISA "portable"
#define F_HALF 0
#define F_NR 16
#define F_MR 4
#define F_LANES 1
typedef float f_vec;
#define F_ZERO() 0.0f
#define F_LOADW(p) (*(const float*)(p))
#define F_LOADF(p) (*(p))
#define F_SET1(v) (v)
#define F_FMA(a, b, c) fmaf((a), (b), (c))
#define F_ADD(a, b) ((a) + (b))
#define F_STORE(out, v) (*(out) = (v))
#define F_LOADC(p) (*(p))
