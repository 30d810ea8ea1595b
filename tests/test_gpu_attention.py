"""matmul and attention on the GPU give the CPU backend's bits (skipped without a GPU).

The CPU's bits are held to the documented order by tests/test_ops_attention.py; here the CUDA kernels
(qrt/cuda/attention.cu) are held to the CPU's, through the GPU execution plan (a CUDA graph), at odd sizes,
with broadcast batches, masks of both kinds broadcast over rows and heads, causal rows, rows masked out entirely,
more keys than one reduction block (256), and the run-time checks. Without a GPU, the batch sizes and strides
the kernels walk are held to the CPU's offsets.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import _MISSING, _compare, _op_model

import qrt
from qrt.builder import GraphBuilder
from qrt.cpu.attention import batch_offsets
from qrt.gpu.attention import BATCH_RANK, batch_args

needs_gpu = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")
RNG = np.random.default_rng(3838)


def _normal(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 1.5).astype(np.float32)


@needs_gpu
@pytest.mark.parametrize(("sa", "sb"), [((5, 3), (3, 33)), ((3, 1, 9, 40), (4, 40, 31)), ((6, 0), (0, 5)),
                                        ((1, 13, 700), (700, 65))])
def test_matmul(tmp_path, sa, sb):
    path = _op_model(tmp_path, "matmul", {"a": [None] * len(sa), "b": [None] * len(sb)})
    _compare(path, {"a": _normal(*sa), "b": _normal(*sb)})


# (q batch, k/v batch, L, S, E, Ev, mask shape or None, mask dtype, is_causal)
CASES = [
    ((2, 3), (2, 3), 7, 9, 5, 6, (2, 1, 7, 9), "bool", False),
    ((3,), (1,), 5, 17, 8, 3, (17,), "float32", False),
    ((2, 2), (2, 2), 6, 33, 32, 32, (2, 1, 1, 33), "float32", False),
    ((1,), (1,), 3, 300, 4, 5, (3, 300), "bool", False),
    ((2,), (2,), 9, 4, 3, 17, None, None, True),
    ((2, 12), (2, 12), 128, 128, 32, 32, (2, 1, 1, 128), "float32", False),
]


@needs_gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_attention(tmp_path, case):
    batch_q, batch_kv, lq, s, e, ev, mask_shape, dtype, causal = case
    inputs = {"q": _normal(*batch_q, lq, e), "k": _normal(*batch_kv, s, e), "v": _normal(*batch_kv, s, ev)}
    if mask_shape is not None:
        keep = RNG.random(mask_shape) > 0.3
        keep[..., 0, :] = False  # a row masked out entirely
        inputs["mask"] = keep if dtype == "bool" else np.where(keep, _normal(*mask_shape), np.float32(-np.inf))
    b = GraphBuilder()
    ports = {p: b.input(p, a.dtype.name, [None] * a.ndim) for p, a in inputs.items()}
    b.output(b.node("attention", ports, {"is_causal": causal, "scale": None if causal else 0.3}))
    b.save(tmp_path / "attention.qrt")
    _compare(tmp_path / "attention.qrt", inputs)


@needs_gpu
def test_attention_checks(tmp_path):
    path = _op_model(tmp_path, "attention", {"q": [None, None, 4], "k": [None, None, 4], "v": [None, None, 6]})
    model = qrt.load(path, device="cuda")
    with pytest.raises(ValueError, match="the same number of keys"):
        model.run({"q": _normal(2, 3, 4), "k": _normal(2, 5, 4), "v": _normal(2, 4, 6)})
    with pytest.raises(ValueError, match="takes at most 12288"):
        model.run({"q": _normal(1, 1, 4), "k": _normal(1, 12289, 4), "v": _normal(1, 12289, 6)})


@pytest.mark.parametrize(("batch", "shape"), [((), ()), ((2, 3), (2, 1)), ((2, 3), (3,)), ((4, 1, 5), (1, 1, 5)),
                                              ((2, 3, 4, 5, 6, 7), (3, 1, 5, 1, 7))])
def test_batch_strides_give_the_cpus_offsets(batch, shape):
    """Runs without a GPU: the sizes and strides attention.cu walks give every batch the offset the CPU uses."""
    args = batch_args(batch, [(shape, 11)])
    sizes, strides = [int(v) for v in args[:BATCH_RANK]], [int(v) for v in args[BATCH_RANK:]]
    offsets = []
    for b in range(int(np.prod(batch))):
        off = 0
        for size, stride in zip(sizes, strides):
            b, i = divmod(b, size)
            off += i * stride
        offsets.append(off)
    np.testing.assert_array_equal(offsets, batch_offsets(shape, batch, 11))
