"""The guest Python API over the region lane (a memfd on a unix socket),
end to end through an agent with the GPU test double: pinned memory, copies that
name offsets, pageable copies staged in pipelined chunks, and the socket where no
region is offered. The lane is the C client library's (shim/region_lane.c, the code
the libcuda shim runs; tests/guest/test_shim_region_lane.py tests it under the shim):
these check what the Python API's user sees of it."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device
from hvgpu.guest.client import frames_sent
from hvgpu.host.executor import regions
from hvgpu.host.executor.session import Session
from hvgpu.virtio import protocol as P
from hvgpu.virtio.tuning import STAGE_CHUNK, STAGE_MIN
from tests.fake_gpu import FakeDevice

MiB = 1 << 20
COPIES = ("MEMCPY_HTOD", "MEMCPY_DTOH", "MEMCPY_HTOD_REGION", "MEMCPY_DTOH_REGION",
          "STREAM_SYNCHRONIZE")


@pytest.fixture
def dev(fake_agent):
    conn = Connection(fake_agent.address)
    yield Device(connection=conn)
    conn.close()


class Sent:
    """Frames of the copy ops this process sends from now on (the library counts them)."""

    def __init__(self):
        self.before = {op: sum(frames_sent(op)) for op in COPIES}

    def count(self, op: str) -> int:
        return sum(frames_sent(op)) - self.before[op]

    def ops(self) -> list[str]:
        return [op for op in COPIES if self.count(op)]


def test_pinned_memory_copies_name_offsets_both_ways(dev, monkeypatch):
    assert dev.conn.caps & P.CAP_REGION_MEMFD
    pinned = dev.pinned(3 * MiB + 5)
    host = np.frombuffer(pinned.view, dtype=np.uint8)
    host[:] = np.arange(host.size, dtype=np.uint64).astype(np.uint8)
    back = dev.pinned(pinned.size)
    buf = dev.allocate(pinned.size)
    sent = Sent()
    buf.copy_from(host)
    buf.copy_to(back.view)
    assert bytes(back.view) == bytes(pinned.view)
    assert sent.ops() == ["MEMCPY_HTOD_REGION", "MEMCPY_DTOH_REGION", "STREAM_SYNCHRONIZE"]
    assert sent.count("MEMCPY_HTOD_REGION") == 1 == sent.count("MEMCPY_DTOH_REGION")
    # a slice of pinned memory is pinned memory too
    buf.copy_to(back.view[4096:8192], offset=100)
    assert bytes(back.view[4096:8192]) == bytes(pinned.view[100:4196])
    pinned.close()
    back.close()
    assert dev.conn.pinned_count == 0


@pytest.mark.parametrize("size", [STAGE_MIN, 3 * STAGE_CHUNK + 12345])
def test_large_pageable_copies_are_staged_in_chunks(dev, size):
    data = os.urandom(size)
    sent = Sent()
    buf = dev.allocate(size)
    buf.copy_from(data)
    back = buf.copy_to()
    assert bytes(back) == data
    chunks = -(-size // STAGE_CHUNK)
    assert sent.count("MEMCPY_HTOD_REGION") == chunks == sent.count("MEMCPY_DTOH_REGION")
    assert "MEMCPY_HTOD" not in sent.ops() and "MEMCPY_DTOH" not in sent.ops()


def test_small_copies_stay_on_the_socket_and_one_way(dev):
    sent = Sent()
    buf = dev.allocate(64 << 10)
    buf.copy_from(b"x" * (64 << 10))
    assert sent.ops() == ["MEMCPY_HTOD"] and dev.conn.lane()[0] is None  # no region asked
    assert bytes(buf.copy_to()) == b"x" * (64 << 10)


def test_a_staged_copy_reports_an_earlier_error_and_the_connection_goes_on(dev):
    buf = dev.allocate(4 * MiB)
    dev.conn.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    with pytest.raises(CudaError) as info:
        buf.copy_from(b"\1" * (4 * MiB))
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE and info.value.deferred
    buf.copy_from(b"\2" * (4 * MiB))
    assert bytes(buf.copy_to()[:4]) == b"\2\2\2\2"


def test_pinned_memory_freed_after_a_one_way_error_is_freed_and_the_error_kept(dev):
    pinned = dev.pinned(MiB)
    dev.conn.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    pinned.close()  # the lane's bookkeeping: neither refused nor eating the error
    assert dev.conn.pinned_count == 0
    with pytest.raises(CudaError) as info:
        dev.sync()
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE and info.value.deferred
    dev.sync()


def test_a_staged_download_of_many_chunks_reports_an_earlier_error(dev):
    size = 3 * STAGE_CHUNK + 4096
    buf = dev.allocate(size)
    buf.copy_from(b"\3" * size)
    dev.conn.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    with pytest.raises(CudaError) as info:
        buf.copy_to()
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE and info.value.deferred
    assert bytes(buf.copy_to()) == b"\3" * size  # and the connection goes on


class LateCopies(FakeDevice):
    """Copies between host and device happen when the context or a stream is next
    synchronised: DMA still under way after the op that queued it was served."""

    def __init__(self):
        super().__init__()
        self.queued: list = []

    def memcpy_htod_async(self, dst, src_addr, n, stream):
        self.queued.append((super().memcpy_htod_async, (dst, src_addr, n, stream)))

    def memcpy_dtoh_async(self, dst_addr, src, n, stream):
        self.queued.append((super().memcpy_dtoh_async, (dst_addr, src, n, stream)))

    def _synchronized(self):
        queued, self.queued = self.queued, []
        for copy, args in queued:
            copy(*args)
        super()._synchronized()


class _Served:
    """A guest connection served in this process by one session over ``device``;
    ``relayed``: the guest's socket is TCP while the session's end takes descriptors,
    as an agent's unix socket behind a hybrid-vsock VMM does."""

    def __init__(self, tmp_path, device, relayed: bool = False):
        if relayed:
            self.listener = socket.create_server(("127.0.0.1", 0))
            address = "tcp://127.0.0.1:%d" % self.listener.getsockname()[1]
        else:
            path = str(tmp_path / "guest.sock")
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(path)
            self.listener.listen(1)
            address = f"unix://{path}"
        self.listener.settimeout(30)
        self.thread = threading.Thread(target=self._serve, args=(device, relayed),
                                       daemon=True)
        self.thread.start()
        self.conn = Connection(address, timeout=30)

    def _serve(self, device, relayed):
        sock, _ = self.listener.accept()
        session = Session(sock, device, peer="guest",
                          executor_regions=regions.ExecutorRegions(64 * MiB))
        if relayed:
            session.reader.fds = []
        session.serve()

    def close(self):
        self.conn.close()
        self.thread.join(30)
        self.listener.close()


