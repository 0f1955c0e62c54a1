"""Stream-ordered memory pools as pools.py drives them: the slice is charged what a
pool holds of the driver's memory (RESERVED_MEM_CURRENT), so that figure must be
what the device's free memory falls by; a pool whose release threshold is
UINT64_MAX keeps its memory through synchronisations, and a trim gives it back."""

from __future__ import annotations

import pytest

from hvgpu.virtio import protocol as P
from tests.contract.backends import M, free, round_up, status

# CUmemPool_attribute
REUSE = (1, 2, 3)
RELEASE_THRESHOLD, RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH = 4, 5, 6, 7, 8
KEEP_ALL = (1 << 64) - 1  # the release threshold pools.py gives a charged pool


@pytest.fixture
def stream(dev):
    s = dev.stream_create(1)
    yield s
    dev.stream_synchronize(s)
    dev.stream_destroy(s)


@pytest.fixture
def pool(dev):
    p = dev.pool_create(0)
    yield p
    dev.synchronize()
    dev.pool_trim(p, 0)
    dev.pool_destroy(p)


def _figures(dev, pool) -> dict:
    return {a: dev.pool_attribute(pool, a) for a in (RESERVED_CURRENT, RESERVED_HIGH,
                                                     USED_CURRENT, USED_HIGH)}


def test_a_new_pool_holds_nothing_reuses_freely_and_releases_everything(dev, pool):
    assert {a: dev.pool_attribute(pool, a) for a in range(1, 9)} == {
        1: 1, 2: 1, 3: 1, RELEASE_THRESHOLD: 0, RESERVED_CURRENT: 0, RESERVED_HIGH: 0,
        USED_CURRENT: 0, USED_HIGH: 0}


def test_what_a_pool_reserves_is_what_the_device_gives_it(dev, pool, stream):
    g = dev.mem_granularity(0)
    before = free(dev)
    ptr = dev.pool_alloc(3 * M + 100, pool, stream)
    dev.stream_synchronize(stream)
    got = _figures(dev, pool)
    reserved = got[RESERVED_CURRENT]
    assert 3 * M + 100 <= got[USED_CURRENT] <= reserved and reserved % g == 0, got
    assert before - free(dev) == reserved  # what pools.py charges the slice
    assert got[RESERVED_HIGH] >= reserved and got[USED_HIGH] >= got[USED_CURRENT]
    dev.pool_free(ptr, stream)


def test_a_pool_that_keeps_everything_gives_memory_back_only_when_trimmed(dev, pool, stream):
    dev.pool_set_attribute(pool, RELEASE_THRESHOLD, KEEP_ALL)
    assert dev.pool_attribute(pool, RELEASE_THRESHOLD) == KEEP_ALL
    before = free(dev)
    ptr = dev.pool_alloc(8 * M, pool, stream)
    dev.stream_synchronize(stream)
    held = dev.pool_attribute(pool, RESERVED_CURRENT)
    dev.pool_free(ptr, stream)
    dev.stream_synchronize(stream)
    dev.synchronize()  # no synchronisation of any kind gives it back
    got = _figures(dev, pool)
    assert got[RESERVED_CURRENT] == held and got[USED_CURRENT] == 0, got
    assert before - free(dev) == held
    dev.pool_trim(pool, 0)
    got = _figures(dev, pool)
    assert got[RESERVED_CURRENT] == 0 and free(dev) == before, got
    assert got[RESERVED_HIGH] == held and got[USED_HIGH] >= 8 * M  # high marks stay


