"""Fixtures of the hostile-guest suite: an agent with slices for vm1 and vm2 (none
attached yet) over unix sockets bound to them, and its control lane."""

from __future__ import annotations

import pytest

from hvgpu.host.control_grpc import ControlClient
from tests.conftest import FAKE_DEVICE, RunningAgent


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    yield running
    running.stop()


@pytest.fixture
def control(agent):
    client = ControlClient(agent.control)
    yield client
    client.close()
