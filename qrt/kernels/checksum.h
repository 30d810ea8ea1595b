/* The integrity checksum of a .qrt data section (format version 4), written in the header as "xxh64-1m:"
 * followed by 16 lowercase hex digits. Its definition is part of the file format:
 *
 * - XXH64 is Yann Collet's xxHash, 64-bit variant, as specified at
 *   https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md; every XXH64 here uses seed 0.
 * - The data section is split into blocks of 1 MiB (1048576 bytes); the last block may be shorter; an
 *   empty data section has zero blocks.
 * - Each block's XXH64 digest is written as 8 bytes little-endian; the checksum is the XXH64 of the
 *   concatenation of those digests (so an empty section's checksum is XXH64 of zero bytes,
 *   0xEF46DB3751D8E999).
 *
 * The blocks hash independently, so threads share the work (qrt/_checksum.pxi) and the result does not
 * depend on how many there are. Portable C99: inputs are read byte by byte into little-endian words,
 * which is correct at any alignment and on any byte order; optimising compilers merge each into one load.
 */
#ifndef QRT_KERNELS_CHECKSUM_H
#define QRT_KERNELS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define QRT_CHECKSUM_BLOCK ((size_t)1 << 20)

#define QRT_XXH_P1 UINT64_C(0x9E3779B185EBCA87)
#define QRT_XXH_P2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define QRT_XXH_P3 UINT64_C(0x165667B19E3779F9)
#define QRT_XXH_P4 UINT64_C(0x85EBCA77C2B2AE63)
#define QRT_XXH_P5 UINT64_C(0x27D4EB2F165667C5)

static inline uint64_t qrt_xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t qrt_xxh_le64(const uint8_t* p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

static inline uint64_t qrt_xxh_le32(const uint8_t* p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static inline uint64_t qrt_xxh_round(uint64_t acc, uint64_t lane) {
    return qrt_xxh_rotl(acc + lane * QRT_XXH_P2, 31) * QRT_XXH_P1;
}

static inline uint64_t qrt_xxh_merge(uint64_t acc, uint64_t v) {
    return (acc ^ qrt_xxh_round(0, v)) * QRT_XXH_P1 + QRT_XXH_P4;
}

/* The four accumulators of the stripes merged into one (the spec's steps 3 and 4). */
static inline uint64_t qrt_xxh_converge(uint64_t v1, uint64_t v2, uint64_t v3, uint64_t v4) {
    uint64_t acc = qrt_xxh_rotl(v1, 1) + qrt_xxh_rotl(v2, 7) + qrt_xxh_rotl(v3, 12) + qrt_xxh_rotl(v4, 18);
    return qrt_xxh_merge(qrt_xxh_merge(qrt_xxh_merge(qrt_xxh_merge(acc, v1), v2), v3), v4);
}

static inline uint64_t qrt_xxh_lane(uint64_t acc, uint64_t lane) {
    return qrt_xxh_rotl(acc ^ qrt_xxh_round(0, lane), 27) * QRT_XXH_P1 + QRT_XXH_P4;
}

static inline uint64_t qrt_xxh_avalanche(uint64_t acc) {
    acc = (acc ^ (acc >> 33)) * QRT_XXH_P2;
    acc = (acc ^ (acc >> 29)) * QRT_XXH_P3;
    return acc ^ (acc >> 32);
}

static inline uint64_t qrt_xxh64(const uint8_t* p, size_t len, uint64_t seed) {
    size_t left = len; /* counted down rather than compared with an end pointer: p may be NULL when len is 0 */
    uint64_t acc;
    if (left >= 32) {
        /* Four independent lanes: each round waits only on its own lane's previous multiply. */
        uint64_t v1 = seed + QRT_XXH_P1 + QRT_XXH_P2, v2 = seed + QRT_XXH_P2, v3 = seed, v4 = seed - QRT_XXH_P1;
        do {
            v1 = qrt_xxh_round(v1, qrt_xxh_le64(p));
            v2 = qrt_xxh_round(v2, qrt_xxh_le64(p + 8));
            v3 = qrt_xxh_round(v3, qrt_xxh_le64(p + 16));
            v4 = qrt_xxh_round(v4, qrt_xxh_le64(p + 24));
            p += 32;
            left -= 32;
        } while (left >= 32);
        acc = qrt_xxh_converge(v1, v2, v3, v4);
    } else {
        acc = seed + QRT_XXH_P5;
    }
    acc += (uint64_t)len;
    for (; left >= 8; p += 8, left -= 8) acc = qrt_xxh_lane(acc, qrt_xxh_le64(p));
    if (left >= 4) {
        acc = qrt_xxh_rotl(acc ^ qrt_xxh_le32(p) * QRT_XXH_P1, 23) * QRT_XXH_P2 + QRT_XXH_P3;
        p += 4;
        left -= 4;
    }
    for (; left > 0; p++, left--) acc = qrt_xxh_rotl(acc ^ *p * QRT_XXH_P5, 11) * QRT_XXH_P1;
    return qrt_xxh_avalanche(acc);
}

/* XXH64 of the digests written as 8 bytes little-endian each: reading those bytes back as little-endian
 * words gives the digests themselves, so they are hashed as lanes directly, with no buffer. */
static inline uint64_t qrt_checksum_combine(const uint64_t* digests, size_t nblocks) {
    size_t i = 0;
    uint64_t acc;
    if (nblocks >= 4) {
        uint64_t v1 = QRT_XXH_P1 + QRT_XXH_P2, v2 = QRT_XXH_P2, v3 = 0, v4 = (uint64_t)0 - QRT_XXH_P1;
        for (; nblocks - i >= 4; i += 4) {
            v1 = qrt_xxh_round(v1, digests[i]);
            v2 = qrt_xxh_round(v2, digests[i + 1]);
            v3 = qrt_xxh_round(v3, digests[i + 2]);
            v4 = qrt_xxh_round(v4, digests[i + 3]);
        }
        acc = qrt_xxh_converge(v1, v2, v3, v4);
    } else {
        acc = QRT_XXH_P5;
    }
    acc += (uint64_t)nblocks * 8;
    for (; i < nblocks; i++) acc = qrt_xxh_lane(acc, digests[i]);
    return qrt_xxh_avalanche(acc);
}

#endif /* QRT_KERNELS_CHECKSUM_H */
