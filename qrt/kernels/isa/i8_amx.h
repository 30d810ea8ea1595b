/* u8 x s8 primitives, AMX-INT8 (Sapphire Rapids and later): tdpbusd multiplies a tile of 16 rows x 64 k of x
 * by 16 groups of 4 k x 16 columns of weights into 16 x 16 int32 sums, the products and sums of vpdpbusd
 * (exact, no saturation). gemm_i8_amx.h runs whole row tiles on it; everything else (rows AMX leaves, one
 * row, the epilogues) is avx512-vnni's, with x packed in AMX's tiles of 16 rows. */
#define QRT_I8_ISA "amx-int8"
#define I8_AMX 1
#define I8_MR 16     /* an AMX tile's rows */
#define I8_ROWS 6    /* ... which avx512-vnni's register tiles take 6 at a time */
#define I8_MC 16     /* gemm_i8.h's blocks of rows: it gets a single-row tile at most */
#define I8_XALIGN 64 /* x's rows padded to whole AMX tiles of k (64 bytes), the padding 0 */
#include "i8_avx512vnni.h"
