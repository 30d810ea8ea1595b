/* Compiler helpers shared by the kernel templates. */
#ifndef QRT_KERNELS_COMMON_H
#define QRT_KERNELS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define QRT_INLINE static inline __attribute__((always_inline))
#define QRT_UNROLL _Pragma("GCC unroll 16")
#else
#define QRT_UNROLL
#define QRT_INLINE static inline
#endif

static inline ptrdiff_t qrt_round_up(ptrdiff_t v, ptrdiff_t to) { return (v + to - 1) / to * to; }

#endif /* QRT_KERNELS_COMMON_H */
