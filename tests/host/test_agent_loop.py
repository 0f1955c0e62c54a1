"""The agent as one loop: control operations and libvirt events are records run on the
loop's thread, each control operation leaves an audit line, slices cannot be changed
from another thread, and a start that fails leaves nothing behind."""

from __future__ import annotations

import logging
import threading

import pytest
from click.testing import CliRunner

from hvgpu.errors import HvgpuError
from hvgpu.guest import Connection, Device
from hvgpu.host.agent import Agent, AgentConfig, AgentBusy, AgentStopped
from hvgpu.host.cli import cli
from hvgpu.host.control import ControlAPI
from hvgpu.host.control_lane import ControlClient
from hvgpu.host.names import VgpuKey
from tests.conftest import FAKE_DEVICE, RunningAgent, fake_gpus

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
    assert any(t.startswith("control attach by ") and "(stated) on the control socket" in t
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
