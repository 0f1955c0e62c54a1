"""The agent as one loop: control operations and libvirt events are records run on the
loop's thread, each control operation leaves an audit line, slices cannot be changed
from another thread, and a start that fails leaves nothing behind."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading

import pytest
from click.testing import CliRunner

from hvgpu.errors import HvgpuError
from hvgpu.guest import Connection, Device
from hvgpu.host.agent import Agent, AgentConfig, AgentBusy, AgentStopped
from hvgpu.host.cli import cli
from hvgpu.host.control_api import ControlAPI
from hvgpu.host.control_grpc import ControlClient
from hvgpu.host.executor import messages
from hvgpu.host.names import VgpuKey
from hvgpu.virtio.transport import connect
from tests.conftest import FAKE_DEVICE, RunningAgent, fake_gpus
from tests.security.test_executor_lane import FakeExecutors, _receive, _wait

M = 1 << 20


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    yield running
    running.stop()


def test_control_operations_run_on_the_agents_loop(agent, monkeypatch):
    seen = []
    api = agent.api._api  # the ControlAPI behind the loop's view of it
    real = api.attach
    monkeypatch.setattr(api, "attach", lambda *a, **k: (seen.append(threading.get_ident()),
                                                         real(*a, **k))[1])
    agent.api.attach("vm1", "64M")
    assert seen == [agent.thread.ident]
    record = agent.agent.registry.get(VgpuKey("vm1", 0))
    assert record.ledger.limit == 64 * M  # the registry has the vGPU and its ledger at once


def test_slices_cannot_be_changed_from_another_thread(agent):
    """A caller that bypasses the loop is refused before anything changes."""
    raw = ControlAPI(agent.agent, fake_gpus)
    with pytest.raises(AgentBusy, match="only on the agent's loop"):
        raw.attach("vm1", "64M")
    assert agent.api.list() == []
    assert agent.agent.registry.get(VgpuKey("vm1", 0)) is None


def test_the_registry_follows_attach_resize_and_detach(agent):
    registry = agent.agent.registry
    agent.api.attach("vm1", "64M", count=1)
    with Connection(agent.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(M)
        record = registry.get(VgpuKey("vm1", 0))
        assert record.current is not None and record.connections == 1
        agent.api.resize("vm1", mem="128M")
        assert record.ledger.limit == 128 * M and record.slice.mem == 128 * M
        assert conn.call("DEVICE_TOTAL_MEM", 0)[0] == 128 * M
    agent.api.detach("vm1")
    assert registry.get(VgpuKey("vm1", 0)) is None
    assert registry.keys_of("vm1") == []


def test_a_libvirt_event_is_a_record_the_loop_acts_on(agent):
    pytest.importorskip("libvirt")
    from hvgpu.host.hypervisor import EventKind, LifecycleEvent

    agent.api.attach("vm1", "64M")
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("PING")
        record = agent.agent.registry.get(VgpuKey("vm1", 0))
        ex = record.current
        # as libvirt's thread posts it
        agent.agent.post(LifecycleEvent("vm1", "uuid-of-vm1", EventKind.STOPPED))
        ex.process.wait(timeout=60)  # the VM's executor ends; its slice stays
        assert agent.api.list()[0]["vm"] == "vm1"
        assert agent.agent.call("check", lambda: record.current) is None


def test_every_control_operation_leaves_an_audit_line(agent, caplog):
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    client = ControlClient(agent.control)
    try:
        client.call("attach", vm="vm1", mem="64M")
        with pytest.raises(HvgpuError):
            client.call("detach", vm="nosuch")
        client.call("list")
    finally:
        client.close()
    lines = [r for r in caplog.records if r.name == "hvgpu.audit"]
    text = [r.getMessage() for r in lines]
    me = f"(uid {os.getuid()}, gid {os.getgid()}, pid {os.getpid()}), stating "
    assert any(t.startswith("control attach by ") and me in t and "on the control socket" in t
               and "vm='vm1'" in t and "mem='64M'" in t and "-> ok: vm1#0" in t
               for t in text), text
    assert any(t.startswith("control detach by ") and "vm='nosuch'" in t
               and "-> refused (no-slice)" in t for t in text), text
    assert [r.levelno for r in lines if "control list" in r.getMessage()] == [logging.DEBUG]
    assert all("\n" not in t for t in text)  # one line each, as journald shows them


def test_a_command_waiting_when_the_agent_stops_is_refused(tmp_path):
    agent = Agent(AgentConfig(listen=[f"unix://{tmp_path}/a.sock"], vsock_port=None,
                              state_dir=str(tmp_path / "state"), cache_dir=None,
                              device=FAKE_DEVICE, mps=False, run_dir=str(tmp_path / "run")),
                  gpus=fake_gpus)
    agent.start()
    api = agent.commands(ControlAPI(agent, fake_gpus))
    errors = []

    def caller():
        try:
            api.attach("vm1", "64M")
        except HvgpuError as exc:
            errors.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    while not agent._inbox:  # queued: the loop does not run yet
        t.join(0.01)
    agent.stop()
    agent.serve_forever()  # the loop ends at once, refusing what waits
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], AgentStopped)
    assert "nothing was changed" in str(errors[0])
    with pytest.raises(AgentStopped):
        api.list()


def test_an_agent_whose_control_socket_cannot_open_leaves_no_socket_behind(tmp_path):
    listen = tmp_path / "guests.sock"
    out = CliRunner().invoke(cli, [
        "--control", "/proc/no/such/dir/control.sock", "agent", "--no-vsock",
        "--listen", f"unix://{listen}", "--state-dir", str(tmp_path / "state"),
        "--cache-dir", str(tmp_path / "cache"), "--executor-user", "root", "--no-mps"])
    assert out.exit_code != 0
    assert "control socket" in out.output
    assert "Traceback" not in out.output
    assert not listen.exists()
    # and the state directory is free for the next agent
    Agent(AgentConfig(state_dir=str(tmp_path / "state")), gpus=fake_gpus)._shutdown()


def test_a_vm_event_whose_handling_fails_does_not_stop_the_agent(agent, monkeypatch):
    """libvirt's 'started' for a VM whose executor cannot be started (fork/exec
    failing: EAGAIN under RLIMIT_NPROC of the executor user, EMFILE, ENOMEM) must
    not end the agent."""
    agent.api.attach("vm1", "64M")
    agent.api.attach("vm2", "64M")

    def fail(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    pytest.importorskip("libvirt")
    from hvgpu.host.hypervisor import EventKind, LifecycleEvent

    monkeypatch.setattr(agent.agent.supervisor, "_start", fail)
    # vm1 has no executor: one is started
    agent.agent.post(LifecycleEvent("vm1", "uuid-of-vm1", EventKind.STARTED))
    try:
        # one inbox, in order: the event is handled before this command runs
        assert [s["vm"] for s in agent.api.list()] == ["vm1", "vm2"]
    except AgentStopped:
        pytest.fail("the agent stopped: one VM's failed executor start ended every VM's "
                    "service")
    monkeypatch.undo()
    with Connection(agent.vm_address("vm2")) as conn:
        Device(connection=conn).allocate(M).close()


def _drain(end) -> bytes | None:
    """What a non-blocking read finds after every queued message: b"" at the end of the
    lane, None while the agent still holds its end open."""
    end.setblocking(False)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(end, 1 << 16, 4)
        except BlockingIOError:
            return None
        for fd in fds:
            os.close(fd)
        if not data and not fds:
            return b""


def test_an_executor_that_did_not_take_a_connection_still_ends_with_its_vgpu(tmp_path,
                                                                            monkeypatch):
    """An executor whose lane is full (it reads nothing: stuck or compromised) cannot
    take a connection: it is ended then and there, its guests' connections with it,
    rather than left alive outside its vGPU's books; the connection goes to a new one."""
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    procs, guests = [], []
    try:
        running.api.attach("vm1", "32M")
        fakes = FakeExecutors(running.agent, "vm1", monkeypatch)
        guests.append(connect(running.vm_address("vm1")))
        end1, proc1 = fakes.ends.get(timeout=20)
        procs.append(proc1)
        assert _receive(end1)[0] is messages.CONN
        record = running.agent.registry.get(VgpuKey("vm1", 0))
        ex1 = record.current
        # it reads no more of its lane (compromised, or stuck): the agent's end fills
        running.agent.call("shrink", lambda: ex1.ctrl.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 1))
        while fakes.ends.empty():
            assert len(guests) < 60
            taken = ex1.connections
            guests.append(connect(running.vm_address("vm1")))
            _wait(lambda: ex1.connections > taken or not fakes.ends.empty())
        end2, proc2 = fakes.ends.get(timeout=20)
        procs.append(proc2)
        proc1.wait(timeout=30)  # killed
        assert _drain(end1) == b""
        pids = [e["pid"] for e in running.api.status()[0]["executors"]]
        assert pids == [proc2.pid]
        running.api.detach("vm1")
        assert _drain(end2) == b""  # the current one: its lane was shut down
    finally:
        for g in guests:
            g.close()
        for p in procs:
            p.kill()
            p.wait()
        monkeypatch.undo()
        running.stop()


