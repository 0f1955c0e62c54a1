"""Executors never outlive the agent (issue 11, #13): after kill -9 of the agent,
a host-local executor (whose guest is still connected) and a slice executor
both end, so a restarted agent never finds GPU work it cannot see."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hvgpu.guest import Connection, Device
from hvgpu.host.control_grpc import ControlClient
from tests.conftest import REPO

AGENT = """
import sys, threading
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.conftest import RunningAgent, FAKE_DEVICE
agent = RunningAgent(Path({tmp!r}), FAKE_DEVICE, slices=True, vms=("vm1",))
print("ready", flush=True)
threading.Event().wait()
"""


def executors_of(pid: int) -> set[int]:
    """Live executor processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _alive(int(entry.name)):
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid and b"hvgpu.host.executor" in cmdline:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running, not a zombie left to a parent that does not reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_kill_9_of_the_agent_ends_every_executor(tmp_path):
    agent = subprocess.Popen([sys.executable, "-c", AGENT.format(repo=str(REPO), tmp=str(tmp_path))],
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    guests = []
    try:
        assert agent.stdout.readline().strip() == "ready"
        control = ControlClient(str(tmp_path / "control.sock"))
        control.call("attach", vm="vm1", mem="40M")
        control.close()
        for address in (f"unix://{tmp_path}/vm1.sock", f"unix://{tmp_path}/agent.sock"):
            guests.append(Connection(address))
            assert Device(connection=guests[-1]).total_memory  # its executor is serving
        executors = executors_of(agent.pid)
        assert len(executors) == 2, executors  # the slice's and the host-local one
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    deadline = time.monotonic() + 60  # generous: a loaded machine, no timing claim
    while any(_alive(pid) for pid in executors) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in executors if _alive(pid)]
    for pid in left:  # do not leave them behind for the next test
        os.kill(pid, signal.SIGKILL)
    for guest in guests:
        guest.close()
    assert not left, f"executors {left} outlived the agent"
