"""Virtual memory management and stream-ordered pools through the data lane, against the
GPU test double: what a guest may map, copy and free, and what is left when it goes."""

from __future__ import annotations

import struct
import threading

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.host.executor.tables import Ranges
from tests.host.test_agent import reports, saxpy_works

M = 1 << 20
G = 2 * M  # the test double's granularity
RW = struct.pack("<iiI", 1, 0, 3)  # CUmemAccessDesc: this device, read-write
NONE = struct.pack("<iiI", 1, 0, 0)


def _create(conn, size=G):
    return conn.call("MEM_CREATE", size, 1, 0, 1, 0, 0)[0]


def _read(conn, ptr, n):
    out = bytearray(n)
    conn.copy_from_device(out, ptr)
    return bytes(out)


def test_ranges_merge_neighbours_and_split_on_removal():
    r = Ranges()
    r.add(0, 10)
    r.add(10, 20)
    assert r.covers(5, 10) and len(r) == 1  # one range: a copy may span both
    r.remove(8, 12)
    assert r.covers(0, 8) and r.covers(12, 8) and not r.covers(7, 2) and len(r) == 2
    r.add(5, 15)
    assert r.covers(0, 20) and len(r) == 1
    r.remove(0, 20)
    assert len(r) == 0 and not r.covers(0, 1)


def test_a_vgpu_window_carves_aligned_reservations_and_takes_them_back():
    """vGPU N >= 1 keeps its addresses in its own window (cuda_device): a guest's
    reservation comes out of it, aligned as asked, and goes back whole."""
    from hvgpu.host.executor.address_window import AddressWindow as _AddressWindow

    window = object.__new__(_AddressWindow)  # its bookkeeping only: no CUDA here
    base = 0x6000_0000_0000
    window.granularity, window.base, window.lock = G, base, threading.Lock()
    window.holes, window.sizes = [(base, 1 << 30)], {}
    a = window.reserve(3 * G, 0)
    b = window.reserve(G, 8 * G)
    assert a == base and b == base + 8 * G  # aligned past the first
    with pytest.raises(CudaError):
        window.unreserve(b, 2 * G)  # not as reserved
    window.unreserve(a, 3 * G)
    assert window.reserve(4 * G, 0) == base  # the hole before b is used again
    window.unreserve(base, 4 * G)
    c = window.reserve(4096, 0)  # whole granules: what is left stays aligned for mappings
    assert window.reserve(G, 0) == c + G
    window.unreserve(c, 4096)
    window.unreserve(c + G, G)
    window.unreserve(b, G)
    assert window.holes == [(base, 1 << 30)]


def test_the_expandable_segments_pattern(fake_agent):
    with Connection(fake_agent.address) as conn:
        assert conn.call("MEM_GET_GRANULARITY", 0) == (G,)
        assert conn.call("DEVICE_GET_ATTRIBUTE", 102, 0) == (1,)  # VMM
        va = conn.call("MEM_ADDRESS_RESERVE", 64 * M, 0, 0, 0)[0]
        assert va % G == 0
        a, b = _create(conn), _create(conn)
        conn.call("MEM_MAP", va, G, 0, a, 0)
        with pytest.raises(CudaError, match="mapped memory of this guest without read-write"):
            conn.copy_to_device(va, b"x" * 16)  # mapped, no access yet
            conn.call("CTX_SYNCHRONIZE")
        with pytest.raises(CudaError, match="reserved by this guest .* but not mapped"):
            conn.call("MEMSET", va + 8 * G, 4, 0, 4, 0)  # the refusal names what is missing
            conn.call("CTX_SYNCHRONIZE")
        conn.call("MEM_MAP", va + G, G, 0, b, 0)
        conn.call("MEM_SET_ACCESS", va, 2 * G, RW)  # both chunks at once
        assert conn.call("MEM_GET_ACCESS", va + G + 5) == (3,)
        data = bytes(range(256)) * 64
        conn.copy_to_device(va + G - 8192, data)  # spans the two mappings
        assert _read(conn, va + G - 8192, len(data)) == data
        assert conn.call("MEM_RETAIN_HANDLE", va + G + 100) == (b,)
        conn.call("MEM_RELEASE", b)  # the retained reference
        assert conn.call("MEM_HANDLE_INFO", b) == (G,)
        conn.call("MEM_UNMAP", va + G, G)
        with pytest.raises(CudaError, match="runs past|not inside|reserved by this guest"):
            conn.copy_from_device(bytearray(16), va + G)
        conn.call("MEM_RELEASE", b)
        with pytest.raises(CudaError) as info:
            conn.call("MEM_HANDLE_INFO", b)
        assert info.value.status == 400
        conn.call("MEM_RELEASE", a)  # still mapped: the memory stays until unmapped
        assert _read(conn, va + G - 16, 16) == data[8192 - 16:8192]
        conn.call("MEM_UNMAP", va, G)
        conn.call("MEM_ADDRESS_FREE", va, 64 * M)


