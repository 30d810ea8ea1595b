"""The GPU's execution plan (qrt/gpu/plan.py): one CUDA graph per set of input shapes, replayed per call.

Every check is bit for bit against the CPU backend: replays, new shapes, several threads at once,
CuPy inputs, and Model.stream() with its state in device memory. Skips, with the reason, without CuPy
or a GPU.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_gpu import _MISSING, _cell_model, _mlp

import qrt
from qrt.builder import GraphBuilder

pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")
RNG = np.random.default_rng(77)


def _bits(a) -> bytes:
    import cupy as cp

    return (cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)).tobytes()


def test_replays_and_new_shapes(tmp_path):
    path = _mlp(tmp_path)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    plan = cuda._plan
    for batch in (1, 7, 1, 7, 3):
        for _ in range(3):  # the first call of a shape is eager, the others replay its graph
            x = RNG.normal(0, 2, (batch, 4, 24)).astype(np.float32)
            assert _bits(cuda.run(x)) == _bits(cpu.run(x))
    assert plan.program_count() == 3  # one program per batch size


def test_several_threads_share_one_model(tmp_path):
    path = _mlp(tmp_path)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    xs = [RNG.normal(0, 2, (1 + i % 3, 4, 24)).astype(np.float32) for i in range(48)]
    want = [_bits(cpu.run(x)) for x in xs]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda x: _bits(cuda.run(x)), xs))
    assert got == want
    assert cuda._plan.program_count() >= 3  # busy programs of a shape make more, never share one


def test_cupy_inputs_stay_on_the_device(tmp_path):
    import cupy as cp

    path = _mlp(tmp_path)
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    x = RNG.normal(0, 2, (5, 4, 24)).astype(np.float32)
    for _ in range(3):
        y = cuda.run(cp.asarray(x))
        assert isinstance(y, cp.ndarray)
        assert _bits(y) == _bits(cpu.run(x))
    a, b = cuda.run(cp.asarray(x)), cuda.run(cp.asarray(x))
    assert a.data.ptr != b.data.ptr  # each call's outputs are new arrays, not the graph's buffers


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_stream_keeps_the_state_on_the_device(tmp_path, kind):
    import cupy as cp

    path = _cell_model(tmp_path, kind, 12, 40, "qint8")
    cpu, cuda = qrt.load(path), qrt.load(path, device="cuda")
    on_cpu, on_gpu, on_gpu_cupy = cpu.stream(), cuda.stream(), cuda.stream()
    for _ in range(8):
        x = RNG.normal(0, 1, (3, 12)).astype(np.float32)
        want, got, got_cp = on_cpu.step(x), on_gpu.step(x), on_gpu_cupy.step(cp.asarray(x))
        want, got, got_cp = (w if isinstance(w, tuple) else (w,) for w in (want, got, got_cp))
        assert all(isinstance(g, np.ndarray) for g in got)
        assert all(isinstance(g, cp.ndarray) for g in got_cp)
        assert [_bits(g) for g in got] == [_bits(w) for w in want] == [_bits(g) for g in got_cp]
        assert all(isinstance(s, cp.ndarray) for s in on_gpu.state.values())


def test_errors_name_the_node(tmp_path):
    b = GraphBuilder()
    x = b.input("x", "float32", [None, 6])
    s = b.node("softmax", {"x": x}, {"dim": 1}, name="sm")
    y = b.node("select", {"x": s}, {"dim": 0, "index": 2}, name="pick")
    b.output(y)
    path = tmp_path / "m.qrt"
    b.save(path)
    cuda = qrt.load(path, device="cuda")
    assert _bits(cuda.run(np.ones((3, 6), np.float32))) == _bits(qrt.load(path).run(np.ones((3, 6), np.float32)))
    with pytest.raises(ValueError, match=r"node 'pick' \(select\): index 2 is out of range"):
        cuda.run(np.ones((2, 6), np.float32))