def test_a_trim_keeps_at_least_what_it_is_asked_to_keep(dev, pool, stream):
    dev.pool_set_attribute(pool, RELEASE_THRESHOLD, KEEP_ALL)
    ptr = dev.pool_alloc(8 * M, pool, stream)
    dev.pool_free(ptr, stream)
    dev.stream_synchronize(stream)
    held = dev.pool_attribute(pool, RESERVED_CURRENT)
    dev.pool_trim(pool, 4 * M)
    assert dev.pool_attribute(pool, RESERVED_CURRENT) >= 4 * M  # cuMemPoolTrimTo's promise
    dev.pool_trim(pool, held + 1)  # more than it holds: nothing to do
    assert dev.pool_attribute(pool, RESERVED_CURRENT) >= 4 * M
    dev.pool_trim(pool, 0)
    assert dev.pool_attribute(pool, RESERVED_CURRENT) == 0


def test_at_the_default_threshold_a_synchronisation_gives_freed_memory_back(dev, pool, stream):
    before = free(dev)
    ptr = dev.pool_alloc(8 * M, pool, stream)
    dev.pool_free(ptr, stream)
    dev.stream_synchronize(stream)
    assert dev.pool_attribute(pool, RESERVED_CURRENT) == 0
    assert free(dev) == before


def test_memory_freed_on_a_stream_is_reused_by_the_next_allocation_there(dev, pool, stream):
    dev.pool_set_attribute(pool, RELEASE_THRESHOLD, KEEP_ALL)
    dev.pool_free(dev.pool_alloc(4 * M, pool, stream), stream)
    held = dev.pool_attribute(pool, RESERVED_CURRENT)
    ptr = dev.pool_alloc(4 * M, pool, stream)  # no synchronisation in between
    assert dev.pool_attribute(pool, RESERVED_CURRENT) == held
    dev.pool_free(ptr, stream)


def test_resetting_a_high_mark_restarts_it_from_what_is_held_now(dev, pool, stream):
    dev.pool_set_attribute(pool, RELEASE_THRESHOLD, KEEP_ALL)
    big = dev.pool_alloc(16 * M, pool, stream)
    small = dev.pool_alloc(M, pool, stream)
    dev.pool_free(big, stream)
    dev.stream_synchronize(stream)
    dev.pool_trim(pool, 0)
    now = _figures(dev, pool)
    assert now[USED_HIGH] > now[USED_CURRENT] > 0
    dev.pool_set_attribute(pool, RESERVED_HIGH, 0)
    dev.pool_set_attribute(pool, USED_HIGH, 0)
    got = _figures(dev, pool)
    assert got[RESERVED_HIGH] == got[RESERVED_CURRENT] == now[RESERVED_CURRENT]
    assert got[USED_HIGH] == got[USED_CURRENT] == now[USED_CURRENT]
    dev.pool_free(small, stream)


def test_pool_memory_holds_the_bytes_copied_in_stream_order(dev, pool, stream):
    addr, view = dev.host_alloc(M)
    try:
        ptr = dev.pool_alloc(M, pool, stream)
        view[:] = bytes(range(256)) * (M // 256)
        dev.memcpy_htod_async(ptr, addr, M, stream)
        view[:] = b"\0" * M
        dev.memcpy_dtoh_async(addr, ptr, M, stream)
        dev.pool_free(ptr, stream)
        dev.stream_synchronize(stream)
        assert bytes(view) == bytes(range(256)) * (M // 256)
    finally:
        dev.host_free(addr)


def test_a_pool_allocation_larger_than_the_device_is_out_of_memory(dev, pool, stream):
    too_big = round_up(dev.total_mem() + 1, dev.mem_granularity(0))
    assert status(dev.pool_alloc, too_big, pool, stream) == P.CUDA_ERROR_OUT_OF_MEMORY


def test_a_pool_grows_no_further_than_its_maximum_size(dev, stream):
    pool = dev.pool_create(64 * M)
    try:
        assert status(dev.pool_alloc, 128 * M, pool, stream) == P.CUDA_ERROR_OUT_OF_MEMORY
        dev.pool_free(dev.pool_alloc(32 * M, pool, stream), stream)
    finally:
        dev.stream_synchronize(stream)
        dev.pool_trim(pool, 0)
        dev.pool_destroy(pool)
