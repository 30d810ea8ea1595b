# The data section's integrity checksum (included by _kernels.pyx), defined in qrt/kernels/checksum.h:
# XXH64 of the XXH64 digests of its 1 MiB blocks. The blocks hash on all threads without the GIL.


cdef extern from "checksum.h" nogil:
    uint64_t qrt_xxh64(const uint8_t* p, size_t len, uint64_t seed)
    uint64_t qrt_checksum_combine(const uint64_t* digests, size_t nblocks)
    size_t QRT_CHECKSUM_BLOCK


cdef struct checksum_job:  # task t hashes the t-th chunk of the blocks
    const uint8_t* p
    Py_ssize_t n, nblocks, parts
    uint64_t* digests


cdef void checksum_task(void* ctx, ptrdiff_t t) noexcept nogil:
    cdef checksum_job* j = <checksum_job*>ctx
    cdef Py_ssize_t block = QRT_CHECKSUM_BLOCK, b
    for b in range(chunk(j.nblocks, j.parts, t), chunk(j.nblocks, j.parts, t + 1)):
        j.digests[b] = qrt_xxh64(j.p + b * block, min(block, j.n - b * block), 0)


def data_checksum(const uint8_t[::1] data not None, int threads=0) -> int:
    """The checksum of data (a contiguous byte buffer: bytes, mmap, memoryview, uint8 array), split for
    `threads` threads (<= 0: the current get_num_threads()) on the kernels' pool. The result does not
    depend on the split."""
    cdef Py_ssize_t n = data.shape[0], block = QRT_CHECKSUM_BLOCK
    cdef checksum_job j
    j.p, j.n, j.nblocks = &data[0] if n else NULL, n, (n + block - 1) // block
    # several tasks a thread: one that shares its core with another process does not hold the others up
    j.parts = max(1, min(<Py_ssize_t>(threads if threads > 0 else num_threads) * 4, j.nblocks))
    j.digests = <uint64_t*>malloc(max(j.nblocks, 1) * sizeof(uint64_t))
    cdef uint64_t result
    if j.digests == NULL:
        raise MemoryError()
    try:
        with nogil:
            qrt_parallel_for(j.parts, <int>j.parts - 1, checksum_task, &j)
            result = qrt_checksum_combine(j.digests, j.nblocks)
    finally:
        free(j.digests)
    return result


def xxh64(const uint8_t[::1] data not None, uint64_t seed=0) -> int:
    """XXH64 of data with the given seed (for tests: the checksum's building block)."""
    cdef uint64_t h
    with nogil:
        h = qrt_xxh64(&data[0] if data.shape[0] else NULL, data.shape[0], seed)
    return h
