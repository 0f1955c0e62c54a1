"""cuMemAlloc and the free memory cuMemGetInfo reports: what the slice's quota is
charged (``footprint``) must be what the device takes, or many small
allocations could hold more than the quota, or a quota could refuse memory
that is there."""

from __future__ import annotations

import pytest

from hvgpu.virtio import protocol as P
from tests.contract.backends import M, free, round_up, status


def test_allocations_are_distinct_aligned_and_each_holds_its_own_bytes(dev):
    sizes = [1, 700, 4096, M, M + 1, 3 * M]
    ptrs = [dev.mem_alloc(n) for n in sizes]
    try:
        spans = sorted(zip(ptrs, sizes))
        assert all(p % 256 == 0 for p in ptrs)  # CUDA promises at least 256
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        addr, view = dev.host_alloc(3 * M)
        s = dev.stream(0)
        try:
            for i, (p, n) in enumerate(zip(ptrs, sizes)):
                view[:n] = bytes([i + 1]) * n
                dev.memcpy_htod_async(p, addr, n, s)
            dev.stream_synchronize(s)
            for i, (p, n) in enumerate(zip(ptrs, sizes)):
                view[:n] = b"\0" * n
                dev.memcpy_dtoh_async(addr, p, n, s)
                dev.stream_synchronize(s)
                assert bytes(view[:n]) == bytes([i + 1]) * n, f"allocation {i} of {n} bytes"
        finally:
            dev.host_free(addr)
    finally:
        for p in ptrs:
            dev.mem_free(p)


@pytest.mark.parametrize("size", [M + 1, 2 * M, 2 * M + 1, 16 * M + 4096])
def test_an_allocation_above_1_mib_takes_whole_granules_as_footprint_says(dev, size):
    g = dev.mem_granularity(0)
    dev.mem_free(dev.mem_alloc(size))  # whatever a first allocation sets up, before measuring
    before = free(dev)
    ptr = dev.mem_alloc(size)
    taken = before - free(dev)
    dev.mem_free(ptr)
    assert taken == round_up(size, g), f"{size} bytes took {taken} of the device's free memory"
    assert dev.footprint(size) == taken  # what the quota is charged
    assert free(dev) == before  # and freeing gives it all back


@pytest.mark.parametrize("size", [1, 700, 3000, 64 * 1024])
def test_many_small_allocations_take_together_what_their_footprints_add_up_to(dev, size):
    """They share the driver's pages, so one alone may take a page or nothing; the sum
    of footprints is right within one page either way."""
    g = dev.mem_granularity(0)
    count = max(4 * M // dev.footprint(size), 64)
    before = free(dev)
    ptrs = [dev.mem_alloc(size) for _ in range(count)]
    taken = before - free(dev)
    for p in ptrs:
        dev.mem_free(p)
    charged = count * dev.footprint(size)
    assert abs(taken - charged) <= g, \
        f"{count} allocations of {size} bytes took {taken}; footprint charges {charged}"
    assert abs(before - free(dev)) <= g  # freed, they give their pages back


def test_an_allocation_larger_than_the_device_is_out_of_memory(dev):
    before = free(dev)
    too_big = round_up(dev.total_mem() + 1, dev.mem_granularity(0))
    assert status(dev.mem_alloc, too_big) == P.CUDA_ERROR_OUT_OF_MEMORY
    # nothing of it was taken (the H200's driver set up one page of its own, once)
    assert abs(free(dev) - before) <= dev.mem_granularity(0)


def test_zero_bytes_is_an_invalid_value(dev):
    assert status(dev.mem_alloc, 0) == P.CUDA_ERROR_INVALID_VALUE


def test_freeing_twice_or_inside_an_allocation_is_an_invalid_value(dev):
    ptr = dev.mem_alloc(4 * M)
    assert status(dev.mem_free, ptr + 4096) == P.CUDA_ERROR_INVALID_VALUE
    dev.mem_free(ptr)
    assert status(dev.mem_free, ptr) == P.CUDA_ERROR_INVALID_VALUE


def test_mem_info_is_free_and_total_of_the_whole_device(dev):
    free_now, total = dev.mem_info()
    assert total == dev.total_mem()
    assert 0 < free_now <= total


def _allocate_in_window(dev, sizes):
    """(address, what it took of free memory, its footprint) of each size, freed after."""
    seen = []
    for size in sizes:
        before = free(dev)
        ptr = dev.mem_alloc(size)
        seen.append((ptr, before - free(dev), dev.footprint(size)))
        dev.mem_free(ptr)
    return seen, dev.mem_granularity(0)


def test_a_vgpu_past_the_first_allocates_whole_granules_inside_its_address_window(isolated):
    from hvgpu.host.executor.address_window import WINDOW_SIZE, window_hint

    sizes = [1, 4096, M + 1, 2 * M]
    seen, g = isolated(_allocate_in_window, sizes, address_window=1)
    start = window_hint(1)
    for size, (ptr, taken, footprint) in zip(sizes, seen):
        assert start <= ptr < start + WINDOW_SIZE and ptr % g == 0, hex(ptr)
        assert taken == footprint == round_up(size, g), (size, taken, footprint)
