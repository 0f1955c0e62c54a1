"""The two implementations of ``GpuDevice`` the contract holds to one standard, and
the small helpers its tests share.

"double" is tests/fake_gpu.FakeDevice; "driver" is the product's own
cuda_device.CudaDevice on device 0, the class the executor runs. Nothing here
may know an answer for one backend that it does not ask of the other: the
tests compare what each says, by CUDA's status numbers and by the free memory
each reports.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from hvgpu.errors import CudaError
from tests.fake_gpu import FakeDevice

M = 1 << 20


def open_device(backend: str, address_window: int = 0):
    if backend == "double":
        return FakeDevice(0, address_window)
    from hvgpu.host.executor.cuda_device import CudaDevice  # the one CUDA importer
    return CudaDevice(0, address_window)


def status(call, *args) -> int:
    """CUDA's status for ``call(*args)``: 0 when it succeeds."""
    try:
        call(*args)
    except CudaError as exc:
        return exc.status
    return 0


def free(dev) -> int:
    return dev.mem_info()[0]


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def run_isolated(backend: str, fn, *args, address_window: int = 0):
    """``fn(device, *args)`` on a device of its own: for the driver, in a fresh process
    (a kernel fault poisons every later call of its context, and the suite's other
    tests share one), so ``fn`` is a module-level function that returns plain data."""
    if backend == "double":
        dev = open_device(backend, address_window)
        try:
            return fn(dev, *args)
        finally:
            dev.close()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_in_fresh_process, backend, fn, args, address_window).result(300)


def _in_fresh_process(backend, fn, args, address_window):
    return fn(open_device(backend, address_window), *args)
