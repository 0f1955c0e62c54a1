"""CUDA arrays, texture and surface objects and 2D/3D copies cannot reach another
guest's objects or memory, go past an array or an allocation, or hold device memory
beyond the slice's quota or the connection.

Arrays are handles of one connection; texture and surface objects are the driver's
values, served (destroyed) only to the connection that made them. Every side of a
copy is judged before the driver sees it: an array by its extent, device memory as
one span (first byte to last, whatever its pitch and height) inside an allocation of
the guest's, overflow included. An array is charged what it took, refused ahead when
its bytes alone exceed what the slice has left, and given back on destroy and on
disconnect.
"""

from __future__ import annotations

import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P

M = 1 << 20
FLOAT = 0x20
DEV, ARR = P.MEMORY_DEVICE, P.MEMORY_ARRAY
TEX_DESC = bytes(P.TEX_DESC_SIZE)
MAX = (1 << 64) - 1


def _refused(status, conn, op, *args, **kw):
    with pytest.raises(CudaError) as info:
        conn.call(op, *args, **kw)
    assert info.value.status == status, info.value
    return info.value


def _copy_back(conn, kind, where, x, y, z, pitch, height, width, rows, depth, status):
    out = bytearray(width * rows * depth)
    return _refused(status, conn, "MEMCPY_3D_FROM", kind, 0, where, x, y, z, pitch, height,
                    width, rows, depth, 0, reply_into=out)


def _oneway_refused(status, conn, op, *args, payload=None):
    """A one-way frame's refusal, as the next synchronous call reports it."""
    conn.post(op, *args, payload=payload)
    err = _refused(status, conn, "CTX_SYNCHRONIZE")
    assert err.deferred
    return err


def _used(conn) -> int:
    return conn.call("SLICE_INFO")[2]


def test_another_guests_arrays_and_objects_are_unknown_here(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        array = a.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0x02)[0]
        tex = a.call("TEX_OBJECT_CREATE", 0, 0, array, 0, 0, 0, 0, 0, TEX_DESC, b"")[0]
        surf = a.call("SURF_OBJECT_CREATE", array)[0]
        mipmap = a.call("MIPMAPPED_ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0, 2)[0]
        for op, args in (("ARRAY_DESTROY", (array,)), ("ARRAY_GET_DESCRIPTOR", (array,)),
                         ("SURF_OBJECT_CREATE", (array,)),
                         ("TEX_OBJECT_CREATE", (0, 0, array, 0, 0, 0, 0, 0, TEX_DESC, b"")),
                         ("MIPMAPPED_ARRAY_GET_LEVEL", (mipmap, 0)),
                         ("MIPMAPPED_ARRAY_DESTROY", (mipmap,))):
            _refused(P.CUDA_ERROR_INVALID_HANDLE, b, op, *args)
        _copy_back(b, ARR, array, 0, 0, 0, 0, 0, 32, 8, 1, P.CUDA_ERROR_INVALID_HANDLE)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "TEX_OBJECT_DESTROY", tex)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "SURF_OBJECT_DESTROY", surf)
        # still a's: it destroys them
        a.call("TEX_OBJECT_DESTROY", tex)
        a.call("SURF_OBJECT_DESTROY", surf)
        a.call("ARRAY_DESTROY", array)
        a.call("MIPMAPPED_ARRAY_DESTROY", mipmap)


def test_two_programs_of_one_vm_cannot_destroy_each_others_texture_objects(agent, control):
    # one executor, one context: the driver's values are unique, the books per connection
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm1")) as b:
        array = a.call("ARRAY_CREATE", 8, 0, 0, FLOAT, 1, 0)[0]
        tex = a.call("TEX_OBJECT_CREATE", 0, 0, array, 0, 0, 0, 0, 0, TEX_DESC, b"")[0]
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "TEX_OBJECT_DESTROY", tex)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "ARRAY_DESTROY", array)
        a.call("TEX_OBJECT_DESTROY", tex)


