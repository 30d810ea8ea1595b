"""The data section checksum (qrt/kernels/checksum.h): XXH64 checked against the xxhash package, and the
1 MiB block tree recomputed in Python.

xxhash is a dev requirement, so it is imported inside the tests that need it: without it they fail, they do
not skip."""

import mmap

import numpy as np
import pytest

from qrt import _kernels

BLOCK = 1 << 20
EMPTY = 0xEF46DB3751D8E999  # the spec's XXH64 of zero bytes, seed 0
BIG_SEED = 0x9E3779B97F4A7C15
LENGTHS = [*range(71), BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5]


def random_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def reference_checksum(data: bytes) -> int:
    import xxhash

    digests = b"".join(
        xxhash.xxh64_intdigest(data[i : i + BLOCK]).to_bytes(8, "little") for i in range(0, len(data), BLOCK)
    )
    return xxhash.xxh64_intdigest(digests)


def test_known_vectors():
    assert _kernels.xxh64(b"") == EMPTY
    assert _kernels.xxh64(b"abc") == 0x44BC2CF5AD770999
    assert _kernels.data_checksum(b"") == EMPTY


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("seed", [0, BIG_SEED])
def test_xxh64_matches_xxhash(n, seed):
    import xxhash

    data = random_bytes(n + 7, n)
    for offset in range(8):  # offsets 1..7 start the input off an 8-byte boundary
        expected = xxhash.xxh64_intdigest(data[offset : offset + n], seed)
        assert _kernels.xxh64(memoryview(data)[offset : offset + n], seed) == expected


@pytest.mark.parametrize("n", [0, 1, 70, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 5, 9 * BLOCK + 3])
def test_block_tree_matches_xxhash(n):
    data = random_bytes(n, n)
    expected = reference_checksum(data)
    for threads in (0, 1, 2, 3):
        assert _kernels.data_checksum(data, threads) == expected
    assert _kernels.data_checksum(np.frombuffer(data, np.uint8), 2) == expected
    padded = b"\0" + data
    assert _kernels.data_checksum(memoryview(padded)[1:], 3) == expected


def test_buffer_kinds(tmp_path):
    data = random_bytes(2 * BLOCK + 17)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert _kernels.data_checksum(m) == _kernels.data_checksum(data)
    assert _kernels.data_checksum(bytearray(data)) == _kernels.data_checksum(data)


def test_rejects_bad_input():
    with pytest.raises(TypeError):
        _kernels.data_checksum(None)
    with pytest.raises((ValueError, TypeError)):
        _kernels.data_checksum(np.zeros(8, np.uint8)[::2])  # not contiguous
    with pytest.raises(OverflowError):
        _kernels.xxh64(b"", -1)
