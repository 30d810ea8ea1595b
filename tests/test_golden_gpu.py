"""The golden outputs on the GPU: every stored case reproduces tests/golden bit for bit with device="cuda".

The same files and comparison as tests/test_golden.py (raw bytes, no tolerance): the GPU backend
promises the CPU's bits for every op (docs/NUMERICS.md). Each case runs its stored runs twice through
one model: the first call of a shape runs the steps eagerly and captures its CUDA graph, the second
replays the graph, so both paths are held to the stored bits; then once more with CuPy inputs, which
must give the same bits as CuPy arrays. Skips, with the reason, without CuPy or a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_golden import CASES, GOLDEN, first_difference, load_runs
from test_gpu import _MISSING

import qrt

pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no GPU: {_MISSING}")


@pytest.mark.parametrize("case", CASES)
def test_golden_bit_identical_on_gpu(case: str) -> None:
    import cupy as cp

    model = qrt.load(os.path.join(GOLDEN, f"{case}.qrt"), device="cuda")
    runs, meta = load_runs(case)
    problems = []
    for call in ("eager", "graph", "cupy"):
        for i, (inputs, stored) in enumerate(runs):
            given = {k: cp.asarray(v) for k, v in inputs.items()} if call == "cupy" else inputs
            got = model.run(given)
            got = got if isinstance(got, tuple) else (got,)
            for spec, value in zip(model.outputs, got):
                if call == "cupy":
                    assert isinstance(value, cp.ndarray), f"{case}: CuPy inputs gave a {type(value).__name__}"
                    value = cp.asnumpy(value)
                diff = first_difference(np.asarray(value), stored[spec.name], f"[cuda {call}] {case} run {i} "
                                        f"output {spec.name!r}")
                if diff:
                    problems.append(diff)
    if problems:
        problems.append(f"the GPU differs from the stored outputs, written by kernels {meta.get('kernels')} "
                        f"on {meta.get('machine')}: a bug in the GPU backend, not in the files")
    assert not problems, "\n".join(problems)
