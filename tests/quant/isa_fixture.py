"""The quant tests' `isa` fixture: each test once per instruction set this CPU's kernels run (skipped
without native kernels), the kernels switched to it for the test. Import it into a test module."""

import pytest

from fastdecode import kernels

ISAS = kernels.available_isas()


@pytest.fixture(params=ISAS or [None], ids=lambda i: i or "no-native")
def isa(request):
    if request.param is None:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    before = kernels.active_isa()
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(before)
