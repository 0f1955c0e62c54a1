"""Nothing an executor sends may stop the agent.

An executor parses guest modules and runs NVRTC, so it may be compromised.
Once, one malformed message on its control channel ({"op":"reserve","n":"x"})
raised in the agent's loop and every VM lost service. Now the executor lane
is one typed table (hvgpu.host.executor.messages) that both sides encode with and
check on receive, and a message the table does not allow is that executor's
failure: it is killed, its reservations released, and the VM's next
connection gets a new executor.
"""

from __future__ import annotations

import ast
import os
import queue
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hvgpu.guest import Connection, Device
from hvgpu.host.executor import messages
from hvgpu.virtio.transport import connect, receive_message, send_message
from tests.conftest import FAKE_DEVICE, REPO, RunningAgent

M = 1 << 20
SIDES = {"agent": [REPO / "hvgpu/host/agent.py", REPO / "hvgpu/host/supervisor.py"],
         "executor": [REPO / "hvgpu/host/executor/__main__.py",
                      REPO / "hvgpu/host/executor/agent_link.py"]}


def _messages_named(path: Path) -> set:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "messages":
            value = getattr(messages, node.attr)  # AttributeError: a message not in the table
            if isinstance(value, messages.Message):
                found.add(value)
    return found


def _spelled_out_ops(path: Path) -> list:
    """Dict keys "op" and comparisons with an op's name: a message built by hand."""
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            bad += [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value == "op"]
        if isinstance(node, ast.Compare):
            bad += [c.value for c in [node.left, *node.comparators]
                    if isinstance(c, ast.Constant) and c.value in messages.TABLE]
    return bad


@pytest.mark.parametrize("side", list(SIDES))
def test_every_message_either_side_uses_is_in_the_one_table(side):
    used = set().union(*(_messages_named(p) for p in SIDES[side]))
    assert used == set(messages.TABLE.values())  # each is sent or handled by both sides
    for path in SIDES[side]:
        assert _spelled_out_ops(path) == [], path


def test_statuses_on_the_lane_are_named_constants():
    for path in [*SIDES["agent"], *SIDES["executor"], REPO / "hvgpu/host/executor/messages.py"]:
        numbers = [n.value for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.Constant) and type(n.value) is int and n.value >= 10000]
        assert numbers == [], path
    text = (REPO / "hvgpu/host/executor/agent_link.py").read_text()
    assert '"status", 2)' not in text


def test_the_table_round_trips_and_refuses_what_it_does_not_allow():
    data = messages.encode(messages.RESERVE, id=7, n=4096)
    assert messages.decode(data, 0, messages.TO_AGENT) == (messages.RESERVE, {"id": 7, "n": 4096})
    assert messages.decode(messages.encode(messages.CONN, peer="vsock:3"), 1, messages.TO_EXECUTOR)[0] \
        is messages.CONN
    for bad in ({"n": "x"}, {"n": -1}, {"n": True}, {"id": 1}, {"id": 1, "n": 1, "x": 0}):
        with pytest.raises(messages.LaneError):
            messages.encode(messages.RESERVE, **bad)
    with pytest.raises(messages.LaneError, match="goes agent->executor"):
        messages.decode(messages.encode(messages.RETIRE), 0, messages.TO_AGENT)


GARBAGE = [
    (b'{"op":"reserve","n":"x"}', 0),  # as the issue sent it
    (b'{"v":1,"op":"reserve","id":2,"n":"x"}', 0),
    (b"{not json", 0),
    (b"\xff\xfe\x00\x01", 0),
    (b"[1, 2, 3]", 0),
    (b"[" * 100000, 0),
    (b'{"v":1,"op":"launch_missiles"}', 0),
    (b'{"v":1,"op":"reserve","id":2}', 0),
    (b'{"v":1,"op":"reserve","id":2,"n":-5}', 0),
    (b'{"v":1,"op":"reserve","id":2,"n":1152921504606846976}', 0),
    (b'{"v":1,"op":"release","n":true}', 0),
    (b'{"v":1,"op":"usage","id":3,"extra":1}', 0),
    (b'{"v":2,"op":"usage","id":3}', 0),
    (b'{"v":1,"op":"retire"}', 0),  # the agent's message, not an executor's
    (b'{"v":1,"op":"closed","peer":"' + b"a" * 100000 + b'"}', 0),  # oversized
    (messages.encode(messages.RELEASE, n=1), 1),  # a valid message, with a descriptor it must not carry
]


