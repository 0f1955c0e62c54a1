"""A VM sees its own processes on its vGPU and nothing of another VM's.

VGPU_PROCESSES lists the connections of the executor that serves the asking
connection, and an executor serves one VM's vGPU: a process of vm1 that holds
memory must not appear, nor its memory count, when vm2 asks, nor when a
host-local connection (the whole GPU, an executor of its own) asks. What a
guest states about itself (pid, name) is shown only to its own VM, and a name
cannot carry terminal control bytes into another user's `hvgpu-guest smi`.
"""

from __future__ import annotations

import os

import pytest

from hvgpu.guest import client as client_module
from hvgpu.guest.client import Connection
from hvgpu.host.agent import Agent
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent

M = 1 << 20


@pytest.fixture
def running(tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    agent.api.attach("vm1", "64M", allow_time_shared=True)
    agent.api.attach("vm2", "64M", allow_time_shared=True)
    yield agent
    agent.stop()


def _processes(conn: Connection) -> list[tuple[int, str, int]]:
    count, pids, used, names = conn.call("VGPU_PROCESSES")
    names = names.split("\0") if count else []
    return [(int.from_bytes(pids[4 * i:4 * i + 4], "little"), names[i],
             int.from_bytes(used[8 * i:8 * i + 8], "little")) for i in range(count)]


def test_another_vms_processes_are_never_listed(running):
    with Connection(running.vm_address("vm1")) as vm1:
        vm1.call("MEM_ALLOC", 8 * M)
        with Connection(running.vm_address("vm1"), monitor=True) as look:
            assert [(p, used) for p, _, used in _processes(look)] == [(os.getpid(), 8 * M)]
        with Connection(running.vm_address("vm2"), monitor=True) as other:
            assert _processes(other) == []
            assert other.call("SLICE_INFO")[2] == 0  # nor its memory
        with Connection(running.vm_address("vm2")) as other:  # a process of vm2 itself
            assert [(p, used) for p, _, used in _processes(other)] == [(os.getpid(), 0)]
        with Connection(running.address) as local:  # the whole GPU: its own executor
            assert [used for _, _, used in _processes(local)] == [0]


def test_a_stated_name_reaches_no_terminal_as_control_bytes(running, monkeypatch):
    monkeypatch.setattr(client_module, "process_name", lambda: "\x1b[2Jx\x07" + "y" * 200)
    with Connection(running.vm_address("vm1")) as vm1:
        (pid, name, _), = _processes(vm1)
    assert pid == os.getpid() and name == "?[2Jx?" + "y" * 58


def test_a_hello_without_a_stated_pid_is_listed_as_pid_0(running, monkeypatch):
    monkeypatch.setattr(client_module.P, "client_text", lambda software, pid, name: "old guest")
    with Connection(running.vm_address("vm1")) as vm1:
        assert _processes(vm1) == [(0, "", 0)]


def test_utilisation_is_the_agents_when_it_knows_it(running, monkeypatch):
    with Connection(running.vm_address("vm1")) as vm1:
        assert vm1.call("VGPU_UTILIZATION") == (0, 0)  # not measured: said so
    answer = Agent._answer

    def with_util(self, ex, message, msg):
        reply = answer(self, ex, message, msg)
        return {**reply, "util": 42} if reply is not None and "used" in reply else reply

    monkeypatch.setattr(Agent, "_answer", with_util)
    with Connection(running.vm_address("vm1")) as vm1:
        assert vm1.call("VGPU_UTILIZATION") == (1, 42)


@pytest.mark.parametrize("text", ["x; pid \u00b2; y", "x; pid \u0661\u0662; y",
                                  "x; pid 99999999999; y", "x; pid ; y"])
def test_a_stated_pid_is_ascii_digits_or_none(text):
    """str.isdigit() takes "²" (which int() refuses: the session died after HELLO) and
    Arabic-Indic digits (read as another pid)."""
    assert P.parse_client(text) == (0, "")


def test_a_superscript_pid_leaves_the_session_serving(tmp_path, monkeypatch):
    from hvgpu.guest import client as client_module
    from tests.conftest import FAKE_DEVICE, RunningAgent

    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        agent.api.attach("vm1", "64M")
        monkeypatch.setattr(client_module.P, "client_text",
                            lambda software, pid, name: "evil; pid \u00b2; x")
        with Connection(agent.vm_address("vm1")) as vm1:
            vm1.call("PING")
    finally:
        agent.stop()
