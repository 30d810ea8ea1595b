/* u8 x s8 primitives in plain C: one column per accumulator, the oracle's arithmetic. */
#define QRT_I8_ISA "portable"
#define I8_NR 16
#define I8_MR 4
#define I8_COLS 1
#define I8_ROW_NV 16 /* a one-row pass: one strip */
#define I8_XBIAS 0
typedef int32_t i8_acc;
typedef const int8_t* i8_w;
typedef uint32_t i8_x;
#define I8_LOADW(p) ((const int8_t*)(p))
#define I8_SETX(word) ((uint32_t)(word))
QRT_INLINE int32_t I8_DOT(int32_t acc, uint32_t x, const int8_t* w) {
    uint32_t s = (uint32_t)acc;
    for (int t = 0; t < 4; t++)
        s += ((x >> (8 * t)) & 0xFF) * (uint32_t)(int32_t)w[t];
    return (int32_t)s;
}
#define I8_STORE(out, acc) (*(out) = (acc))
#define I8_LOADC(p) (*(p))
#define I8_OFFSET(p, f) ((int32_t)((uint32_t)(*(p)) * (uint32_t)(f))) /* wrapping, as the sums */
#define I8_ADD(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b))) /* wrapping, as the sums */
