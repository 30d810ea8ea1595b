"""Fixtures shared by the test files."""

import pytest

import qrt
from qrt import _kernels as K

RUNNABLE = [name for name, ok in K.kernel_variants().items() if ok]  # the kernel variants this CPU runs


@pytest.fixture(params=RUNNABLE)
def variant(request):
    """Prepare the weights (or models) of the test with this kernel variant; every variant reads the same
    packed layout and must give the same bits."""
    before = K._use_variant(request.param)
    yield request.param
    K._use_variant(before)


@pytest.fixture(params=[1, 2, 3], ids=["1thread", "2threads", "3threads"])
def threads(request):
    """Run with this many threads, splitting even the smallest call into one task a row: a result must not
    depend on the split."""
    before = qrt.get_num_threads()
    qrt.set_num_threads(request.param)
    floors = K._set_min_work(1, 1, 1)
    yield request.param
    K._set_min_work(*floors)
    qrt.set_num_threads(before)


@pytest.fixture
def every_build() -> dict:
    """Runs the body under each float-op build this CPU runs: the kernel variant picks it at prepare time."""
    builds = {}
    for name, ok in K.kernel_variants().items():
        before = K._use_variant(name) if ok else None
        try:
            if ok:
                builds.setdefault(K.FloatOps().name, name)
        finally:
            if ok:
                K._use_variant(before)
    return builds
