"""Arrays and 2D/3D copies (cuMemcpy3DAsync): the double and the driver place the same
bytes, give the same descriptors back, and refuse the same copies. What the executor
judges before the driver (ops/arrays.py) is held to what the driver itself refuses."""

from __future__ import annotations

import ctypes

import numpy as np

from tests.contract.backends import status

FLOAT, U8 = 0x20, 0x01
HOST, DEVICE, ARRAY = 1, 2, 3
INVALID_VALUE = 1


def _host(data: bytes):
    buf = ctypes.create_string_buffer(data, len(data))
    return buf, ctypes.addressof(buf)


def test_a_pitched_region_goes_through_an_array_byte_for_byte(dev):
    s = dev.stream_create(1)
    image = np.arange(5 * 7, dtype=np.float32).reshape(5, 7) * 3.5
    row, pitch = 7 * 4, 64
    array = dev.array_create(7, 5, 0, FLOAT, 1, 0)
    mem = dev.mem_alloc(pitch * 5)
    try:
        assert tuple(dev.array_descriptor(array)) == (7, 5, 0, FLOAT, 1, 0)
        src, src_addr = _host(image.tobytes())
        out, out_addr = _host(bytes(row * 5))
        dev.memcpy_3d((HOST, src_addr, 0, 0, 0, row, 5), (DEVICE, mem, 0, 0, 0, pitch, 5),
                      row, 5, 1, s)
        dev.memcpy_3d((DEVICE, mem, 0, 0, 0, pitch, 5), (ARRAY, array, 0, 0, 0, 0, 0),
                      row, 5, 1, s)
        dev.memcpy_3d((ARRAY, array, 0, 0, 0, 0, 0), (HOST, out_addr, 0, 0, 0, row, 5),
                      row, 5, 1, s)
        dev.stream_synchronize(s)
        assert np.array_equal(np.frombuffer(out.raw, np.float32).reshape(5, 7), image)
        part, part_addr = _host(bytes(16 * 3))
        dev.memcpy_3d((ARRAY, array, 8, 1, 0, 0, 0), (HOST, part_addr, 0, 0, 0, 16, 3),
                      16, 3, 1, s)
        dev.stream_synchronize(s)
        assert np.array_equal(np.frombuffer(part.raw, np.float32).reshape(3, 4), image[1:4, 2:6])
    finally:
        dev.array_destroy(array)
        dev.mem_free(mem)
        dev.stream_destroy(s)


def test_a_3d_array_takes_slices_and_a_box_comes_back(dev):
    s = dev.stream_create(1)
    vol = np.arange(4 * 3 * 2, dtype=np.uint8).reshape(2, 3, 4)
    array = dev.array_create(4, 3, 2, U8, 1, 0)
    try:
        src, src_addr = _host(vol.tobytes())
        box, box_addr = _host(bytes(8))
        dev.memcpy_3d((HOST, src_addr, 0, 0, 0, 4, 3), (ARRAY, array, 0, 0, 0, 0, 0), 4, 3, 2, s)
        dev.memcpy_3d((ARRAY, array, 1, 1, 0, 0, 0), (HOST, box_addr, 0, 0, 0, 2, 2), 2, 2, 2, s)
        dev.stream_synchronize(s)
        assert box.raw == vol[:, 1:3, 1:3].tobytes()
    finally:
        dev.array_destroy(array)
        dev.stream_destroy(s)


def test_copies_past_an_array_or_with_a_short_pitch_are_refused(dev):
    s = dev.stream_create(1)
    array = dev.array_create(8, 4, 0, FLOAT, 1, 0)
    mem = dev.mem_alloc(4096)
    buf, addr = _host(bytes(4096))
    try:
        for x, y, width, rows in ((0, 0, 36, 1), (0, 1, 32, 4), (4, 0, 32, 1)):
            assert status(dev.memcpy_3d, (ARRAY, array, x, y, 0, 0, 0),
                          (HOST, addr, 0, 0, 0, width, rows), width, rows, 1, s) == INVALID_VALUE
        assert status(dev.memcpy_3d, (DEVICE, mem, 0, 0, 0, 16, 2),
                      (HOST, addr, 0, 0, 0, 32, 2), 32, 2, 1, s) == INVALID_VALUE
    finally:
        dev.stream_synchronize(s)
        dev.array_destroy(array)
        dev.mem_free(mem)
        dev.stream_destroy(s)


def test_mipmap_levels_halve_and_texture_objects_are_distinct_values(dev):
    mipmap = dev.mipmap_create(16, 16, 0, FLOAT, 4, 0, 3)
    array = dev.array_create(8, 8, 0, FLOAT, 1, 0x02)
    try:
        level = dev.mipmap_level(mipmap, 2)
        assert tuple(dev.array_descriptor(level))[:2] == (4, 4)
        tex = dev.tex_create(0, array, 0, 0, 0, 0, 0, 0, bytes(104), b"")
        surf = dev.surf_create(array)
        assert tex and surf and tex != surf
        dev.surf_destroy(surf)
        dev.tex_destroy(tex)
    finally:
        dev.array_destroy(array)
        dev.mipmap_destroy(mipmap)