def test_vmm_misuse_gets_clear_errors_and_loses_nothing(fake_agent):
    with Connection(fake_agent.address) as conn:
        va = conn.call("MEM_ADDRESS_RESERVE", 8 * M, 0, 0, 0)[0]
        h = _create(conn)

        def refused(status, op, *args, match=None):
            with pytest.raises(CudaError, match=match) as info:
                conn.call(op, *args)
            assert info.value.status == status, info.value

        refused(1, "MEM_ADDRESS_RESERVE", M + 1, 0, 0, 0, match="multiple of 4096")
        refused(1, "MEM_CREATE", G + 4096, 1, 0, 1, 0, 0, match="granularity")
        refused(1, "MEM_MAP", va + 4096, G, 0, h, 0, match="granularity")
        refused(1, "MEM_MAP", va + 8 * M, G, 0, h, 0, match="not inside a reservation")
        refused(1, "MEM_MAP", va, 2 * G, 0, h, 0, match="run past the end")
        refused(400, "MEM_MAP", va, G, 0, h + 100, 0)
        refused(1, "MEM_UNMAP", va, G, match="not the start of a mapping")
        conn.call("MEM_MAP", va, G, 0, h, 0)
        refused(1, "MEM_MAP", va, G, 0, h, 0, match="overlaps")
        refused(1, "MEM_UNMAP", va, 2 * G, match="not the start of a mapping")
        refused(1, "MEM_SET_ACCESS", va, G, RW[:8], match="access descriptors")
        refused(1, "MEM_SET_ACCESS", va, G, struct.pack("<iiI", 1, 0, 2), match="flags")
        refused(101, "MEM_SET_ACCESS", va, G, struct.pack("<iiI", 1, 3, 3))
        refused(801, "MEM_SET_ACCESS", va, G, struct.pack("<iiI", 2, 0, 3))
        refused(1, "MEM_ADDRESS_FREE", va, 8 * M, match="still has memory mapped")
        refused(1, "MEM_ADDRESS_FREE", va, 4 * M, match="not a reservation")
        refused(1, "MEM_GET_GRANULARITY", 2)
        conn.call("MEM_SET_ACCESS", va, G, RW)
        conn.copy_to_device(va, b"still served")
        assert _read(conn, va, 12) == b"still served"
        conn.call("MEM_SET_ACCESS", va, G, NONE)  # no access: copies are refused again
        with pytest.raises(CudaError):
            _read(conn, va, 12)


