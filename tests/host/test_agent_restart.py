"""An agent killed with SIGKILL loses no slice; its guests reconnect to the new one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hvgpu.errors import ConnectionLost, TransportError
from hvgpu.guest import Connection, Device
from hvgpu.host.control_grpc import ControlClient
from tests.conftest import REPO

AGENT = """
import sys, threading
sys.path.insert(0, {repo!r})
from tests.conftest import RunningAgent, FAKE_DEVICE
from pathlib import Path
agent = RunningAgent(Path({tmp!r}), FAKE_DEVICE, slices=True, vms=("vm1",))
print("ready", flush=True)
threading.Event().wait()
"""


def start(tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", AGENT.format(repo=str(REPO), tmp=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_kill_9_loses_no_slice_and_guests_reconnect(tmp_path):
    first = start(tmp_path)
    try:
        ControlClient(str(tmp_path / "control.sock")).call("attach", vm="vm1", mem="40M",
                                                           compute="30%",
                                                           allow_time_shared=True)
        guest = Connection(f"unix://{tmp_path}/vm1.sock")
        guest.call("PING")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with pytest.raises((ConnectionLost, TransportError)):
        for _ in range(100):  # the guest's executor goes with the agent's control channel
            guest.call("PING")
            time.sleep(0.05)
    again = start(tmp_path)
    try:
        (s,) = ControlClient(str(tmp_path / "control.sock")).call("list")
        assert (s["vm"], s["mem"], s["compute"]) == ("vm1", 40 << 20, 30)
        with Connection(f"unix://{tmp_path}/vm1.sock") as conn:
            assert Device(connection=conn).total_memory == 40 << 20
    finally:
        again.terminate()
        again.wait(timeout=20)
