"""The contract between the executor and the GPU it drives.

Each test states one thing the executor's session relies on of ``GpuDevice``
and asserts it, the same way, on both backends: the test double
(tests/fake_gpu.py) everywhere, and the CUDA driver (``CudaDevice`` on device
0) under ``pytest -m gpu tests/contract``, skipped cleanly where there is no
GPU. Where the two disagree, the double is what is wrong: change it to match
the driver, never a test to match the double.

On the driver every test shares one context, so tests give back what they
take (another test's leftovers would move its figures of free memory), and
what may poison the context (a kernel fault) runs in a process of its own
(``isolated``).
"""

from __future__ import annotations

import functools

import pytest

from tests.contract.backends import open_device, run_isolated


@pytest.fixture(scope="session")
def _driver():
    dev = open_device("driver")
    yield dev
    dev.close()


@pytest.fixture(params=["double", pytest.param("driver", marks=pytest.mark.gpu)])
def backend(request):
    return request.param


@pytest.fixture
def dev(backend, request):
    """A device with nothing of this test's on it yet."""
    if backend == "double":
        device = open_device(backend)
        yield device
        device.close()
        return
    device = request.getfixturevalue("_driver")
    device.synchronize()
    yield device
    device.synchronize()


@pytest.fixture
def isolated(backend):
    """``isolated(fn, *args, address_window=0)``: ``fn(device, *args)`` on a device of
    its own (backends.run_isolated)."""
    return functools.partial(run_isolated, backend)