def test_copies_cannot_run_past_an_array_or_an_allocation(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as conn:
        array = conn.call("ARRAY_CREATE", 8, 4, 0, FLOAT, 1, 0)[0]  # 32 bytes x 4 rows
        mem = conn.call("MEM_ALLOC", 4096)[0]
        inval = P.CUDA_ERROR_INVALID_VALUE
        # past the array: a row too wide, a row too many, x past the end, a slice too many
        for x, y, z, width, rows, depth in ((0, 0, 0, 36, 1, 1), (0, 1, 0, 32, 4, 1),
                                            (4, 0, 0, 32, 1, 1), (0, 0, 1, 32, 1, 1),
                                            (MAX, 0, 0, 1, 1, 1)):
            _copy_back(conn, ARR, array, x, y, z, 0, 0, width, rows, depth, inval)
        # device memory: a pitch smaller than the row, a span past the allocation, a
        # span that wraps the address space, a height below the rows of a 3D copy
        _copy_back(conn, DEV, mem, 0, 0, 0, 16, 0, 32, 2, 1, inval)
        _copy_back(conn, DEV, mem, 0, 0, 0, 1024, 0, 32, 5, 1, inval)
        _copy_back(conn, DEV, mem, 0, 0, 0, 1 << 62, 0, 32, 5, 1, inval)
        _copy_back(conn, DEV, mem, 0, 0, 0, 64, 2, 32, 4, 2, inval)
        _copy_back(conn, DEV, mem, 0, 0, MAX, 64, 2, 32, 1, 1, inval)
        _copy_back(conn, DEV, mem - 64, 0, 0, 0, 64, 0, 32, 1, 1, inval)
        # the same refusals one-way, device to array and array to device
        _oneway_refused(inval, conn, "MEMCPY_3D", DEV, ARR, mem, 0, 0, 0, 4096, 1, array,
                        0, 0, 0, 0, 0, 64, 1, 1, 0)
        _oneway_refused(inval, conn, "MEMCPY_3D", ARR, DEV, array, 0, 0, 0, 0, 0, mem + 4000,
                        0, 0, 0, 64, 4, 32, 4, 1, 0)
        _oneway_refused(P.CUDA_ERROR_INVALID_HANDLE, conn, "MEMCPY_3D", ARR, DEV, array + 1,
                        0, 0, 0, 0, 0, mem, 0, 0, 0, 64, 4, 32, 4, 1, 0)
        _oneway_refused(inval, conn, "MEMCPY_3D", 1, DEV, 0x1000, 0, 0, 0, 0, 0, mem,
                        0, 0, 0, 64, 4, 32, 1, 1, 0)  # a host side names no host memory
        # bytes that do not match the extent they claim to fill
        _oneway_refused(inval, conn, "MEMCPY_3D_TO", ARR, 0, array, 0, 0, 0, 0, 0, 32, 4, 1,
                        0, payload=bytes(64))
        # one frame carries MAX_COPY_3D at most
        _copy_back(conn, DEV, mem, 0, 0, 0, 0, 0, 4096, 4096, 1, inval)
        # nothing of this reached the memory or the array
        out = bytearray(128)
        conn.call("MEMCPY_3D_FROM", ARR, 0, array, 0, 0, 0, 0, 0, 32, 4, 1, 0, reply_into=out)
        assert out == bytes(128)


def test_textures_reach_only_the_guests_own_memory(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        a.call("MEM_ALLOC", 4096)
        theirs = a.call("MEM_ALLOC", 4096)[0]  # each executor numbers its own: past b's
        mine = b.call("MEM_ALLOC", 4096)[0]
        assert theirs != mine
        inval = P.CUDA_ERROR_INVALID_VALUE
        _refused(inval, b, "TEX_OBJECT_CREATE", 2, FLOAT, theirs, 4096, 0, 0, 1, 0, TEX_DESC, b"")
        _refused(inval, b, "TEX_OBJECT_CREATE", 2, FLOAT, mine, 4097, 0, 0, 1, 0, TEX_DESC, b"")
        # pitch2D: its span is pitch * (height - 1) + the row
        _refused(inval, b, "TEX_OBJECT_CREATE", 3, FLOAT, mine, 16, 17, 256, 1, 0, TEX_DESC, b"")
        _refused(inval, b, "TEX_OBJECT_CREATE", 3, FLOAT, mine, 16, 2, 32, 1, 0, TEX_DESC, b"")
        _refused(inval, b, "TEX_OBJECT_CREATE", 3, FLOAT, mine, 16, 2, MAX, 1, 0, TEX_DESC, b"")
        _refused(inval, b, "TEX_OBJECT_CREATE", 2, FLOAT, mine, 64, 0, 0, 1, 0, b"short", b"")
        _refused(inval, b, "TEX_OBJECT_CREATE", 9, FLOAT, mine, 64, 0, 0, 1, 0, TEX_DESC, b"")


def test_arrays_are_charged_refused_past_the_quota_and_given_back(agent, control):
    control.call("attach", vm="vm1", mem="4M")
    with Connection(agent.vm_address("vm1")) as conn:
        before = _used(conn)
        array = conn.call("ARRAY_CREATE", 256, 256, 0, FLOAT, 4, 0)[0]  # 1 MiB
        assert _used(conn) - before == M
        mipmap = conn.call("MIPMAPPED_ARRAY_CREATE", 256, 256, 0, FLOAT, 2, 0, 4)[0]
        assert _used(conn) - before > M + M // 2
        err = _refused(P.CUDA_ERROR_OUT_OF_MEMORY, conn, "ARRAY_CREATE", 1024, 1024, 0, FLOAT,
                       4, 0)  # 16 MiB: refused before the driver makes it
        assert "does not fit" in err.detail
        conn.call("ARRAY_DESTROY", array)
        conn.call("MIPMAPPED_ARRAY_DESTROY", mipmap)
        assert _used(conn) == before
        conn.call("ARRAY_CREATE", 256, 256, 0, FLOAT, 4, 0)  # left for the disconnect
        conn.call("MIPMAPPED_ARRAY_CREATE", 64, 64, 0, FLOAT, 4, 0, 2)
        assert _used(conn) > before
    deadline = time.monotonic() + 20
    while control.call("status")[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.call("status")[0]["mem_used"] == 0
