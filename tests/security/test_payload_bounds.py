"""What a guest can make its executor hold in host memory is bounded.

A header's announced length costs nothing until the bytes arrive; payloads
held whole are capped; pinned staging is one pool per executor process, not
one per connection.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device
from hvgpu.host.executor.session import MAX_MODULE_IMAGE, MAX_SOURCE
from hvgpu.host.executor.staging import SLOT_SIZE, SLOTS
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.host.test_agent import reports
from tests.security.data_lane import executor_pid, frame, hello, raw, read_reply, rss

M = 1 << 20
GROWTH = 100 * M  # what the hostile connections below may add to the executor, at most


@pytest.fixture
def agent(tmp_path, monkeypatch):
    monkeypatch.setenv("HVGPU_FAKE_REPORT_PINNED", "1")  # executors inherit it
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    running.agent.config.max_connections_per_vm = 128  # the pool test opens 100 at once
    running.api.attach("vm1", "512M")
    yield running
    running.stop()


def _open(agent):
    sock = raw(agent.vm_address("vm1"))
    sock.sendall(hello())
    assert read_reply(sock)[3] == 0
    return sock


def _peak_rss(pid: int, seconds: float = 2.0) -> int:
    """The executor's largest resident size seen over a while (no allocation is missed
    because it is brief: what these tests catch stays until the connection closes)."""
    peak, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    return peak


def test_announced_payloads_cost_only_the_bytes_that_arrived(agent):
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("PING")
        pid = executor_pid(agent)
        base = rss(pid)
        socks = []
        for _ in range(3):  # over the caps: refused at once, the announced bytes never held
            sock = _open(agent)
            sock.sendall(frame("MODULE_LOAD_DATA", announce=1 << 30))
            flags, op, seq, status, body = read_reply(sock)
            assert status == P.CUDA_ERROR_INVALID_VALUE
            assert f"limit of {MAX_MODULE_IMAGE >> 20} MiB" in codec.ERROR.decode(body)[3]
            socks.append(sock)
            sock = _open(agent)
            sock.sendall(frame("MODULE_COMPILE", "big.cu", "", announce=1 << 30))
            assert read_reply(sock)[3] == P.CUDA_ERROR_INVALID_VALUE
            socks.append(sock)
        for _ in range(3):  # under the cap: announced, one MiB sent, then silence
            sock = _open(agent)
            sock.sendall(frame("MODULE_LOAD_DATA", announce=MAX_MODULE_IMAGE) + b"\0" * M)
            socks.append(sock)
        conn.call("PING")  # the executor took the connections above before this one's frame
        grown = _peak_rss(pid) - base
        for sock in socks:
            sock.close()
        assert grown < GROWTH, f"the executor grew by {grown >> 20} MiB"
        conn.call("PING")  # and the VM is still served


def test_payload_caps_are_clear_errors_and_the_session_goes_on(agent):
    with Connection(agent.vm_address("vm1")) as conn:
        with pytest.raises(CudaError, match=f"limit of {MAX_SOURCE >> 20} MiB") as info:
            conn.call("MODULE_COMPILE", "big.cu", "", payload=b" " * (MAX_SOURCE + 1))
        assert info.value.status == P.CUDA_ERROR_INVALID_VALUE
        conn.call("PING")
        with pytest.raises(CudaError, match="carries no payload") as info:
            conn.call("MEM_ALLOC", 4096, payload=b"x" * 100)
        assert info.value.status == P.HV_BAD_FRAME
        conn.call("PING")


def test_100_copying_connections_pin_no_more_than_one_pool(agent):
    data = np.arange(64 << 10, dtype=np.uint32)  # 256 KiB: through staging, not coalesced
    conns = [Connection(agent.vm_address("vm1")) for _ in range(100)]
    try:
        bufs = []
        for conn in conns:  # every connection holds a copy in flight at once
            buf = Device(connection=conn).allocate(data.nbytes)
            buf.copy_from(data)
            bufs.append(buf)
        for buf in bufs:
            out = np.empty_like(data)
            buf.copy_to(out)
            assert np.array_equal(out, data)
    finally:
        for conn in conns:
            conn.close()
    agent.api.detach("vm1")  # the executor exits and reports what it pinned
    (report,) = reports(agent, 1, timeout=60)
    assert 0 < report["pinned_peak"] <= SLOTS * SLOT_SIZE
