"""Copies and memsets in stream order: a copy returns exactly the caller's bytes, at
every offset, on every kind of stream the guest may name."""

from __future__ import annotations

import struct

import pytest

from hvgpu.host.executor.device import STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD
from tests.contract.backends import M

N = M + 4096  # past a page's size, and not a multiple of one


@pytest.mark.parametrize("which", ["created", STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD])
def test_copies_and_memsets_land_exactly_where_they_are_aimed(dev, which):
    s = dev.stream_create(1) if which == "created" else dev.stream(which)
    a, b = dev.mem_alloc(N), dev.mem_alloc(N)
    addr, view = dev.host_alloc(N)
    try:
        pattern = bytes(range(251)) * 4  # 1004 bytes, no power of two anywhere
        view[:len(pattern)] = pattern
        dev.memset_async(a, 0, 1, N, s)
        dev.memcpy_htod_async(a + 12345, addr, len(pattern), s)
        dev.memset_async(a + 4096, 0xABCD, 2, 10, s)
        dev.memset_async(a + 8192, 0x01020304, 4, 5, s)
        dev.memset_async(a + N - 3, 0x7F, 1, 3, s)  # up to the last byte
        dev.memcpy_dtod_async(b, a, N, s)
        view[:] = b"\xee" * N
        dev.memcpy_dtoh_async(addr, b, N, s)
        dev.stream_synchronize(s)
        expected = bytearray(N)
        expected[12345:12345 + len(pattern)] = pattern
        expected[4096:4116] = struct.pack("<H", 0xABCD) * 10
        expected[8192:8212] = struct.pack("<I", 0x01020304) * 5
        expected[N - 3:] = b"\x7f" * 3
        assert bytes(view) == bytes(expected)
    finally:
        dev.host_free(addr)
        dev.mem_free(a)
        dev.mem_free(b)
        if which == "created":
            dev.stream_destroy(s)


def test_a_memset_value_wider_than_its_element_sets_the_elements_low_bytes(dev):
    """The wire carries a memset's value as 32 bits whatever the width (a guest may send
    any): cuMemsetD8/D16 take an unsigned char/short, so C keeps the low bytes."""
    s = dev.stream_create(1)
    a = dev.mem_alloc(4096)
    addr, view = dev.host_alloc(4096)
    try:
        dev.memset_async(a, 0x12345678, 1, 16, s)
        dev.memset_async(a + 16, 0x12345678, 2, 8, s)
        dev.memcpy_dtoh_async(addr, a, 32, s)
        dev.stream_synchronize(s)
        assert bytes(view[:32]) == b"\x78" * 16 + struct.pack("<H", 0x5678) * 8
    finally:
        dev.host_free(addr)
        dev.mem_free(a)
        dev.stream_destroy(s)
