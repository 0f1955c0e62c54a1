"""One agent per state directory; its sockets are never anyone's, even for a moment.

Once, two agents could share one state directory, a second agent with the
same control path removed the live agent's socket, and under umask 000 the
control socket was world-writable until a chmod came. Now the state directory
is locked for the agent's life, the control socket is probed before anything
is removed, and every socket is bound under a private umask.
"""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.errors import HvgpuError, TransportError
from hvgpu.guest import Connection, Device
from hvgpu.host.agent import Agent, AgentConfig
from hvgpu.host.control_api import ControlAPI
from hvgpu.host.control_grpc import ControlClient, serve
from tests.conftest import FAKE_DEVICE, RunningAgent, fake_gpus

M = 1 << 20


@pytest.fixture
def first(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    running.api.attach("vm1", "16M")
    yield running
    running.stop()


def _still_serving(first) -> None:
    client = ControlClient(first.control, timeout=20)
    assert [s["vm"] for s in client.call("list")] == ["vm1"]
    client.close()
    with Connection(first.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(M).close()


def test_a_second_agent_on_the_same_state_directory_refuses_to_start(first, tmp_path):
    config = AgentConfig(listen=[f"unix://{tmp_path}/second.sock"], vsock_port=None,
                         state_dir=first.config.state_dir, mps=False, device=FAKE_DEVICE)
    with pytest.raises(HvgpuError) as info:
        Agent(config, gpus=fake_gpus)
    assert info.value.code == "agent-running"
    assert f"another hvgpu agent (pid {os.getpid()})" in str(info.value)
    assert first.config.state_dir in str(info.value)
    out = CliRunner().invoke(cli, ["--control", str(tmp_path / "second-control.sock"), "agent",
                                   "--state-dir", first.config.state_dir, "--no-vsock",
                                   "--listen", f"unix://{tmp_path}/second.sock"])
    assert out.exit_code == 1 and "another hvgpu agent" in out.output
    assert not (tmp_path / "second.sock").exists()
    _still_serving(first)


def test_a_second_agent_on_the_same_control_socket_leaves_it_alone(first, tmp_path):
    with pytest.raises(TransportError, match="already listening"):
        serve(ControlAPI.__new__(ControlAPI), first.control)
    out = CliRunner().invoke(cli, ["--control", first.control, "agent", "--no-vsock",
                                   "--executor-user", "root",  # (not what is tried here)
                                   "--state-dir", str(tmp_path / "other-state"),
                                   "--listen", f"unix://{tmp_path}/other.sock"])
    assert out.exit_code == 1 and "already listening on" in out.output
    assert not (tmp_path / "other.sock").exists()  # the second agent cleaned up its own
    assert stat.S_ISSOCK(os.stat(first.control).st_mode)
    _still_serving(first)


def test_the_lock_goes_with_the_agent(tmp_path):
    one = RunningAgent(tmp_path, FAKE_DEVICE, slices=True)
    one.stop()
    two = RunningAgent(tmp_path, FAKE_DEVICE, slices=True)  # no agent holds it now
    two.stop()


def test_sockets_are_never_open_to_others_even_under_umask_000(tmp_path, monkeypatch):
    seen = []
    chmod = os.chmod

    def watching(path, mode, *args, **kwargs):  # the mode a path had before any chmod
        try:
            seen.append((str(path), stat.S_IMODE(os.stat(path).st_mode)))
        except OSError:
            pass
        return chmod(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", watching)
    old = os.umask(0)
    try:
        running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    finally:
        os.umask(old)
    try:
        for path in (running.control, str(tmp_path / "vm1.sock"), str(running.socket)):
            seen.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        for path, mode in seen:
            if path.endswith(".sock"):
                assert mode & 0o077 == 0, (path, oct(mode))
    finally:
        running.stop()
    assert os.umask(old) == old  # the agent left the process's umask as it was
