"""CUDA arrays, texture and surface objects and 2D/3D copies through the executor
(hvgpu/host/executor/ops/arrays.py), against the GPU test double: the bytes of a
pitched region copied in, through an array and out again are the bytes that went
in; a kernel reads an array through the texture object value the guest holds."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent

FLOAT = 0x20
DEV, ARR = P.MEMORY_DEVICE, P.MEMORY_ARRAY
TEX_DESC = bytes(P.TEX_DESC_SIZE)


@pytest.fixture
def conn(tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    agent.api.attach("vm1", "64M")
    with Connection(agent.vm_address("vm1")) as c:
        yield c
    agent.stop()


def to(conn, kind, where, x, y, z, pitch, height, data: bytes, width, rows, depth, stream=0):
    conn.post("MEMCPY_3D_TO", kind, 0, where, x, y, z, pitch, height, width, rows, depth,
              stream, payload=data)


def back(conn, kind, where, x, y, z, pitch, height, width, rows, depth, stream=0) -> bytes:
    out = bytearray(width * rows * depth)
    conn.call("MEMCPY_3D_FROM", kind, 0, where, x, y, z, pitch, height, width, rows, depth,
              stream, reply_into=out)
    return bytes(out)


def test_a_pitched_region_goes_through_an_array_and_back_byte_for_byte(conn):
    rng = np.random.default_rng(7)
    image = rng.random((5, 7), dtype=np.float32)  # 5 rows of 7 floats: 28 bytes a row
    row = 7 * 4
    array = conn.call("ARRAY_CREATE", 7, 5, 0, FLOAT, 1, 0)[0]
    assert conn.call("ARRAY_GET_DESCRIPTOR", array) == (7, 5, 0, FLOAT, 1, 0)
    pitch = 64
    src = conn.call("MEM_ALLOC", pitch * 5)[0]
    dst = conn.call("MEM_ALLOC", pitch * 5)[0]
    to(conn, DEV, src, 0, 0, 0, pitch, 5, image.tobytes(), row, 5, 1)
    # pitched device memory -> array -> other pitched device memory, then out
    conn.post("MEMCPY_3D", DEV, ARR, src, 0, 0, 0, pitch, 5, array, 0, 0, 0, 0, 0, row, 5, 1, 0)
    conn.post("MEMCPY_3D", ARR, DEV, array, 0, 0, 0, 0, 0, dst, 0, 0, 0, pitch, 5, row, 5, 1, 0)
    out = np.frombuffer(back(conn, DEV, dst, 0, 0, 0, pitch, 5, row, 5, 1), np.float32)
    assert np.array_equal(out.reshape(5, 7), image)
    # a sub-rectangle of the array: rows 1..3, floats 2..5
    part = np.frombuffer(back(conn, ARR, array, 8, 1, 0, 0, 0, 16, 3, 1), np.float32)
    assert np.array_equal(part.reshape(3, 4), image[1:4, 2:6])
    conn.call("ARRAY_DESTROY", array)


def test_a_3d_array_takes_slices_and_gives_them_back(conn):
    data = np.arange(4 * 3 * 2, dtype=np.uint8).reshape(2, 3, 4)
    array = conn.call("ARRAY_CREATE", 4, 3, 2, 0x01, 1, 0)[0]
    to(conn, ARR, array, 0, 0, 0, 0, 0, data.tobytes(), 4, 3, 2)
    assert back(conn, ARR, array, 0, 0, 0, 0, 0, 4, 3, 2) == data.tobytes()
    assert back(conn, ARR, array, 1, 2, 1, 0, 0, 2, 1, 1) == data[1, 2, 1:3].tobytes()


def test_a_kernel_reads_the_array_through_the_texture_value_the_guest_holds(conn):
    values = np.arange(16, dtype=np.float32)
    array = conn.call("ARRAY_CREATE", 16, 0, 0, FLOAT, 1, 0)[0]
    to(conn, ARR, array, 0, 0, 0, 0, 0, values.tobytes(), 64, 1, 1)
    tex = conn.call("TEX_OBJECT_CREATE", 0, 0, array, 0, 0, 0, 0, 0, TEX_DESC, b"")[0]
    assert tex >= 0x1000  # the driver's (the double's) own value, not a handle of ours
    module = conn.call("MODULE_LOAD_DATA",
                       payload=b"__global__ void tex_copy(unsigned long long t, float *o, int n)")
    function = conn.call("MODULE_GET_FUNCTION", module[0], "tex_copy")[0]
    out = conn.call("MEM_ALLOC", 64)[0]
    conn.post("LAUNCH_KERNEL", function, 1, 1, 1, 1, 1, 1, 0, 0, struct.pack("<QQi", tex, out, 16))
    got = bytearray(64)
    conn.call("MEMCPY_DTOH", out, 64, 0, reply_into=got)
    assert bytes(got) == values.tobytes()
    conn.call("TEX_OBJECT_DESTROY", tex)
    with pytest.raises(CudaError) as info:
        conn.call("TEX_OBJECT_DESTROY", tex)
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE


def test_textures_over_linear_and_pitched_memory_and_surfaces(conn):
    mem = conn.call("MEM_ALLOC", 4096)[0]
    linear = conn.call("TEX_OBJECT_CREATE", 2, FLOAT, mem, 4096, 0, 0, 1, 0, TEX_DESC, b"")[0]
    pitched = conn.call("TEX_OBJECT_CREATE", 3, FLOAT, mem, 16, 8, 256, 1, 0, TEX_DESC, b"")[0]
    assert linear != pitched
    plain = conn.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0)[0]
    with pytest.raises(CudaError, match="not made for surfaces"):
        conn.call("SURF_OBJECT_CREATE", plain)
    surface = conn.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0x02)[0]
    surf = conn.call("SURF_OBJECT_CREATE", surface)[0]
    conn.call("SURF_OBJECT_DESTROY", surf)
    for tex in (linear, pitched):
        conn.call("TEX_OBJECT_DESTROY", tex)


def test_mipmap_levels_are_arrays_that_go_with_their_mipmapped_array(conn):
    mipmap = conn.call("MIPMAPPED_ARRAY_CREATE", 16, 16, 0, FLOAT, 4, 0, 3)[0]
    level = conn.call("MIPMAPPED_ARRAY_GET_LEVEL", mipmap, 2)[0]
    assert conn.call("MIPMAPPED_ARRAY_GET_LEVEL", mipmap, 2)[0] == level
    assert conn.call("ARRAY_GET_DESCRIPTOR", level)[:2] == (4, 4)
    to(conn, ARR, level, 0, 0, 0, 0, 0, bytes(range(64)) * 4, 64, 4, 1)
    with pytest.raises(CudaError, match="goes with its mipmapped array"):
        conn.call("ARRAY_DESTROY", level)
    tex = conn.call("TEX_OBJECT_CREATE", 1, 0, mipmap, 0, 0, 0, 0, 0, TEX_DESC,
                    bytes(P.VIEW_DESC_SIZE))[0]
    conn.call("TEX_OBJECT_DESTROY", tex)
    conn.call("MIPMAPPED_ARRAY_DESTROY", mipmap)
    with pytest.raises(CudaError) as info:
        conn.call("ARRAY_GET_DESCRIPTOR", level)
    assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE


def test_an_empty_copy_does_nothing_and_a_format_not_served_says_so(conn):
    array = conn.call("ARRAY_CREATE", 8, 0, 0, 0x01, 1, 0)[0]
    assert back(conn, ARR, array, 0, 0, 0, 0, 0, 0, 1, 1) == b""
    with pytest.raises(CudaError) as info:
        conn.call("ARRAY_CREATE", 8, 8, 0, 0x91, 1, 0)  # BC1: not served
    assert info.value.status == P.CUDA_ERROR_NOT_SUPPORTED
    with pytest.raises(CudaError) as info:
        conn.call("ARRAY_CREATE", 8, 8, 0, FLOAT, 1, 0x40)  # sparse
    assert info.value.status == P.CUDA_ERROR_NOT_SUPPORTED