def test_an_audit_line_does_not_carry_a_huge_argument(agent, caplog):
    """Arguments and results are clipped: a 1 MB argument must not make a 1 MB line
    (journald's LineMax, 48K, would split it into many records)."""
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    client = ControlClient(agent.control)
    try:
        with pytest.raises(HvgpuError):
            client.call("attach", vm="vm1", mem="9" * 1_000_000 + "x")
    finally:
        client.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "hvgpu.audit"]
    assert lines
    assert max(map(len, lines)) < 8192, max(map(len, lines))


def test_a_call_with_an_argument_the_method_does_not_take_is_audited(agent, caplog):
    """A refusal before the operation runs is audited too."""
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    client = ControlClient(agent.control)
    try:
        with pytest.raises(HvgpuError, match="unexpected keyword"):
            client.call("attach", vm="vm1", mem="64M", evil="x")
    finally:
        client.close()
    assert [r for r in caplog.records if r.name == "hvgpu.audit"], "no audit line"


def test_a_status_poll_does_not_hold_other_vms_memory_reservations(tmp_path):
    """status and gpus read NVML (nvmlInit ... nvmlShutdown per call) in the caller's
    thread: while NVML is slow or hung, VMs' memory reservations and new connections go
    on. Here NVML is played by a function that blocks until told."""
    release, block, inside = threading.Event(), threading.Event(), threading.Event()

    def gpus():
        if block.is_set() and not release.is_set():
            inside.set()
            release.wait(120)
        return fake_gpus()

    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",), gpus=gpus)
    try:
        running.api.attach("vm1", "64M")
        conn = Connection(running.vm_address("vm1"))
        conn.call("PING")
        block.set()
        poll = threading.Thread(target=running.api.status, daemon=True)
        poll.start()
        assert inside.wait(30)  # the poll is in NVML
        done = threading.Event()

        def guest():
            Device(connection=conn).allocate(M).close()
            done.set()

        threading.Thread(target=guest, daemon=True).start()
        served = done.wait(30)
        release.set()
        poll.join(30)
        conn.close()
        assert served, "a guest's allocation waited on a status poll's NVML read"
    finally:
        release.set()
        running.stop()


