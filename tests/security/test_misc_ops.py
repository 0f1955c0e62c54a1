"""The driver calls of the misc ops (CTX_EVENT, CTX_RESET_PERSISTING_L2,
DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH, DEVICE_HOST_ATOMIC_CAPS, ARRAY_MEMORY_REQUIREMENTS,
TENSOR_MAP_ENCODE_IM2COL, TENSOR_MAP_REPLACE_ADDRESS) cannot reach another guest's
events or arrays, nor be handed arrays whose sizes disagree with what the driver will
read: each field is checked before the driver sees it, and a refusal leaves the
connection serving."""

from __future__ import annotations

import struct

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P

FLOAT = 0x20
MAP = bytes(P.TENSOR_MAP_SIZE)


def _refused(status, conn, op, *args):
    with pytest.raises(CudaError) as info:
        conn.call(op, *args)
    assert info.value.status == status, info.value
    return info.value


def _im2col(rank=3, dims=None, strides=None, lower=None, upper=None, es=None, wide=0,
            address=0x1000):
    dims = struct.pack(f"<{rank}Q", *[8] * rank) if dims is None else dims
    strides = struct.pack(f"<{rank - 1}Q", *[512] * (rank - 1)) if strides is None else strides
    corners = 1 if wide else rank - 2
    lower = struct.pack(f"<{corners}i", *[-1] * corners) if lower is None else lower
    upper = struct.pack(f"<{corners}i", *[1] * corners) if upper is None else upper
    es = struct.pack(f"<{rank}I", *[1] * rank) if es is None else es
    return (7, rank, address, dims, strides, lower, upper, 8, 16, es, 0, 0, 0, 0, wide, 0)


def test_another_guests_events_and_arrays_are_unknown_here(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        theirs = b.call("EVENT_CREATE", 0)[0]
        mine = a.call("EVENT_CREATE", 0)[0]
        their_array = b.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0)[0]
        their_mipmap = b.call("MIPMAPPED_ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0, 2)[0]
        for wait in (0, 1):
            if theirs != mine:
                _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "CTX_EVENT", theirs, wait)
            for forged in (0, 1, mine + 1000, (1 << 64) - 1):
                _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "CTX_EVENT", forged, wait)
            a.call("CTX_EVENT", mine, wait)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "CTX_EVENT", mine, 2)
        mine_array = a.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0)[0]
        for handle, mipmapped in ((their_array, 0), (their_mipmap, 1), (mine_array, 1),
                                  (0, 0), ((1 << 64) - 1, 1)):
            if handle == mine_array and mipmapped == 0:
                continue
            if handle in (their_array, their_mipmap) and handle == mine_array:
                continue  # the double's connections may number alike: then it is a's own
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "ARRAY_MEMORY_REQUIREMENTS", handle,
                     mipmapped)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "ARRAY_MEMORY_REQUIREMENTS", mine_array, 7)
        size, alignment = a.call("ARRAY_MEMORY_REQUIREMENTS", mine_array, 0)
        assert size >= 8 * 8 * 4 and alignment
        # b's objects still serve b
        b.call("CTX_EVENT", theirs, 0)
        assert b.call("ARRAY_MEMORY_REQUIREMENTS", their_mipmap, 1)[0] > 0


def test_sizes_that_disagree_with_the_driver_are_refused(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        for ops in (b"\0" * 3, b"\0" * (4 * P.MAX_ATOMIC_OPERATIONS + 4)):
            _refused(P.CUDA_ERROR_INVALID_VALUE, a, "DEVICE_HOST_ATOMIC_CAPS", ops)
        caps = a.call("DEVICE_HOST_ATOMIC_CAPS", struct.pack("<3I", 0, 9, 10))[0]
        assert len(caps) == 12
        assert a.call("DEVICE_HOST_ATOMIC_CAPS", b"")[0] == b""
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "DEVICE_HOST_ATOMIC_CAPS", struct.pack("<I", 99))
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH", 0x77, 1)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH", FLOAT,
                 1 << 31)
        for bad in (_im2col(rank=2), _im2col(rank=6), _im2col(dims=b"\0" * 8),
                    _im2col(strides=b"\0" * 40), _im2col(lower=b"\0" * 4000),
                    _im2col(upper=b""), _im2col(es=b"\0" * 7), _im2col(wide=2),
                    _im2col(wide=1, lower=struct.pack("<2i", -1, -1))):
            _refused(P.CUDA_ERROR_INVALID_VALUE, a, "TENSOR_MAP_ENCODE_IM2COL", *bad)
        encoded = a.call("TENSOR_MAP_ENCODE_IM2COL", *_im2col())[0]
        assert len(encoded) == P.TENSOR_MAP_SIZE
        assert len(a.call("TENSOR_MAP_ENCODE_IM2COL", *_im2col(wide=1))[0]) == P.TENSOR_MAP_SIZE
        for bad in (b"", MAP[:-1], MAP + b"\0", b"\xff" * 4096):
            _refused(P.CUDA_ERROR_INVALID_VALUE, a, "TENSOR_MAP_REPLACE_ADDRESS", bad, 0x2000)
        replaced = a.call("TENSOR_MAP_REPLACE_ADDRESS", encoded, 0x2000)[0]
        assert len(replaced) == P.TENSOR_MAP_SIZE and replaced != encoded
        a.call("CTX_RESET_PERSISTING_L2")
        assert a.call("PING") == ()  # every refusal left the connection serving
