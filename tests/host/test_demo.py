"""``hvgpu demo`` (hvgpu/host/demo.py): a clean run ends on its own result, with no error
line from the agent or an executor after it, however late libvirt delivers events.

The demo's runs that check its output line by line are in tests/host/test_cli.py.
"""

from __future__ import annotations

import threading

import pytest

from hvgpu.host.demo import run_demo
from tests.conftest import REPO

pytest.importorskip("libvirt")  # the demo's own domain lives on libvirt's test host


def test_a_demo_without_a_gpu_ends_without_an_error_line(monkeypatch, capfd):
    from hvgpu.host import inventory
    from hvgpu.host.agent import Agent
    from hvgpu.host.hypervisor import LifecycleEvent
    from tests.fake_nvml import FakeNvml

    monkeypatch.setattr(inventory, "_load_nvml", lambda: FakeNvml(fail_init="Driver Not Loaded"))
    attached = threading.Event()
    post = Agent.post

    def late(agent, record):
        # libvirt hands events on from its own thread whenever it gets to them: here
        # only once the demo has attached, as on a loaded host
        if isinstance(record, LifecycleEvent):
            attached.wait(10)
        post(agent, record)

    def echo(line):
        lines.append(line)
        if line.startswith("attach:"):
            attached.set()

    monkeypatch.setattr(Agent, "post", late)
    lines = []
    rc = run_demo(4096, echo=echo, device="tests.fake_gpu:NoDriver",
                  env={"PYTHONPATH": str(REPO)})
    text = "\n".join(lines)
    assert rc == 0, text
    assert "CUDA did NOT run" in lines[-1] and "metadata removed" in text
    # the executors write to the agent's stderr, which the demo's user sees
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if " ERROR " in line or "ERROR:" in line], err
