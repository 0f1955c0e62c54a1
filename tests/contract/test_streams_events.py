"""Streams and events as the executor serves them: work runs in stream order, an
event orders one stream after another, and event timings say what CUDA says,
failures included (the guest sees the driver's own status)."""

from __future__ import annotations

import pytest

from hvgpu.virtio import protocol as P
from tests.contract import ptx
from tests.contract.backends import status

_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
ONE = (1, 1, 1)


@pytest.fixture
def sleep_ms(dev):
    module = dev.module_load(ptx.module(ptx.SLEEP_MS))
    yield dev.module_function(module, "sleep_ms")
    dev.module_unload(module)


@pytest.fixture
def stream(dev):
    s = dev.stream_create(_NON_BLOCKING)
    yield s
    dev.stream_synchronize(s)
    dev.stream_destroy(s)


def test_events_time_the_work_recorded_between_them(dev, sleep_ms, stream):
    start, end = dev.event_create(0), dev.event_create(0)
    dev.event_record(start, stream)
    dev.launch(sleep_ms, ONE, ONE, 0, stream, ptx.sleep_params(20))
    dev.event_record(end, stream)
    dev.event_synchronize(end)
    assert dev.event_query(end) and dev.stream_query(stream)
    assert 19.5 <= dev.event_elapsed(start, end) < 5000
    dev.event_destroy(start)
    dev.event_destroy(end)


def test_elapsed_time_needs_two_recorded_events(dev, stream):
    a, b = dev.event_create(0), dev.event_create(0)
    assert status(dev.event_elapsed, a, b) == P.CUDA_ERROR_INVALID_HANDLE  # neither recorded
    dev.event_record(a, stream)
    dev.stream_synchronize(stream)
    assert status(dev.event_elapsed, a, b) == P.CUDA_ERROR_INVALID_HANDLE  # one recorded
    dev.event_record(b, stream)
    dev.stream_synchronize(stream)
    assert dev.event_elapsed(a, b) >= 0
    dev.event_destroy(a)
    dev.event_destroy(b)


def test_elapsed_time_of_an_event_that_keeps_no_time_is_an_invalid_handle(dev, stream):
    a, untimed = dev.event_create(0), dev.event_create(_DISABLE_TIMING)
    dev.event_record(a, stream)
    dev.event_record(untimed, stream)
    dev.stream_synchronize(stream)
    assert status(dev.event_elapsed, a, untimed) == P.CUDA_ERROR_INVALID_HANDLE
    dev.event_destroy(a)
    dev.event_destroy(untimed)


def test_an_event_never_recorded_is_complete_and_waiting_for_it_waits_for_nothing(dev, stream):
    e = dev.event_create(0)
    assert dev.event_query(e)
    dev.event_synchronize(e)
    dev.stream_wait_event(stream, e, 0)
    dev.stream_synchronize(stream)
    assert dev.stream_query(stream)
    dev.event_destroy(e)


def test_a_stream_that_waits_for_an_event_sees_the_work_before_it(dev, sleep_ms, stream):
    other = dev.stream_create(_NON_BLOCKING)
    buf = dev.mem_alloc(4096)
    addr, view = dev.host_alloc(4096)
    done = dev.event_create(_DISABLE_TIMING)
    try:
        dev.memset_async(buf, 0, 1, 4096, stream)
        dev.stream_synchronize(stream)
        dev.launch(sleep_ms, ONE, ONE, 0, other, ptx.sleep_params(50))  # keeps `other` busy
        dev.memset_async(buf, 0x5A, 1, 4096, other)
        dev.event_record(done, other)
        dev.stream_wait_event(stream, done, 0)
        dev.memcpy_dtoh_async(addr, buf, 4096, stream)
        dev.stream_synchronize(stream)
        assert bytes(view) == b"\x5a" * 4096
    finally:
        dev.synchronize()
        dev.event_destroy(done)
        dev.host_free(addr)
        dev.mem_free(buf)
        dev.stream_destroy(other)


# -- stream attributes (ops/streams.py passes the guest's CUlaunchAttributeValue) ----------

def _value(fmt: str, *values) -> bytes:
    import struct
    return struct.pack(fmt, *values).ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")


def test_a_stream_attribute_reads_back_as_it_was_set(dev, stream):
    import struct
    ptr = dev.mem_alloc(1 << 20)
    try:
        window = _value("<QQfii", ptr, 1 << 20, 0.5, 2, 1)  # persisting hits, streaming misses
        dev.stream_set_attribute(stream, 1, window)
        got = dev.stream_get_attribute(stream, 1)
        assert len(got) == P.LAUNCH_ATTR_VALUE_SIZE
        assert struct.unpack_from("<QQfii", got) == (ptr, 1 << 20, 0.5, 2, 1)
        dev.stream_set_attribute(stream, 1, _value("<QQfii", 0, 0, 0.0, 0, 0))
        assert struct.unpack_from("<QQ", dev.stream_get_attribute(stream, 1)) == (0, 0)
        dev.stream_set_attribute(stream, 3, _value("<i", 3))  # CU_SYNC_POLICY_YIELD
        assert struct.unpack_from("<i", dev.stream_get_attribute(stream, 3))[0] == 3
        dev.stream_set_attribute(stream, 10, _value("<i", 1))  # the remote sync domain
        assert struct.unpack_from("<i", dev.stream_get_attribute(stream, 10))[0] == 1
    finally:
        dev.stream_synchronize(stream)
        dev.mem_free(ptr)


def test_a_streams_priority_attribute_is_its_priority_clamped_into_the_range(dev):
    import struct
    least, greatest = dev.stream_priority_range()
    s = dev.stream_create(_NON_BLOCKING, greatest - 10)
    try:
        assert struct.unpack_from("<i", dev.stream_get_attribute(s, 8))[0] == greatest
        dev.stream_set_attribute(s, 8, _value("<i", least + 10))
        assert struct.unpack_from("<i", dev.stream_get_attribute(s, 8))[0] == least
    finally:
        dev.stream_destroy(s)


def test_copied_attributes_are_the_sources(dev, stream):
    import struct
    other = dev.stream_create(_NON_BLOCKING)
    try:
        dev.stream_set_attribute(stream, 3, _value("<i", 4))  # CU_SYNC_POLICY_BLOCKING_SYNC
        dev.stream_copy_attributes(other, stream)
        assert struct.unpack_from("<i", dev.stream_get_attribute(other, 3))[0] == 4
    finally:
        dev.stream_destroy(other)


def test_values_the_driver_refuses(dev, stream):
    ptr = dev.mem_alloc(1 << 20)
    try:
        for attr, value in ((1, _value("<QQfii", ptr, 1 << 20, 1.5, 0, 0)),  # not a ratio
                            (1, _value("<QQfii", ptr, 1 << 20, 0.5, 0, 2)),  # persisting miss
                            (3, _value("<i", 9))):  # no such synchronisation policy
            assert status(dev.stream_set_attribute, stream, attr, value) \
                == P.CUDA_ERROR_INVALID_VALUE, (attr, value)
    finally:
        dev.mem_free(ptr)
