"""Fixtures the shim's tests share."""

from __future__ import annotations

import pytest

from tests.conftest import FAKE_DEVICE, RunningAgent


@pytest.fixture
def sliced(tmp_path):
    """An agent with the GPU test double whose VM vm1 has a 64 MiB slice."""
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    agent.api.attach("vm1", "64M")
    yield agent
    agent.stop()