def test_the_cuda_malloc_async_pattern(fake_agent):
    with Connection(fake_agent.address) as conn:
        assert conn.call("DEVICE_GET_ATTRIBUTE", 115, 0) == (1,)  # memory pools
        pool = conn.call("MEM_POOL_DEFAULT")[0]
        assert conn.call("MEM_POOL_DEFAULT") == (pool,)
        conn.call("MEM_POOL_SET_ATTRIBUTE", pool, 4, (1 << 64) - 1)  # keep everything
        ptrs = [conn.call("MEM_ALLOC_ASYNC", 1000 * (i + 1), 0, 0)[0] for i in range(8)]
        conn.copy_to_device(ptrs[3], b"pooled")
        assert _read(conn, ptrs[3], 6) == b"pooled"
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 5) == (G,)  # one chunk holds them
        for p in ptrs:
            conn.post("MEM_FREE_ASYNC", p, 0)
        conn.call("STREAM_SYNCHRONIZE", 0)
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 7) == (0,)
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 5) == (G,)  # kept: threshold
        conn.call("MEM_POOL_TRIM_TO", pool, 0)
        assert conn.call("MEM_POOL_GET_ATTRIBUTE", pool, 5) == (0,)
        other = conn.call("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)[0]
        stream = conn.call("STREAM_CREATE", 1)[0]
        big = conn.call("MEM_ALLOC_ASYNC", 3 * M, other, stream)[0]
        conn.post("MEM_FREE_ASYNC", big, stream)
        conn.call("MEM_POOL_DESTROY", other)
        with pytest.raises(CudaError) as info:
            conn.call("MEM_POOL_DESTROY", pool)
        assert info.value.status == 1  # the default pool stays


def test_pool_misuse_gets_clear_errors(fake_agent):
    with Connection(fake_agent.address) as conn:
        ptr = conn.call("MEM_ALLOC_ASYNC", 4096, 0, 0)[0]
        with pytest.raises(CudaError, match="not an allocation"):
            conn.call("MEM_FREE", ptr)  # a pool allocation is freed by MEM_FREE_ASYNC
        conn.post("MEM_FREE_ASYNC", ptr + 8, 0)
        with pytest.raises(CudaError, match="not a pool allocation"):
            conn.call("PING")  # the one-way free's error, at the next call
        conn.post("MEM_FREE_ASYNC", ptr, 0)
        conn.post("MEM_FREE_ASYNC", ptr, 0)  # twice
        with pytest.raises(CudaError, match="not a pool allocation"):
            conn.call("PING")
        for op, args, status in (("MEM_POOL_SET_ATTRIBUTE", (0, 5, 0), 1),
                                 ("MEM_POOL_SET_ATTRIBUTE", (0, 6, 7), 1),
                                 ("MEM_POOL_GET_ATTRIBUTE", (0, 9), 1),
                                 ("MEM_POOL_GET_ATTRIBUTE", (12345, 5), 400),
                                 ("MEM_ALLOC_ASYNC", (0, 0, 0), 1),
                                 ("MEM_ALLOC_ASYNC", (16, 0, 999), 400),
                                 ("MEM_POOL_CREATE", (1, 2, 1, 0, 0, 0), 801),  # Win32
                                 ("MEM_POOL_CREATE", (1, 0, 3, 0, 0, 0), 801)):
            with pytest.raises(CudaError) as info:
                conn.call(op, *args)
            assert info.value.status == status, (op, args, info.value)


def test_a_disconnect_unmaps_releases_and_frees_everything(fake_agent):
    with Connection(fake_agent.address) as conn:
        va = conn.call("MEM_ADDRESS_RESERVE", 16 * M, 0, 0, 0)[0]
        h = _create(conn, 4 * M)
        conn.call("MEM_MAP", va, 4 * M, 0, h, 0)
        conn.call("MEM_SET_ACCESS", va, 4 * M, RW)
        conn.call("MEM_RETAIN_HANDLE", va)
        _create(conn)  # never mapped
        conn.call("MEM_ADDRESS_RESERVE", 4 * M, 0, 0, 0)  # never used
        pool = conn.call("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)[0]
        conn.call("MEM_ALLOC_ASYNC", 5 * M, pool, 0)
        conn.call("MEM_ALLOC_ASYNC", 100, 0, 0)
        doomed = conn.call("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)[0]
        conn.call("MEM_ALLOC_ASYNC", 100, doomed, 0)
        conn.call("MEM_POOL_DESTROY", doomed)  # goes with its last allocation
    report, = reports(fake_agent, 1)
    assert report["left"] == 0  # no reservation, allocation, mapping or pool
    assert saxpy_works(fake_agent)
