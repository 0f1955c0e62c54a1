"""Modules and kernels as the session loads and launches them.

The session charges a module load what the device's free memory fell by across
it (a ``__device__`` array takes device memory with no cuMemAlloc), so that
figure must be the array's own size, no less, and at most that in whole pages;
and fetching and running the module's kernels afterwards must take nothing more,
or the quota would miss it."""

from __future__ import annotations

import numpy as np
import pytest

from hvgpu.virtio import protocol as P
from tests.contract import ptx
from tests.contract.backends import M, free, round_up, run_isolated, status

ONE = (1, 1, 1)


def _warm_up(dev) -> None:
    """A first module and launch may set up what every later one shares; measured
    figures start after it."""
    module = dev.module_load(ptx.module(ptx.NOOP))
    dev.launch(dev.module_function(module, "noop"), ONE, ONE, 0, dev.stream(0), b"")
    dev.synchronize()
    dev.module_unload(module)


@pytest.mark.parametrize("size", [16 * M, 3 * M + 1000])
def test_a_device_array_takes_its_size_at_load_and_nothing_more_when_used(dev, size):
    g = dev.mem_granularity(0)
    _warm_up(dev)
    before = free(dev)
    module = dev.module_load(ptx.module(ptx.NOOP, arrays={"big": size}))
    taken = before - free(dev)  # what the session charges the slice
    try:
        assert size <= taken <= round_up(size, g), f"a {size}-byte array took {taken} at load"
        ptr, n = dev.module_global(module, "big")
        assert n == size and ptr % 8 == 0
        s = dev.stream(0)
        dev.memset_async(ptr + size - 4096, 0xA5, 1, 4096, s)  # it is device memory
        dev.launch(dev.module_function(module, "noop"), ONE, ONE, 0, s, b"")
        addr, view = dev.host_alloc(4096)
        dev.memcpy_dtoh_async(addr, ptr + size - 4096, 4096, s)
        dev.synchronize()
        assert bytes(view) == b"\xa5" * 4096
        dev.host_free(addr)
        assert before - free(dev) == taken, "fetching and running its kernel took more"
    finally:
        dev.module_unload(module)
    assert free(dev) == before  # unloading gives it all back


def test_kernel_parameters_are_laid_out_as_the_guest_packs_them(dev):
    module = dev.module_load(ptx.module(ptx.NOOP, ptx.SAXPY, ptx.SLEEP_MS))
    layouts = {name: dev.param_layout(dev.module_function(module, name))
               for name in ("noop", "saxpy", "sleep_ms")}
    dev.module_unload(module)
    assert layouts == {"noop": [], "saxpy": [(0, 4), (8, 8), (16, 8), (24, 4)],
                       "sleep_ms": [(0, 4)]}


def test_a_kernel_computes_in_stream_order(dev):
    n = 100_000
    module = dev.module_load(ptx.module(ptx.SAXPY))
    saxpy = dev.module_function(module, "saxpy")
    x, y = dev.mem_alloc(4 * n), dev.mem_alloc(4 * n)
    addr, view = dev.host_alloc(4 * n)
    host = np.frombuffer(view, dtype=np.float32)
    s = dev.stream_create(1)
    try:
        host[:] = np.arange(n, dtype=np.float32)
        dev.memcpy_htod_async(x, addr, 4 * n, s)
        dev.stream_synchronize(s)
        dev.memset_async(y, 0x3F800000, 4, n, s)  # 1.0f
        grid = (-(-n // 256), 1, 1)
        dev.launch(saxpy, grid, (256, 1, 1), 0, s, ptx.saxpy_params(2.5, x, y, n))
        dev.launch(saxpy, grid, (256, 1, 1), 0, s, ptx.saxpy_params(1.0, x, y, n))
        dev.memcpy_dtoh_async(addr, y, 4 * n, s)
        dev.stream_synchronize(s)
        assert np.array_equal(host, 3.5 * np.arange(n, dtype=np.float32) + 1)
    finally:
        dev.stream_destroy(s)
        dev.host_free(addr)
        dev.mem_free(x)
        dev.mem_free(y)
        dev.module_unload(module)


def test_what_a_kernel_allows_is_read_from_the_kernel(dev):
    module = dev.module_load(ptx.module(ptx.NOOP))
    noop = dev.module_function(module, "noop")
    try:
        assert dev.func_attribute(noop, 0) == 1024  # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        # with next to no registers or shared memory, threads per SM bound the blocks
        assert dev.occupancy_max_blocks(noop, 256, 0, 0) == dev.attribute(39) // 256
    finally:
        dev.module_unload(module)


def test_a_name_a_module_does_not_hold_is_not_found(dev):
    module = dev.module_load(ptx.module(ptx.NOOP, arrays={"small": 64}))
    try:
        assert status(dev.module_function, module, "missing") == P.CUDA_ERROR_NOT_FOUND
        assert status(dev.module_global, module, "missing") == P.CUDA_ERROR_NOT_FOUND
        assert dev.module_global(module, "small")[1] == 64
    finally:
        dev.module_unload(module)


def _load_statuses(dev, images):
    return [status(dev.module_load, image) for image in images]


def test_an_image_that_is_not_a_module_is_refused_with_what_it_claims_to_be(backend):
    """A guest hands these over as they are: the statuses are the driver's (in a process
    of its own, in case a driver takes one badly)."""
    statuses = run_isolated(backend, _load_statuses, [
        b"\x7fELF-not-really",  # an ELF header with nothing behind it: a bad cubin
        b"not a module at all",  # text that is no PTX either
    ])
    # the H200's driver: both are invalid images (not an INVALID_PTX for the text)
    assert statuses == [P.CUDA_ERROR_INVALID_IMAGE, P.CUDA_ERROR_INVALID_IMAGE]
