"""Golden reference outputs: every kernel variant on every machine reproduces tests/golden bit for bit.

tests/golden holds small models covering every op, with inputs and the outputs qrt's "portable"
kernel variant (plain C) produced for them (`make golden`, tests/golden/README.md). This test runs
them on every kernel variant of the importable build that this CPU can run (x86-64: amx-int8, avx512-vnni,
avx-vnni, avx2, portable; aarch64: neon-dotprod, neon, portable), each with several thread counts.

Tolerance: none. qrt's contract is identical bits on every CPU, variant and thread count: the
kernels fix the order of every float operation (linear_float included: fma chains in a fixed
order, no BLAS), never contract or reassociate, and integer accumulation is exact, so a vector or
ARM variant that differs from the portable one in any bit is a bug, not noise. The comparison is
on raw bytes (viewed as unsigned integers), so -0.0 vs 0.0 and the payload of an infinity count
too. The golden set holds no NaN outputs (the generator refuses them): NaN sign bits are the one
thing vector code is known to change.

Never regenerate the files to make this test pass; see tests/golden/README.md. Torch-free.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import numpy as np
import pytest

import qrt
from qrt import _kernels as K
from qrt.ops import OPS

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
CASES = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(GOLDEN, "*.qrt")))
# every kernel variant this CPU runs, best first; a model keeps the variant active when it was loaded
VARIANTS = [v for v, ok in K.kernel_variants().items() if ok]

# (threads, split every product and gate pass across them, one-step input projection blocks):
# the work floors keep these small models on one thread unless lowered, so lower them.
SETTINGS = {
    "threads1": (1, False, False),
    "threads2-split": (2, True, False),
    "threads3-split-step1": (3, True, True),
}
# The default variant (the one qrt picks here, or $QRT_KERNELS) runs every setting; the others run one
# thread and the most split setting, which keeps the file fast where the CPU is shared.
DEFAULT_VARIANT = K.kernel_variant()
RUNS = [(s, v) for v in VARIANTS for s in SETTINGS if v == DEFAULT_VARIANT or s != "threads2-split"]


def load_runs(case: str) -> tuple[list[tuple[dict, dict]], dict]:
    """[(inputs, outputs)] per stored run, and the producer info."""
    with np.load(os.path.join(GOLDEN, f"{case}.npz"), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("meta").item())
    runs: dict[int, tuple[dict, dict]] = {}
    for key, value in arrays.items():
        run, kind, name = key.split(".", 2)  # output names may hold dots: split twice only
        runs.setdefault(int(run[1:]), ({}, {}))[0 if kind == "in" else 1][name] = value
    return [runs[i] for i in sorted(runs)], meta


def first_difference(got: np.ndarray, want: np.ndarray, where: str) -> str | None:
    """None if got and want are the same bits, else a message naming the first differing element."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{where}: got {got.dtype}{list(got.shape)}, stored {want.dtype}{list(want.shape)}"
    bits = np.dtype(f"u{want.dtype.itemsize}")
    g, w = np.ascontiguousarray(got).view(bits).ravel(), np.ascontiguousarray(want).view(bits).ravel()
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return None
    i = int(bad[0])
    idx = tuple(int(j) for j in np.unravel_index(i, want.shape))
    hexw = 2 * want.dtype.itemsize
    return (
        f"{where}: {bad.size} of {w.size} elements differ; first at {list(idx)}: "
        f"got {got.ravel()[i]!r} (0x{int(g[i]):0{hexw}x}), stored {want.ravel()[i]!r} (0x{int(w[i]):0{hexw}x})"
    )


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Iterator[None]:
    threads, split, one_step = SETTINGS[request.param]
    before = qrt.get_num_threads()
    floors = K._set_min_work(1, 1, 1) if split else None
    proj = K._set_projection_bytes(1) if one_step else None
    qrt.set_num_threads(threads)
    try:
        yield
    finally:
        qrt.set_num_threads(before)
        if floors is not None:
            K._set_min_work(*floors)
        if proj is not None:
            K._set_projection_bytes(proj)


@pytest.fixture
def variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """Load models with kernel variant request.param (the test body's qrt.load), then restore the old one."""
    before = K._use_variant(request.param)
    try:
        yield request.param
    finally:
        K._use_variant(before)


def test_golden_files_exist() -> None:
    assert CASES, f"no golden cases in {GOLDEN}: run `make golden`"
    npz = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(GOLDEN, "*.npz")))
    assert npz == CASES, "every <case>.qrt needs its <case>.npz and no .npz may lack its model"


def test_portable_variant_runs_here() -> None:
    """The variant the golden files come from is in every build and runs on every CPU."""
    assert "portable" in VARIANTS, f"this CPU runs {VARIANTS}, not the portable variant"


def test_golden_covers_every_op() -> None:
    """A new op in the registry needs a golden case (tests/golden/make_golden.py) before it ships."""
    used = {node.op for case in CASES for node in qrt.load(os.path.join(GOLDEN, f"{case}.qrt")).graph.nodes}
    assert not set(OPS) - used, f"no golden case runs op(s) {sorted(set(OPS) - used)}"


@pytest.mark.parametrize(("settings", "variant"), RUNS, indirect=True, ids=[f"{v}-{s}" for s, v in RUNS])
@pytest.mark.parametrize("case", CASES)
def test_golden_bit_identical(case: str, settings: None, variant: str) -> None:
    model = qrt.load(os.path.join(GOLDEN, f"{case}.qrt"))
    info = K.kernel_variant_info()
    assert info["variant"] == variant, f"kernel variant {info['variant']!r} active, not {variant!r}"
    runs, meta = load_runs(case)
    assert runs, f"{case}.npz holds no runs"
    problems = []
    for i, (inputs, stored) in enumerate(runs):
        assert sorted(stored) == sorted(s.name for s in model.outputs), f"{case} run {i}: outputs do not match"
        with np.errstate(over="ignore"):  # the glue case overflows float32 on purpose
            got = model.run(inputs)
        got = got if isinstance(got, tuple) else (got,)
        for spec, value in zip(model.outputs, got):
            where = f"[{variant}] {case} run {i} output {spec.name!r}"
            diff = first_difference(np.asarray(value), stored[spec.name], where)
            if diff:
                problems.append(diff)
    if problems:
        problems.append(
            f"kernel variant {variant!r} ({info}) differs from the stored outputs, written by kernels "
            f"{meta.get('kernels')} on {meta.get('machine')}: a bug in variant {variant!r}, not in the files"
        )
    assert not problems, "\n".join(problems)