class FakeExecutors:
    """The executors of one VM, played by the test: it holds the executor's end of each
    control channel; the process the agent sees (and may kill) only sleeps."""

    def __init__(self, agent, vm: str, monkeypatch):
        self.ends: queue.Queue = queue.Queue()
        real = agent.supervisor._start

        def start(fd, args, *rest, **kwargs):
            if "--vm" in args and args[args.index("--vm") + 1] == vm:
                end = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(fd))
                proc = subprocess.Popen(["sleep", "600"])
                self.ends.put((end, proc))
                return proc
            return real(fd, args, *rest, **kwargs)

        monkeypatch.setattr(agent.supervisor, "_start", start)


def _receive(end) -> tuple:
    end.settimeout(20)
    data, fds = receive_message(end)
    for fd in fds:
        os.close(fd)
    return messages.decode(data, len(fds), messages.TO_EXECUTOR)


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.fixture
def running(tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    agent.api.attach("vm1", "32M")
    agent.api.attach("vm2", "32M")
    yield agent
    agent.stop()


def _used(running, vm):
    (s,) = [s for s in running.api.status() if s["vm"] == vm]
    return s["mem_used"], len(s["executors"])


def test_a_broken_executor_is_killed_and_released_and_the_agent_serves_on(running,
                                                                          monkeypatch):
    fakes = FakeExecutors(running.agent, "vm2", monkeypatch)
    with Connection(running.vm_address("vm1")) as served:  # a real executor, throughout
        for garbage, nfds in GARBAGE:
            guest = connect(running.vm_address("vm2"))
            end, proc = fakes.ends.get(timeout=20)
            assert _receive(end)[0] is messages.CONN
            send_message(end, messages.encode(messages.RESERVE, id=1, n=4 * M))
            assert _receive(end) == (messages.REPLY, {"id": 1, "ok": True})
            assert _used(running, "vm2") == (4 * M, 1)
            if nfds:
                r, w = os.pipe()
                send_message(end, garbage, [r])
                os.close(r)
                os.close(w)
            else:
                end.send(garbage)
            assert proc.wait(timeout=20) == -signal.SIGKILL, garbage[:40]
            _wait(lambda: _used(running, "vm2") == (0, 0))  # its holdings are released
            assert running.thread.is_alive()
            Device(connection=served).allocate(M).close()  # vm1 never noticed
            guest.close()
            end.close()
    monkeypatch.undo()
    with Connection(running.vm_address("vm2")) as conn:  # a new, real executor for vm2
        Device(connection=conn).allocate(8 * M).close()


@pytest.mark.parametrize("request_", [messages.REGION, messages.USAGE])
def test_an_executor_that_asks_and_never_reads_the_answers_cannot_stop_the_agent(
        running, monkeypatch, request_):
    """Every request is answered on the executor's channel; one that asks without end
    and reads nothing fills it. The agent must not wait on it (every VM would wait
    with it): such an executor is killed."""
    fakes = FakeExecutors(running.agent, "vm2", monkeypatch)
    guest = connect(running.vm_address("vm2"))
    end, proc = fakes.ends.get(timeout=20)
    try:
        assert _receive(end)[0] is messages.CONN
        end.setblocking(False)
        ask = messages.encode(request_, id=1)
        for _ in range(200000):  # far more answers than the channel holds
            try:
                end.send(ask)
            except BlockingIOError:  # the agent reads no more: wait, it may be stuck
                try:
                    end.settimeout(5)
                    end.send(ask)
                    end.setblocking(False)
                except OSError:
                    break
            except OSError:  # the agent closed the channel
                break
        assert proc.wait(timeout=20) == -signal.SIGKILL
        with Connection(running.vm_address("vm1"), timeout=10) as conn:
            Device(connection=conn).allocate(M).close()
    finally:
        end.close()  # an agent stuck sending to it is let go
        guest.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_region_descriptor_that_comes_as_the_wait_times_out_is_not_lost():
    """The agent's answer to REGION carries the VM's region file; one that arrives just
    as the executor stops waiting must still be taken (or closed), never dropped."""
    from hvgpu.host.executor import agent_link

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    link = agent_link.AgentLink(ours)
    r, w = os.pipe()
    os.close(w)

    class LateEvent:
        """Times out, while the answer is delivered at that very moment."""

        def __init__(self, rid):
            self.rid, self.flag = rid, False

        def set(self):
            self.flag = True

        def wait(self, timeout=None):
            if timeout is not None and not self.flag:
                link.deliver({"id": self.rid, "size": 4096, "fd": r})
                return False
            return self.flag

    class Waiting(dict):
        def __setitem__(self, rid, slot):
            slot[0] = LateEvent(rid)
            super().__setitem__(rid, slot)

    link._waiting = Waiting()
    try:
        assert link.region() == (r, 4096)
    finally:
        os.close(r)
        ours.close()
        theirs.close()
