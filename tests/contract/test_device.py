"""What the executor reads of the device itself and passes to the guest as its own."""

from __future__ import annotations

import ctypes
import mmap

from hvgpu.virtio import protocol as P
from tests.contract.backends import status

# CUdevice_attribute
_MAX_THREADS_PER_BLOCK = 1
_MAX_THREADS_PER_MULTIPROCESSOR = 39
_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
_MEMORY_POOLS_SUPPORTED = 115


def test_the_device_answers_what_the_executor_serves(dev):
    assert dev.name() and len(dev.uuid()) == 16
    assert dev.driver_version() >= 12040  # cuFuncGetParamInfo, which the guest relies on
    assert dev.attribute(_MAX_THREADS_PER_BLOCK) == 1024
    assert dev.attribute(_MAX_THREADS_PER_MULTIPROCESSOR) >= 1024
    # the shim unhides VMM and pools because the executor serves them
    assert dev.attribute(_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 1
    assert dev.attribute(_MEMORY_POOLS_SUPPORTED) == 1


def test_an_unknown_attribute_or_limit_is_an_invalid_value(dev):
    assert status(dev.attribute, 100000) == P.CUDA_ERROR_INVALID_VALUE
    assert status(dev.ctx_limit, 1000) == P.CUDA_ERROR_INVALID_VALUE


def test_stream_priorities_run_from_0_down_to_a_negative_greatest(dev):
    least, greatest = dev.stream_priority_range()
    assert least == 0 and greatest < 0
    s = dev.stream_create(1, greatest)
    dev.stream_synchronize(s)
    dev.stream_destroy(s)


def test_host_memory_is_registered_once_and_unregistered_once(dev):
    buf = mmap.mmap(-1, 64 * 1024)  # whole pages, as the shared regions the executor maps
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    try:
        dev.host_register(addr, len(buf))
        assert status(dev.host_register, addr, len(buf)) == \
            P.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        dev.host_unregister(addr)
        assert status(dev.host_unregister, addr) == P.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    finally:
        buf.close()