@pytest.fixture
def late(tmp_path):
    """A guest connection served in this process by a session over LateCopies."""
    served = _Served(tmp_path, LateCopies())
    yield Device(connection=served.conn)
    served.close()


def test_a_copy_into_pinned_memory_that_raised_writes_it_no_more(late):
    buf = late.allocate(MiB)
    buf.copy_from(b"D" * MiB)
    pinned = late.pinned(MiB)
    late.conn.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    with pytest.raises(CudaError) as info:
        buf.copy_to(pinned.view)
    assert info.value.deferred
    pinned.view[:] = b"P" * MiB
    late.sync()
    assert bytes(pinned.view) == b"P" * MiB
    pinned.close()


@pytest.mark.parametrize("failing", ["download", "upload"])
def test_after_a_staged_copy_fails_its_slots_are_idle_before_they_are_reused(late, failing):
    """A fence that carries an earlier op's error did not wait for the stream; the
    slots must still be idle before the next copy writes them."""
    size = 2 * MiB
    a, b = late.allocate(size), late.allocate(size)
    a.copy_from(b"A" * size)
    late.conn.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    with pytest.raises(CudaError) as info:
        if failing == "download":
            a.copy_to()  # its copy into the slot is still under way when it raises
        else:
            a.copy_from(b"a" * size)  # its copy from the slot, too
    assert info.value.deferred
    b.copy_from(b"B" * size)  # through the same slot
    assert bytes(b.copy_to()) == b"B" * size
    assert bytes(a.copy_to()) in (b"A" * size, b"a" * size)  # never what went to b


def _memfds() -> int:
    with open("/proc/self/maps") as f:
        return f.read().count("memfd:hvgpu-pinned")


def test_pinned_memory_freed_after_the_connection_ended_lets_go_of_its_memfd(fake_agent):
    before = _memfds()
    conn = Connection(fake_agent.address)
    pinned = Device(connection=conn).pinned(MiB)
    pinned.view[:4] = b"kept"
    assert _memfds() == before + 1
    conn.close()
    assert bytes(pinned.view[:4]) == b"kept"  # still the program's until it lets go
    pinned.close()
    assert _memfds() == before


def test_a_guest_that_cannot_pass_descriptors_does_not_ask_for_memfd_regions(tmp_path):
    """Behind a hybrid-vsock VMM the agent's end is a unix socket, the guest's is not:
    the guest must not take the memfd lane that agent would offer."""
    served = _Served(tmp_path, FakeDevice(), relayed=True)
    dev = Device(connection=served.conn)
    try:
        assert not dev.conn.caps & P.CAP_REGION_MEMFD
        with pytest.raises(CudaError) as info:
            dev.pinned(MiB)
        assert info.value.status == P.CUDA_ERROR_NOT_SUPPORTED
        assert "no pinned memory without a region" in str(info.value)
        assert dev.conn.lane()[0] == "none"
        buf = dev.allocate(2 * MiB)
        buf.copy_from(b"t" * (2 * MiB))
        assert bytes(buf.copy_to()) == b"t" * (2 * MiB)
    finally:
        served.close()