def test_stop_after_the_loop_ended_writes_into_no_other_file(tmp_path):
    """Once the loop has ended, stop() (a second SIGTERM while the control server stops)
    and post() write no wake byte: the pipe's number may belong to another file or
    socket by then."""
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    number = running.agent._wake_w
    running.stop()
    r, w = os.pipe()
    os.dup2(w, number)  # the number, reused by another file
    try:
        running.agent.stop()  # a second SIGTERM
        running.agent.post(object())  # libvirt's thread, late
        os.set_blocking(r, False)
        try:
            stray = os.read(r, 16)
        except BlockingIOError:
            stray = b""
        assert stray == b"", "the stopped agent wrote into a file it no longer owns"
    finally:
        for fd in (r, w, number):
            try:
                os.close(fd)
            except OSError:
                pass


def test_a_caller_cannot_hand_the_agent_an_inventory_of_its_own(agent):
    """The inventory a query is run with is read by the agent, never taken from a
    request (a forged one would be believed)."""
    client = ControlClient(agent.control)
    try:
        with pytest.raises(HvgpuError, match="no argument starting with '_'"):
            client.call("status", _inventory=[{"uuid": "GPU-forged"}])
        assert [g["name"] for g in client.call("gpus")] == [g.name for g in fake_gpus()]
    finally:
        client.close()
    with pytest.raises(TypeError, match="_inventory"):
        agent.api.gpus(_inventory=[])
