"""Virtual memory management and memory pools cannot take a guest past its quota, reach
another guest's memory, or outlive the connection.

cuMemCreate is charged its size (a multiple of the granularity) before the
driver takes it; a pool is charged what it holds of the driver's memory, so
neither a release threshold that keeps freed memory nor a pool that grows by
more than its allocation asks can hold memory beyond the quota. Handle
numbers and address ranges are per connection: another guest's handle,
range or pool allocation is unknown here. A disconnect unmaps, releases and
frees everything, and the ledger gets every byte back.
"""

from __future__ import annotations

import struct
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device
from hvgpu.virtio import protocol as P

M = 1 << 20
G = 2 * M  # the test double's granularity
RW = struct.pack("<iiI", 1, 0, 3)
MAX = (1 << 64) - 1


def _used(conn) -> int:
    """What the slice's ledger holds, asked through the executor: its releases travel
    one-way to the agent, ahead of this question on the same channel."""
    return conn.call("SLICE_INFO")[2]


def _refused(status, conn, op, *args):
    with pytest.raises(CudaError) as info:
        conn.call(op, *args)
    assert info.value.status == status, info.value
    return info.value


def _eventually_zero(control) -> None:
    deadline = time.monotonic() + 20
    while control.call("status")[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.call("status")[0]["mem_used"] == 0


def test_cu_mem_create_cannot_pass_the_quota(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    with Connection(agent.vm_address("vm1")) as conn:
        handles = [conn.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0] for _ in range(4)]
        assert _used(conn) == 8 * M
        _refused(2, conn, "MEM_CREATE", G, 1, 0, 1, 0, 0)
        assert conn.call("MEM_GET_INFO") == (0, 8 * M)
        conn.call("MEM_RELEASE", handles.pop())
        assert _used(conn) == 6 * M
        va = conn.call("MEM_ADDRESS_RESERVE", 64 * M, 0, 0, 0)[0]  # addresses cost nothing
        conn.call("MEM_MAP", va, G, 0, handles[0], 0)
        conn.call("MEM_RELEASE", handles[0])  # mapped: still held, still charged
        assert _used(conn) == 6 * M
        conn.call("MEM_UNMAP", va, G)
        assert _used(conn) == 4 * M
        _refused(2, conn, "MEM_CREATE", 6 * M, 1, 0, 1, 0, 0)
        assert _used(conn) == 4 * M


def test_a_pool_cannot_hold_more_than_the_quota(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    with Connection(agent.vm_address("vm1")) as conn:
        pool = conn.call("MEM_POOL_DEFAULT")[0]
        conn.call("MEM_POOL_SET_ATTRIBUTE", pool, 4, MAX)  # keep all freed memory
        a = conn.call("MEM_ALLOC_ASYNC", 3 * M, 0, 0)[0]
        b = conn.call("MEM_ALLOC_ASYNC", 3 * M, 0, 0)[0]
        assert _used(conn) == 8 * M  # two 4 MiB chunks, as the pool holds them
        _refused(2, conn, "MEM_ALLOC_ASYNC", 3 * M, 0, 0)
        _refused(2, conn, "MEM_ALLOC", G)
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 5) == (8 * M,)
        for p in (a, b):
            conn.post("MEM_FREE_ASYNC", p, 0)
        conn.call("CTX_SYNCHRONIZE")
        # Freed, but kept by the pool (its threshold): still the guest's, still charged.
        assert _used(conn) == 8 * M
        _refused(2, conn, "MEM_ALLOC", G)
        conn.call("MEM_ALLOC_ASYNC", 3 * M, 0, 0)  # the pool's own memory serves it
        _refused(2, conn, "MEM_ALLOC_ASYNC", 6 * M, 0, 0)  # no 6 MiB in one piece: it grows
        assert _used(conn) == 8 * M
        conn.call("MEM_POOL_TRIM_TO", pool, 0)
        assert _used(conn) == 4 * M  # the chunk in use stays, the other is given back


def test_memory_a_pool_gives_back_is_uncharged(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    with Connection(agent.vm_address("vm1")) as conn:
        ptr = conn.call("MEM_ALLOC_ASYNC", 5 * M, 0, 0)[0]
        assert _used(conn) == 6 * M
        conn.post("MEM_FREE_ASYNC", ptr, 0)
        conn.call("STREAM_SYNCHRONIZE", 0)  # threshold 0: the driver takes it back here
        assert _used(conn) == 0
        conn.call("MEM_ALLOC", 8 * M)


def test_a_pool_that_grows_past_its_charge_is_undone(agent, control):
    """A pool may grow although it has room in all (fragmentation): the growth is
    charged after the driver's figure, and undone when the quota cannot take it."""
    control.call("attach", vm="vm1", mem="4M")
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_ALLOC", G)
        pool = conn.call("MEM_POOL_DEFAULT")[0]
        conn.call("MEM_POOL_SET_ATTRIBUTE", pool, 4, MAX)
        first = conn.call("MEM_ALLOC_ASYNC", M, 0, 0)[0]
        conn.call("MEM_ALLOC_ASYNC", M // 2, 0, 0)
        assert _used(conn) == 4 * M
        conn.post("MEM_FREE_ASYNC", first, 0)  # 1.5 MiB free in the pool, not in one piece
        _refused(2, conn, "MEM_ALLOC_ASYNC", M, 0, 0)
        assert _used(conn) == 4 * M
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 5) == (G,)  # the growth is gone


def test_a_connection_cannot_use_another_connections_vmm_memory_or_pool(agent, control):
    """Two programs of one VM share its executor (one address space): each still
    reaches only what it created. (Another VM's executor is another process.)"""
    control.call("attach", vm="vm1", mem="32M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm1")) as b:
        va = a.call("MEM_ADDRESS_RESERVE", 8 * M, 0, 0, 0)[0]
        h = a.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
        a.call("MEM_MAP", va, G, 0, h, 0)
        a.call("MEM_SET_ACCESS", va, G, RW)
        pooled = a.call("MEM_ALLOC_ASYNC", 4096, 0, 0)[0]
        pool = a.call("MEM_POOL_DEFAULT")[0]
        mine = b.call("MEM_ADDRESS_RESERVE", 8 * M, 0, 0, 0)[0]
        _refused(400, b, "MEM_MAP", mine, G, 0, h, 0)  # a's handle is unknown here
        _refused(400, b, "MEM_RELEASE", h)
        _refused(400, b, "MEM_HANDLE_INFO", h)
        _refused(400, b, "MEM_POOL_GET_ATTRIBUTE", pool, 5)
        _refused(1, b, "MEM_UNMAP", va, G)
        _refused(1, b, "MEM_SET_ACCESS", va, G, RW)
        _refused(1, b, "MEM_RETAIN_HANDLE", va)
        _refused(1, b, "MEM_GET_ACCESS", va)
        _refused(1, b, "MEM_ADDRESS_FREE", va, 8 * M)
        own = b.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
        _refused(1, b, "MEM_MAP", va + G, G, 0, own, 0)  # into a's reservation
        for ptr in (va, pooled):
            _refused(1, b, "MEMCPY_DTOH", ptr, 16, 0)
        b.post("MEM_FREE_ASYNC", pooled, 0)
        _refused(1, b, "PING")
        # a is untouched
        a.copy_to_device(va, b"mine")
        out = bytearray(4)
        a.copy_from_device(out, va)
        assert out == b"mine"
        a.post("MEM_FREE_ASYNC", pooled, 0)
        a.call("CTX_SYNCHRONIZE")


def test_only_device_memory_exportable_as_a_posix_fd_at_most_is_served(agent, control):
    control.call("attach", vm="vm1", mem="32M")
    with Connection(agent.vm_address("vm1")) as conn:
        for handle_types in (2, 4, 8, 9):  # Win32, KMT, fabric (with a POSIX fd: 9)
            err = _refused(801, conn, "MEM_CREATE", G, 1, handle_types, 1, 0, 0)
            assert "exportable" in str(err)
        for handle_types in (2, 4, 8, 9):  # Win32, KMT, fabric (a POSIX fd: test_pool_ipc.py)
            _refused(801, conn, "MEM_POOL_CREATE", 1, handle_types, 1, 0, 0, 0)
        for loc_type in (2, 3, 4):  # host, host NUMA, current host NUMA
            _refused(801, conn, "MEM_CREATE", G, 1, 0, loc_type, 0, 0)
            _refused(801, conn, "MEM_POOL_CREATE", 1, 0, loc_type, 0, 0, 0)
        _refused(101, conn, "MEM_CREATE", G, 1, 0, 1, 1, 0)  # another device
        for flags in (1 << 8, 1 << 16):  # RDMA, usage (compression is served)
            _refused(801, conn, "MEM_CREATE", G, 1, 0, 1, 0, flags)
        _refused(801, conn, "MEM_CREATE", G, 2, 0, 1, 0, 0)  # managed
        _refused(1, conn, "MEM_CREATE", G + 1, 1, 0, 1, 0, 0)  # not whole granules
        _refused(1, conn, "MEM_CREATE", 0, 1, 0, 1, 0, 0)
        assert _used(conn) == 0
        Device(connection=conn).allocate(M)  # still served


def test_reserved_addresses_are_bounded(agent, control):
    control.call("attach", vm="vm1", mem="32M")
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_ADDRESS_RESERVE", 1 << 44, 0, 0, 0)
        conn.call("MEM_ADDRESS_RESERVE", 1 << 44, 0, 0, 0)
        _refused(2, conn, "MEM_ADDRESS_RESERVE", G, 0, 0, 0)
        _refused(1, conn, "MEM_ADDRESS_RESERVE", G, 3 * M, 0, 0)  # not a power of two
        _refused(1, conn, "MEM_ADDRESS_RESERVE", G, 0, 0, 1)  # flags


def test_a_disconnect_returns_every_vmm_and_pool_byte(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        va = conn.call("MEM_ADDRESS_RESERVE", 32 * M, 0, 0, 0)[0]
        for i in range(4):
            h = conn.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
            conn.call("MEM_MAP", va + i * G, G, 0, h, 0)
            if i % 2:
                conn.call("MEM_RELEASE", h)  # held by its mapping alone
        conn.call("MEM_SET_ACCESS", va, 4 * G, RW)
        conn.call("MEM_CREATE", 4 * M, 1, 0, 1, 0, 0)
        pool = conn.call("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)[0]
        conn.call("MEM_POOL_SET_ATTRIBUTE", pool, 4, MAX)
        conn.call("MEM_ALLOC_ASYNC", 5 * M, pool, 0)
        freed = conn.call("MEM_ALLOC_ASYNC", 3 * M, 0, 0)[0]
        conn.call("MEM_ALLOC_ASYNC", 100, 0, 0)
        conn.post("MEM_FREE_ASYNC", freed, 0)
        conn.call("MEM_ALLOC", M)
        assert _used(conn) == 8 * M + 4 * M + 6 * M + 4 * M + M
    _eventually_zero(control)
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_CREATE", 64 * M, 1, 0, 1, 0, 0)  # all of it is back


# -- compressible memory ---------------------------------------------------------------

def test_compressible_memory_is_charged_its_size_and_says_what_was_granted(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    with Connection(agent.vm_address("vm1")) as conn:
        g = conn.call("MEM_GET_GRANULARITY_OF", 0, 1)[0]
        assert g % conn.call("MEM_GET_GRANULARITY", 0)[0] == 0
        h = conn.call("MEM_CREATE", 2 * g, 1, 0, 1, 0, 1)[0]  # CU_MEM_ALLOCATION_COMP_GENERIC
        assert _used(conn) == 2 * g
        assert conn.call("MEM_HANDLE_PROPS", h) == (2 * g, 1)
        _refused(2, conn, "MEM_CREATE", 8 * M, 1, 0, 1, 0, 1)
        assert _used(conn) == 2 * g
        conn.call("MEM_RELEASE", h)
        assert _used(conn) == 0
        plain = conn.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
        assert conn.call("MEM_HANDLE_PROPS", plain) == (G, 0)
        conn.call("MEM_RELEASE", plain)
    _eventually_zero(control)


@pytest.mark.parametrize("flags, status", [(2, 1), (0xFF, 1), (0x100, 801), (0x101, 801),
                                           (1 << 16, 801), (0xFFFFFFFF, 801)])
def test_allocation_flags_other_than_a_compression_type_are_refused(agent, control, flags,
                                                                    status):
    control.call("attach", vm="vm1", mem="8M")
    with Connection(agent.vm_address("vm1")) as conn:
        _refused(status, conn, "MEM_CREATE", G, 1, 0, 1, 0, flags)
        _refused(status, conn, "MEM_GET_GRANULARITY_OF", 0, flags)
        assert _used(conn) == 0


def test_handle_properties_of_another_guest_or_no_handle_are_refused(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    control.call("attach", vm="vm2", mem="8M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        theirs = b.call("MEM_CREATE", G, 1, 0, 1, 0, 1)[0]
        mine = a.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
        for handle in {theirs + 1, mine + 1, 0, (1 << 64) - 1} - {mine}:
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "MEM_HANDLE_PROPS", handle)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "MEM_GET_GRANULARITY_OF", 2, 1)
        a.call("MEM_RELEASE", mine)
        b.call("MEM_RELEASE", theirs)
