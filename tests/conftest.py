"""Fixtures shared by the test files."""

import pytest

from qrt import _kernels as K

RUNNABLE = [name for name, ok in K.kernel_variants().items() if ok]  # the kernel variants this CPU runs


@pytest.fixture(params=RUNNABLE)
def variant(request):
    """Prepare the weights (or models) of the test with this kernel variant; every variant reads the same
    packed layout and must give the same bits."""
    before = K._use_variant(request.param)
    yield request.param
    K._use_variant(before)
