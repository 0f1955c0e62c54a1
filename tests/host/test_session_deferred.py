"""A synchronisation that reports an earlier one-way frame's error still waits.

CUDA's cuCtxSynchronize, cuStreamSynchronize and cuEventSynchronize return only once
the work they name is done, whatever status they return. Through hvgpu an earlier
one-way frame's error is reported at the next synchronising call; that call must be
carried out all the same, or a program that logs the error and goes on races the GPU.

The double runs kernels at once; here `sleep_ms` runs the way the GPU runs a kernel:
the launch returns, the work goes on, queries say "not ready" until it ends and the
synchronisations wait for it.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hvgpu.host.executor.session import Session
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import socket_pair
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame, hello, read_reply, read_to_eof

PTX = b".version 8.0\n.target sm_90\n.visible .entry sleep_ms(\n .param .u32 ms\n)\n{\n ret;\n}\n\0"
ONEWAY = P.FLAG_ONEWAY
SLEEP_MS = 400


class AsyncKernels(FakeDevice):
    """The double, with `sleep_ms` running behind the launch as a GPU's kernel does."""

    def __init__(self):
        super().__init__()
        self.busy_until = 0.0

    def launch(self, function, grid, block, shared_mem, stream, params):
        if function != "sleep_ms":
            return super().launch(function, grid, block, shared_mem, stream, params)
        self._check()
        self.launches += 1
        start = max(self.busy_until, time.monotonic())
        self.busy_until = start + int.from_bytes(params[:4], "little") / 1000

    def _wait(self):
        time.sleep(max(0.0, self.busy_until - time.monotonic()))

    def synchronize(self):
        self._wait()
        super().synchronize()

    def stream_synchronize(self, stream):
        self._wait()
        super().stream_synchronize(stream)

    def event_synchronize(self, event):
        self._wait()
        super().event_synchronize(event)

    def stream_query(self, stream):
        return time.monotonic() >= self.busy_until and super().stream_query(stream)


@pytest.fixture
def served():
    device = AsyncKernels()
    guest, host = socket_pair()
    session = Session(host, device, peer="guest-deferred")
    thread = threading.Thread(target=session.serve, daemon=True)
    thread.start()
    guest.settimeout(30)
    guest.sendall(hello() + frame("MODULE_LOAD_DATA", seq=2, payload=PTX)
                  + frame("MODULE_GET_FUNCTION", 16, "sleep_ms", seq=3)
                  + frame("EVENT_CREATE", 0, seq=4))
    replies = [read_reply(guest) for _ in range(4)]
    assert [status for *_, status, _ in replies] == [0, 0, 0, 0]
    (event,) = codec.REPLY[P.OP["EVENT_CREATE"]].decode(replies[3][4])
    yield guest, event
    guest.shutdown(socket.SHUT_WR)
    read_to_eof(guest)
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize("sync", ["CTX_SYNCHRONIZE", "STREAM_SYNCHRONIZE", "EVENT_SYNCHRONIZE"])
def test_a_synchronisation_that_reports_an_earlier_error_waits_for_the_work_first(served, sync):
    guest, event = served
    args = {"CTX_SYNCHRONIZE": (), "STREAM_SYNCHRONIZE": (0,), "EVENT_SYNCHRONIZE": (event,)}
    # A kernel the GPU is busy with; then a one-way frame the executor refuses (a memset
    # of memory the guest does not own), whose error waits for the next call.
    guest.sendall(frame("LAUNCH_KERNEL", 16, 1, 1, 1, 1, 1, 1, 0, 0,
                        SLEEP_MS.to_bytes(4, "little"), flags=ONEWAY, seq=5)
                  + frame("EVENT_RECORD", event, 0, flags=ONEWAY, seq=6)
                  + frame("MEMSET", 0xDEAD0000, 16, 0, 1, 0, flags=ONEWAY, seq=7)
                  + frame(sync, *args[sync], seq=8)
                  + frame("STREAM_QUERY", 0, seq=9))
    _, op, seq, status, body = read_reply(guest)
    assert (op, seq, status) == (P.OP[sync], 8, P.CUDA_ERROR_INVALID_VALUE)
    failed_op, _, failed_seq, _ = codec.ERROR.decode(body)
    assert (failed_op, failed_seq) == (P.OP["MEMSET"], 7)  # the memset's error, told here
    # ... and the kernel it waited for is done: the stream is idle when it has returned
    _, op, seq, status, _ = read_reply(guest)
    assert (op, seq, status) == (P.OP["STREAM_QUERY"], 9, 0)


def test_a_query_after_an_error_is_still_answered_without_waiting(served):
    """Only the synchronisations wait: a query reports the error and the GPU stays busy."""
    guest, _ = served
    guest.sendall(frame("LAUNCH_KERNEL", 16, 1, 1, 1, 1, 1, 1, 0, 0,
                        SLEEP_MS.to_bytes(4, "little"), flags=ONEWAY, seq=5)
                  + frame("MEMSET", 0xDEAD0000, 16, 0, 1, 0, flags=ONEWAY, seq=6)
                  + frame("STREAM_QUERY", 0, seq=7) + frame("STREAM_QUERY", 0, seq=8))
    assert read_reply(guest)[1:4] == (P.OP["STREAM_QUERY"], 7, P.CUDA_ERROR_INVALID_VALUE)
    assert read_reply(guest)[1:4] == (P.OP["STREAM_QUERY"], 8, P.CUDA_ERROR_NOT_READY)
