"""Run-time inputs at the edges, many threads, long runs: defined behaviour, no leaks.

What qrt does with unusual inputs (docs/USER_GUIDE.md repeats this):
- NaN or infinity in an input that is quantized dynamically (linear_dynamic,
  the recurrent ops): ValueError. torch raises on NaN and gives undefined
  results on infinity (its zero point becomes a cast of NaN).
- NaN in quantize_per_tensor / quantize_per_channel: ValueError (torch maps it
  to 255 per tensor and 0 per channel); infinities saturate as in torch.
- An empty batch (0 rows) gives an empty output of the right shape.
- Non-contiguous arrays are copied; other byte orders are converted; any
  other dtype is a ValueError.
"""

import gc
import os
import threading

import numpy as np
import pytest

import qrt
from qrt.builder import GraphBuilder


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """x[?, 33] -> linear_dynamic(47) -> relu -> linear_dynamic(5), float16 weights in the middle."""
    rng = np.random.default_rng(0)
    g = GraphBuilder()
    x = g.input("x", "float32", [None, 33])
    h = g.node(
        "linear_dynamic",
        {
            "x": x,
            "weight": rng.integers(-128, 128, (47, 33), dtype=np.int8),
            "weight_scale": rng.uniform(0.001, 0.01, 47).astype(np.float32),
            "weight_zero_point": np.zeros(47, np.int32),
            "bias": rng.standard_normal(47).astype(np.float32),
        },
        name="fc1",
    )
    h = g.node("relu", {"x": h}, name="act")
    y = g.node("linear_dynamic", {"x": h, "weight": rng.standard_normal((5, 47)).astype(np.float16)}, name="fc2")
    g.output(y)
    path = tmp_path_factory.mktemp("robust") / "mlp.qrt"
    g.save(path)
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_dynamic_input_is_a_clear_error(mlp, bad):
    x = np.ones((2, 33), np.float32)
    x[1, 7] = bad
    with pytest.raises(ValueError, match="node 'fc1' .*NaN or infinity"):
        qrt.run(mlp, x)


def test_huge_finite_inputs_are_fine(mlp):
    x = np.full((1, 33), 3e38, np.float32)
    x[0, ::2] = -3e38
    assert qrt.run(mlp, x).shape == (1, 5)


def test_large_batch(mlp):
    x = np.random.default_rng(1).standard_normal((20_000, 33)).astype(np.float32)
    model = qrt.load(mlp)
    y = model.run(x)
    assert y.shape == (20_000, 5)
    # dynamic quantization takes the whole batch's range, so compare a batch with itself, not row by row
    np.testing.assert_array_equal(model.run(x), y)


def test_eight_threads_thousands_of_calls(mlp):
    model = qrt.load(mlp)
    rng = np.random.default_rng(2)
    cases = [rng.standard_normal((1 + i % 4, 33)).astype(np.float32) for i in range(32)]
    serial = [model.run(c) for c in cases]
    bad = []

    def worker(offset: int) -> None:
        for i in range(1500):
            k = (i * 7 + offset) % len(cases)
            if not np.array_equal(model.run(cases[k]), serial[k]):
                bad.append(k)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_memory_stays_flat_over_many_runs(mlp):
    """RSS after 20,000 more runs is what it was after the first 2,000 (bench/soak.py runs 100,000+)."""
    model = qrt.load(mlp)
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float32)
    for _ in range(2000):
        model.run(x)
    gc.collect()
    before = _rss_bytes()
    for _ in range(20_000):
        model.run(x)
    gc.collect()
    grown = _rss_bytes() - before
    # a leak of even one 20-float output per call would be 1.6 MB here; allocator noise is well under 1 MB
    assert grown < 1 << 20, f"resident memory grew by {grown} bytes over 20,000 runs"


def _mappings_of(path) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(str(path)))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_loading_and_dropping_releases_the_mapping(mlp):
    gc.collect()
    fds, maps = _open_fds(), _mappings_of(mlp)
    model = qrt.load(mlp)
    assert _mappings_of(mlp) == maps + 1, "the model file should be memory-mapped while loaded"
    del model
    for _ in range(200):
        qrt.run(mlp, np.zeros((1, 33), np.float32))
    gc.collect()
    assert _mappings_of(mlp) == maps
    assert _open_fds() == fds
