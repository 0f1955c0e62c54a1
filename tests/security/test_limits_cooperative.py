"""A guest cannot use context limits or cooperative launches (issue 27) to pass its
slice's quota or reach what another guest holds.

cuCtxSetLimit's reservation (a stack for every resident thread, the printf FIFO,
the malloc heap) is device memory no allocation shows: it is measured and charged,
refused past the quota, given back when the limit is lowered or the program ends
(when the limit also goes back to what it was). A cooperative launch is checked as
any launch: its function, stream and parameters must be the guest's own.
"""

from __future__ import annotations

import struct
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P

M = 1 << 20
HEAP = 2  # CU_LIMIT_MALLOC_HEAP_SIZE
PTX = b".version 8.0\n.target sm_90\n.visible .entry saxpy(.param .f32 a) { ret; }\n\0"


def _used(conn) -> int:
    return conn.call("SLICE_INFO")[2]


def _refused(status: int, call, *args):
    with pytest.raises(CudaError) as info:
        call(*args)
    assert info.value.status == status, info.value
    return info.value


def _cooperative(on: int = 1) -> bytes:
    return struct.pack("<i4si60x", P.LAUNCH_ATTR_COOPERATIVE, b"", on)


def _saxpy(conn, n=256):
    module = conn.call("MODULE_LOAD_DATA", payload=PTX)[0]
    fn = conn.call("MODULE_GET_FUNCTION", module, "saxpy")[0]
    x = conn.call("MEM_ALLOC", 4 * n)[0]
    return fn, struct.pack("<f4xQQi", 2.0, x, x, n)


def test_a_limit_is_charged_refused_past_the_quota_and_given_back(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn, \
            Connection(agent.vm_address("vm1")) as other:
        default = conn.call("CTX_GET_LIMIT", HEAP)[0]
        err = _refused(P.CUDA_ERROR_OUT_OF_MEMORY, conn.call, "CTX_SET_LIMIT", HEAP, 1 << 30)
        assert "takes" in str(err)
        assert _used(conn) == 0 and conn.call("CTX_GET_LIMIT", HEAP)[0] == default
        assert conn.call("CTX_SET_LIMIT", HEAP, default + 32 * M)[0] == default + 32 * M
        assert _used(conn) == 32 * M
        # the rest of the slice is all another allocation can have
        _refused(P.CUDA_ERROR_OUT_OF_MEMORY, other.call, "MEM_ALLOC", 40 * M)
        conn.call("CTX_SET_LIMIT", HEAP, default + 8 * M)
        assert _used(conn) == 8 * M
    with Connection(agent.vm_address("vm1")) as conn:
        deadline = time.monotonic() + 20
        while _used(conn) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _used(conn) == 0
        assert conn.call("CTX_GET_LIMIT", HEAP)[0] == default  # back as it was


def test_a_limit_the_driver_refuses_is_refused_with_its_status(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        _refused(P.CUDA_ERROR_UNSUPPORTED_LIMIT, conn.call, "CTX_SET_LIMIT", 8, 1)
        _refused(P.CUDA_ERROR_INVALID_VALUE, conn.call, "CTX_SET_LIMIT", 99, 1)
        _refused(P.CUDA_ERROR_INVALID_VALUE, conn.call, "CTX_SET_LIMIT", -1, 1)
        assert _used(conn) == 0


def test_a_cooperative_launch_names_only_what_the_guest_holds(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    control.call("attach", vm="vm2", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn, \
            Connection(agent.vm_address("vm2")) as stranger, \
            Connection(agent.vm_address("vm1")) as neighbour:
        fn, params = _saxpy(conn)
        theirs, their_params = _saxpy(stranger)
        grid = (4, 1, 1, 256, 1, 1, 0)
        conn.call("LAUNCH_COOPERATIVE", fn, *grid, 0, params, _cooperative())
        # handles are each connection's own numbers: another's name nothing here, or
        # this guest's own function (the stranger's first is this guest's first)
        assert theirs == fn
        _refused(P.CUDA_ERROR_INVALID_HANDLE, conn.call, "LAUNCH_COOPERATIVE", fn + 1, *grid,
                 0, params, _cooperative())
        _refused(P.CUDA_ERROR_INVALID_HANDLE, neighbour.call, "LAUNCH_COOPERATIVE", fn, *grid,
                 0, params, _cooperative())
        stream = stranger.call("STREAM_CREATE", 0)[0]
        _refused(P.CUDA_ERROR_INVALID_HANDLE, conn.call, "LAUNCH_COOPERATIVE", fn, *grid,
                 stream, params, _cooperative())
        # parameters of another size than the kernel's, attributes naming events, no
        # cooperative attribute: refused before the driver sees them
        _refused(P.CUDA_ERROR_INVALID_VALUE, conn.call, "LAUNCH_COOPERATIVE", fn, *grid, 0,
                 params[:-4], _cooperative())
        event = struct.pack("<i4sQ56x", P.LAUNCH_ATTR_PROGRAMMATIC_EVENT, b"", 16)
        _refused(P.CUDA_ERROR_NOT_SUPPORTED, conn.call, "LAUNCH_COOPERATIVE", fn, *grid, 0,
                 params, _cooperative() + event)
        _refused(P.CUDA_ERROR_INVALID_VALUE, conn.call, "LAUNCH_COOPERATIVE", fn, *grid, 0,
                 params, _cooperative(0))
        _refused(P.CUDA_ERROR_INVALID_VALUE, conn.call, "LAUNCH_COOPERATIVE", fn, *grid, 0,
                 params, b"\0" * 71)
        # too large a grid: the driver's refusal, at the call, and the session goes on
        _refused(P.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, conn.call, "LAUNCH_COOPERATIVE", fn,
                 100000, 1, 1, 256, 1, 1, 0, 0, params, _cooperative())
        conn.call("CTX_SYNCHRONIZE")
        stranger.call("CTX_SYNCHRONIZE")
