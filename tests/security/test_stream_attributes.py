"""Stream attributes cannot reach another guest's streams or memory, nor hand the
driver a value it would read as a pointer of the executor's.

STREAM_SET_ATTRIBUTE takes only the attributes cuda.h says are valid for streams (the
others' values can name events, the executor's objects) and a value of exactly one
CUlaunchAttributeValue; an access policy window must lie inside memory of the
connection's own, as every device range does."""

from __future__ import annotations

import struct

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P

M = 1 << 20
WINDOW, PRIORITY = 1, 8


def _window(base: int, n: int) -> bytes:
    return struct.pack("<QQfii", base, n, 0.5, 2, 1).ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")


def _refused(status, conn, op, *args):
    with pytest.raises(CudaError) as info:
        conn.call(op, *args)
    assert info.value.status == status, info.value
    return info.value


def test_a_window_over_another_guests_memory_or_past_ones_own_is_refused(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        theirs = b.call("MEM_ALLOC", M)[0]
        mine = a.call("MEM_ALLOC", M)[0]
        s = a.call("STREAM_CREATE", 1)[0]
        # the double's executors may hand both the same address: then it is a's own too
        foreign = [(theirs, M)] if not mine <= theirs < mine + M else []
        for base, n in (*foreign, (mine, 2 * M), (mine + M - 1, 2), (0x1000, 4096),
                        ((1 << 64) - 4096, 8192), (mine, (1 << 64) - 1)):
            err = _refused(P.CUDA_ERROR_INVALID_VALUE, a, "STREAM_SET_ATTRIBUTE", s, WINDOW,
                           _window(base, n))
            assert "access policy window" in str(err)
        a.call("STREAM_SET_ATTRIBUTE", s, WINDOW, _window(mine, M))
        a.call("STREAM_SET_ATTRIBUTE", s, WINDOW, _window(0, 0))  # no window: always allowed
        a.call("MEM_FREE", mine)
        b.call("MEM_FREE", theirs)


def test_another_guests_streams_are_unknown_here(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        theirs = b.call("STREAM_CREATE", 1)[0]
        mine = a.call("STREAM_CREATE", 1)[0]
        value = struct.pack("<i", 0).ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")
        if theirs != mine:  # the same number names a's own stream, not b's
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "STREAM_SET_ATTRIBUTE", theirs, PRIORITY,
                     value)
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "STREAM_GET_ATTRIBUTE", theirs, PRIORITY)
        for handle in (P.FIRST_HANDLE + 999, (1 << 64) - 1, 3):
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "STREAM_GET_ATTRIBUTE", handle, PRIORITY)
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "STREAM_COPY_ATTRIBUTES", mine, handle)
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "STREAM_COPY_ATTRIBUTES", handle, mine)


@pytest.mark.parametrize("attr", [0, 2, 4, 5, 6, 7, 11, 12, 13, 14, 15, 17, 1 << 31,
                                  (1 << 32) - 1])
def test_attributes_a_stream_does_not_take_are_refused(agent, control, attr):
    """Events (7, 12) above all: their value is a CUevent, a pointer in the executor."""
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        s = a.call("STREAM_CREATE", 1)[0]
        value = struct.pack("<Q", 0xDEADBEEF).ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "STREAM_SET_ATTRIBUTE", s, attr, value)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "STREAM_GET_ATTRIBUTE", s, attr)
        a.call("PING")  # the connection still serves


@pytest.mark.parametrize("size", [0, 1, 63, 65, 4096])
def test_a_value_of_any_other_size_than_one_union_is_refused(agent, control, size):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        s = a.call("STREAM_CREATE", 1)[0]
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "STREAM_SET_ATTRIBUTE", s, PRIORITY, bytes(size))
        a.call("PING")


def test_a_value_past_the_frame_limit_ends_the_connection_not_the_executor(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        s = a.call("STREAM_CREATE", 1)[0]
        with pytest.raises(CudaError):
            a.call("STREAM_SET_ATTRIBUTE", s, PRIORITY, bytes(P.MAX_BODY + 1))
    with Connection(agent.vm_address("vm1")) as a:  # the executor still serves
        a.call("PING")
