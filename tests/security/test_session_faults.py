"""A guest cannot leave a session half-dead: any fault ends that session alone,
cleanly, and a closed session gives back its socket and resources at once.

Each test counts what the VM's executor process holds (/proc/PID/fd and
task) before and after hundreds of hostile connections.
"""

from __future__ import annotations

import logging
import threading

import pytest

from hvgpu.guest import Connection
from hvgpu.host.executor.session import Session
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.fake_gpu import FakeDevice
from hvgpu.virtio.transport import socket_pair
from tests.security.data_lane import (executor_pid, fds, frame, frames_in, hello, raw,
                                      read_to_eof, threads, vm_status, wait_for)


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    running.api.attach("vm1", "64M")
    yield running
    running.stop()


def _hello_with_payload(address: str) -> list:
    with raw(address) as sock:
        sock.sendall(hello(payload=b"x" * 64))
        return frames_in(read_to_eof(sock))  # socket.timeout (30 s) if the agent never closes


def test_hello_with_a_payload_gets_an_error_and_the_connection_ends(agent):
    got = _hello_with_payload(agent.vm_address("vm1"))
    assert got, "the guest got no answer before the end of the connection"
    flags, op, seq, status, _ = got[-1]
    assert (op, seq, status) == (P.OP["HELLO"], 1, P.HV_BAD_FRAME)
    assert all(frame[3] != 0 for frame in got)  # no session was opened behind the error


def test_500_bad_hellos_leave_the_executor_as_it_was(agent):
    with Connection(agent.vm_address("vm1")) as conn:  # starts the executor
        conn.call("PING")
    pid = executor_pid(agent)
    wait_for(lambda: vm_status(agent)["connections"] == 0, "the first guest to go")
    fds0, threads0 = fds(pid), threads(pid)
    for _ in range(500):
        _hello_with_payload(agent.vm_address("vm1"))
    wait_for(lambda: vm_status(agent)["connections"] == 0, "the agent to count 0 connections")
    wait_for(lambda: fds(pid) <= fds0 + 5, f"the executor's fds to return near {fds0}")
    wait_for(lambda: threads(pid) <= threads0 + 3, f"its threads to return near {threads0}")
    with Connection(agent.vm_address("vm1")) as conn:  # and it still serves the VM
        conn.call("PING")


def test_100_connections_closed_by_their_guests_release_their_sockets_at_once(agent):
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("PING")
    pid = executor_pid(agent)
    wait_for(lambda: vm_status(agent)["connections"] == 0, "the first guest to go")
    fds0 = fds(pid)
    for _ in range(100):
        with Connection(agent.vm_address("vm1")) as conn:
            conn.call("MEM_ALLOC", 4096)
    wait_for(lambda: vm_status(agent)["connections"] == 0, "the agent to count 0 connections")
    wait_for(lambda: fds(pid) <= fds0 + 5, f"the executor's fds to return near {fds0}")
    assert vm_status(agent)["mem_used"] == 0


class _Broken(FakeDevice):
    """A device whose driver raises what no session expects."""

    def mem_alloc(self, size):
        raise ZeroDivisionError("a bug in the driver layer")


def test_an_unexpected_error_ends_the_session_with_hv_internal_logged_once(caplog):
    guest, host = socket_pair()
    session = Session(host, _Broken(), peer="test-guest")
    thread = threading.Thread(target=session.serve)
    with caplog.at_level(logging.DEBUG, logger="hvgpu.host.executor.session"):
        thread.start()
        guest.settimeout(30)
        guest.sendall(hello() + frame("MEM_ALLOC", 4096, seq=2))
        got = frames_in(read_to_eof(guest))
        thread.join(30)
    assert not thread.is_alive()
    assert [f[3] for f in got] == [0, P.HV_INTERNAL]  # HELLO answered, then the error
    assert got[-1][1:3] == (P.OP["MEM_ALLOC"], 2)
    assert b"ZeroDivisionError" in got[-1][4] and b"a bug in the driver" not in got[-1][4]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and tracebacks[0].levelno == logging.ERROR
    assert session.sock.fileno() == -1  # closed, not left to the garbage collector
    guest.close()



class FlakyEntryDevice(FakeDevice):
    """Every other session cannot be set up: its driver entry points fail."""

    sessions = 0

    def driver_entries(self):
        FlakyEntryDevice.sessions += 1
        if FlakyEntryDevice.sessions % 2 == 0:
            raise RuntimeError("no driver entry points this time")
        return super().driver_entries()


def test_a_session_that_cannot_be_set_up_costs_only_its_connection(tmp_path):
    agent = RunningAgent(tmp_path, "tests.security.test_session_faults:FlakyEntryDevice",
                         slices=True, vms=("vm1",))
    try:
        agent.api.attach("vm1", "64M")
        with Connection(agent.vm_address("vm1")) as conn:  # session 1: served
            conn.call("PING")
        pid = executor_pid(agent)
        with raw(agent.vm_address("vm1")) as sock:  # session 2: let go at once
            try:
                sock.sendall(hello())
                assert read_to_eof(sock) == b""
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed even before the HELLO arrived
        with Connection(agent.vm_address("vm1")) as conn:  # session 3: the same executor
            conn.call("PING")
        assert executor_pid(agent) == pid
        wait_for(lambda: vm_status(agent)["connections"] == 0, "the agent to count 0 connections")
    finally:
        agent.stop()
