"""A hostile guest against device-mapped pinned memory (HOST_MAP) and stream memory
operations (STREAM_MEMOP): the executor maps only a whole allocation of the guest's own,
once, at page-aligned user-space addresses where nothing is mapped and no device
memory lies; the mapping goes with its room or region and with the connection; a
memory operation reaches only the guest's own device memory and device-mapped pinned
memory, never another connection's or the executor's; the session goes on after each
refusal."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

import pytest

from hvgpu.host.executor import host_maps
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from tests.fake_gpu import FakeDevice
from tests.security.test_regions import Guest, _device_regions

PAGE = mmap.PAGESIZE
INVALID, NOT_SUPPORTED = P.CUDA_ERROR_INVALID_VALUE, P.CUDA_ERROR_NOT_SUPPORTED


def free_address(size: int) -> int:
    """An address where nothing of this process is mapped (the executor is this process)."""
    probe = mmap.mmap(-1, size + 16 * PAGE)
    at = ctypes.addressof(ctypes.c_char.from_buffer(probe)) + 8 * PAGE
    probe.close()
    return at


def mapped_here(addr: int) -> bool:
    with open("/proc/self/maps") as f:
        return any(int(line.split("-")[0], 16) == addr for line in f)


def op(operation: int, address: int, value: int = 0, flags: int = 0) -> bytes:
    return struct.pack("<IIQQ", operation, flags, address, value)


def memop(guest, stream, call, ops: list[bytes], flags=0, count=None):
    raw = b"".join(ops)
    guest.post("STREAM_MEMOP", stream, flags, call, len(ops) if count is None else count, raw)
    return guest.call("CTX_SYNCHRONIZE")


@pytest.fixture
def guest():
    g = Guest()
    yield g
    g.close()


def _memfd_mapped(guest, size=2 * PAGE):
    fd, status, got = guest.attach_memfd(size)
    assert status == 0, got
    view = mmap.mmap(fd, size)
    os.close(fd)
    addr = free_address(size)
    status, got = guest.call("HOST_MAP", got[0], 0, 0, size, addr)
    assert status == 0 and got == (addr,), got
    return got and addr, view


def test_a_mapping_shares_the_guests_bytes_and_stream_memops_write_them(guest):
    fd, status, (region, _, size, _) = guest.attach_memfd(2 * PAGE)
    view = mmap.mmap(fd, size)
    os.close(fd)
    addr = free_address(size)
    assert guest.call("HOST_MAP", region, 0, 0, size, addr) == (0, (addr,))
    assert guest.device.host_mapped == {addr: size}  # registered device-mapped there
    dptr = guest.alloc(PAGE)
    status, _ = memop(guest, 0, P.MEMOP_BATCH, [op(2, addr + 8, 0xCAFE), op(5, dptr, 7),
                                                op(1, addr + 8, 0xCAFE, flags=1)])
    assert status == 0
    assert struct.unpack_from("<I", view, 8)[0] == 0xCAFE  # the guest's own bytes
    assert guest.device._load(dptr, 8) == struct.pack("<Q", 7)
    assert guest.call("REGION_DETACH", region)[0] == 0  # the mapping goes with it
    assert not mapped_here(addr) and not guest.device.host_mapped
    status, msg = memop(guest, 0, P.MEMOP_ONE, [op(2, addr, 1)])
    assert status == INVALID and "not inside any allocation" in msg
    view.close()


def test_host_map_takes_only_whole_allocations_of_the_guests_own_once(guest):
    fd, status, (region, _, size, _) = guest.attach_memfd(4 * PAGE)
    os.close(fd)
    addr = free_address(size)
    for bad in [(region + 7, 0, 0, size, addr),  # not a region of this connection
                (region, 1, 0, size, addr),  # reserved field
                (region, 0, PAGE, size - PAGE, addr),  # part of the region
                (region, 0, 0, size * 2, addr),  # more than it
                (region, 0, 0, size, addr + 8),  # not page-aligned
                (region, 0, 0, size, 4096),  # below user space
                (region, 0, 0, size, host_maps.HIGHEST - PAGE),  # above it
                (region, 0, 0, size, 1 << 63),  # the kernel's half
                (region, 0, 0, size, (1 << 64) - PAGE)]:  # wrapping
        status, msg = guest.call("HOST_MAP", *bad)
        assert status == INVALID, (bad, msg)
    assert guest.call("HOST_MAP", region, 0, 0, size, addr)[0] == 0
    status, msg = guest.call("HOST_MAP", region, 0, 0, size, free_address(size))
    assert status == INVALID and "mapped already" in msg
    assert len(guest.session.host_maps) == 1


def test_host_map_never_maps_over_the_executors_memory_or_device_ranges(guest):
    fd, status, (region, _, size, _) = guest.attach_memfd(2 * PAGE)
    os.close(fd)
    own = mmap.mmap(-1, size)  # the executor's own memory (this process's)
    own_addr = ctypes.addressof(ctypes.c_char.from_buffer(own))
    own[:4] = b"mine"
    status, msg = guest.call("HOST_MAP", region, 0, 0, size, own_addr)
    assert status == NOT_SUPPORTED and "mapped there already" in msg
    assert own[:4] == b"mine"
    code = ctypes.addressof(ctypes.c_char.from_buffer_copy(b"x")) & ~(PAGE - 1)
    assert guest.call("HOST_MAP", region, 0, 0, size, code)[0] == NOT_SUPPORTED  # the heap
    dptr = guest.alloc(1 << 20)  # device memory: the double's addresses are no mapping
    status, msg = guest.call("HOST_MAP", region, 0, 0, size, dptr & ~(PAGE - 1))
    assert status == NOT_SUPPORTED and "device memory" in msg
    assert not guest.device.host_mapped
    assert guest.call("PING")[0] == 0
    own.close()


def test_stream_memops_reach_no_other_connections_memory_nor_the_executors():
    device = FakeDevice()
    a, b = Guest(device=device), Guest(device=device)
    try:
        theirs = b.alloc(PAGE)
        device._store(theirs, b"\0" * 8)
        status, msg = memop(a, 0, P.MEMOP_ONE, [op(2, theirs, 0xBAD)])
        assert status == INVALID and "not inside any allocation" in msg
        assert device._load(theirs, 4) == b"\0" * 4
        addr, view = _memfd_mapped(b)  # b's device-mapped pinned memory
        assert memop(a, 0, P.MEMOP_ONE, [op(5, addr, 1)])[0] == INVALID
        own = ctypes.create_string_buffer(8)  # the executor's memory
        assert memop(a, 0, P.MEMOP_ONE, [op(2, ctypes.addressof(own), 1)])[0] == INVALID
        assert own.raw == b"\0" * 8 and view[:8] == b"\0" * 8
        mine = a.alloc(PAGE)  # runs past its allocation's end
        assert memop(a, 0, P.MEMOP_ONE, [op(5, mine + PAGE - 4, 1)])[0] == INVALID
        assert device.memops == []  # nothing of it reached the driver
        assert a.call("PING")[0] == 0
        view.close()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("case", ["count", "count-mismatch", "operation", "one-not-value",
                                  "one-of-two", "one-with-flags", "wide-value", "call",
                                  "stream"])
def test_malformed_stream_memops_are_refused_before_the_driver(guest, case):
    dptr = guest.alloc(PAGE)
    ok = op(2, dptr, 1)
    if case == "count":
        status, _ = memop(guest, 0, P.MEMOP_BATCH, [ok] * (P.MAX_MEMOPS + 1))
    elif case == "count-mismatch":
        status, _ = memop(guest, 0, P.MEMOP_BATCH, [ok, ok], count=3)
    elif case == "operation":
        status, _ = memop(guest, 0, P.MEMOP_BATCH, [ok, op(99, dptr)])
    elif case == "one-not-value":
        status, _ = memop(guest, 0, P.MEMOP_ONE, [op(3, 0)])
    elif case == "one-of-two":
        status, _ = memop(guest, 0, P.MEMOP_ONE, [ok, ok])
    elif case == "one-with-flags":
        status, _ = memop(guest, 0, P.MEMOP_ONE, [ok], flags=1)
    elif case == "wide-value":
        status, _ = memop(guest, 0, P.MEMOP_ONE, [op(2, dptr, 1 << 32)])
    elif case == "call":
        status, _ = memop(guest, 0, 9, [ok])
    else:
        status, _ = memop(guest, 0x4444, P.MEMOP_ONE, [ok])
    assert status in (INVALID, P.CUDA_ERROR_INVALID_HANDLE)
    assert guest.device.memops == []
    assert memop(guest, 0, P.MEMOP_ONE, [ok])[0] == 0  # and it goes on


def test_mappings_go_with_their_rooms_and_the_connection(tmp_path):
    executor_regions, _ = _device_regions(tmp_path)
    device = FakeDevice()
    a = Guest(executor_regions=executor_regions, device=device)
    status, (region, _, size, _) = a.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
    (room,) = a.call("REGION_ALLOC", region, 0, 3000)[1]
    (other,) = a.call("REGION_ALLOC", region, 0, PAGE)[1]
    assert a.call("HOST_MAP", region, 0, room, 3000, free_address(PAGE))[0] == INVALID
    addr = free_address(4 * PAGE)
    addr2 = addr + 2 * PAGE
    assert a.call("HOST_MAP", region, 0, room, PAGE, addr)[0] == 0
    assert a.call("HOST_MAP", region, 0, R.DATA_OFFSET - PAGE, PAGE, addr2)[0] == INVALID
    assert a.call("HOST_MAP", region, 0, other, PAGE, addr2)[0] == 0
    assert a.call("REGION_FREE", region, 0, room)[0] == 0
    assert not mapped_here(addr) and mapped_here(addr2)
    a.close()  # the connection goes: so do its mappings
    assert not mapped_here(addr2) and not device.host_mapped
    executor_regions.close()


def test_a_graph_that_may_write_a_mapping_keeps_it_until_the_graph_goes(guest):
    addr, view = _memfd_mapped(guest)
    region = next(iter(guest.session.regions))
    status, got = guest.call("STREAM_CREATE", 1)
    stream = got[0]
    assert guest.call("STREAM_BEGIN_CAPTURE", stream, 0)[0] == 0
    guest.post("STREAM_MEMOP", stream, 0, P.MEMOP_ONE, 1, op(2, addr, 5))
    status, (graph,) = guest.call("STREAM_END_CAPTURE", stream)
    assert status == 0
    assert guest.call("REGION_DETACH", region)[0] == 0  # parked: the graph may write it
    assert mapped_here(addr)
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert not mapped_here(addr)
    view.close()
