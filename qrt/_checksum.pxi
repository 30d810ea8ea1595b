# The data section's integrity checksum (included by _kernels.pyx), defined in qrt/kernels/checksum.h:
# XXH64 of the XXH64 digests of its 1 MiB blocks. The blocks hash on all threads without the GIL.

from libc.stdint cimport uint64_t

cdef extern from "checksum.h" nogil:
    uint64_t qrt_xxh64(const uint8_t* p, size_t len, uint64_t seed)
    uint64_t qrt_checksum_combine(const uint64_t* digests, size_t nblocks)
    size_t QRT_CHECKSUM_BLOCK


def data_checksum(const uint8_t[::1] data not None, int threads=0) -> int:
    """The checksum of data (a contiguous byte buffer: bytes, mmap, memoryview, uint8 array) on `threads`
    threads (<= 0: the current get_num_threads()). The result does not depend on the thread count."""
    cdef Py_ssize_t n = data.shape[0], block = QRT_CHECKSUM_BLOCK, b
    cdef Py_ssize_t nblocks = (n + block - 1) // block
    cdef int parts = <int>max(1, min(<Py_ssize_t>(threads if threads > 0 else num_threads), nblocks))
    cdef const uint8_t* p = &data[0] if n else NULL
    cdef uint64_t result
    cdef uint64_t* digests = <uint64_t*>malloc(max(nblocks, 1) * sizeof(uint64_t))
    if digests == NULL:
        raise MemoryError()
    try:
        with nogil:
            # dynamic: a thread sharing its core with another process does not hold the others up
            for b in prange(nblocks, num_threads=parts, schedule="dynamic"):
                digests[b] = qrt_xxh64(p + b * block, min(block, n - b * block), 0)
            result = qrt_checksum_combine(digests, nblocks)
    finally:
        free(digests)
    return result


def xxh64(const uint8_t[::1] data not None, uint64_t seed=0) -> int:
    """XXH64 of data with the given seed (for tests: the checksum's building block)."""
    cdef uint64_t h
    with nogil:
        h = qrt_xxh64(&data[0] if data.shape[0] else NULL, data.shape[0], seed)
    return h
