"""Slices end to end: control lane, routing, quota, resize, restart, refusal.

The agent runs in a thread with the GPU test double; VMs are unix sockets
bound to a VM name (as hybrid-vsock sockets are), so the transport names the
slice exactly as a vsock CID does.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from click.testing import CliRunner

from hvgpu.cli import cli
from hvgpu.errors import ConnectionLost, CudaError, HvgpuError
from hvgpu.guest import Connection, Device
from hvgpu.host.control_lane import ControlClient
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent

M = 1 << 20


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


def test_attach_list_status_detach_over_the_control_lane(agent, control):
    s = control.call("attach", vm="vm1", mem="64M", compute="25%")
    assert (s["vm"], s["mem"], s["compute"], s["gpu_index"]) == ("vm1", 64 * M, 25, 0)
    assert [x["vm"] for x in control.call("list")] == ["vm1"]
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        assert dev.total_memory == 64 * M  # the guest's device is its slice
        held = dev.allocate(10 * M)
        (st,) = control.call("status")
        assert st["mem_used"] == 10 * M and st["connections"] == 1
        assert dev.mem_info() == (54 * M, 64 * M)
        held.close()
    control.call("detach", vm="vm1")
    assert control.call("list") == []


def test_a_guest_cannot_allocate_past_its_quota(agent, control):
    control.call("attach", vm="vm1", mem="32M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm1")) as b:
        held = Device(connection=a).allocate(20 * M)
        with pytest.raises(CudaError) as info:
            Device(connection=b).allocate(20 * M)  # the two connections share one quota
        assert info.value.status == P.CUDA_ERROR_OUT_OF_MEMORY
        assert "quota is 32 MiB; 20 MiB in use" in str(info.value)
        Device(connection=b).allocate(12 * M)  # exactly up to the quota is fine
        held.close()


def test_freed_and_disconnected_memory_returns_to_the_quota(agent, control):
    control.call("attach", vm="vm1", mem="32M")
    with Connection(agent.vm_address("vm1")) as conn:
        buf = Device(connection=conn).allocate(30 * M)
        buf.close()
        Device(connection=conn).allocate(30 * M)
    _wait(lambda: control.call("status")[0]["mem_used"] == 0)
    with Connection(agent.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(30 * M)


def test_resize_grows_live_and_refuses_to_shrink_below_use(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        held = [dev.allocate(12 * M)]
        with pytest.raises(CudaError):
            dev.allocate(8 * M)
        control.call("resize", vm="vm1", mem="32M")
        held.append(dev.allocate(8 * M))  # the same open connection sees the new quota
        assert dev.mem_info()[1] == 32 * M
        with pytest.raises(HvgpuError, match="its guest uses 20 MiB now"):
            control.call("resize", vm="vm1", mem="16M")
        assert control.call("resize", vm="vm1", mem="20M")["mem"] == 20 * M


def test_over_commit_is_refused_with_what_is_free(agent, control):
    control.call("attach", vm="vm1", mem="768M")
    with pytest.raises(HvgpuError, match="GPU 0 .* 256 MiB free"):
        control.call("attach", vm="vm2", mem="512M")


def test_a_vm_socket_without_a_slice_is_refused_plainly(agent):
    with pytest.raises(CudaError) as info:
        Connection(agent.vm_address("vm2"))
    assert info.value.status == P.HV_NO_SLICE
    assert "hvgpu attach vm2 --mem SIZE" in str(info.value)


def test_detach_disconnects_the_vms_guests(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    conn = Connection(agent.vm_address("vm1"))
    conn.call("PING")
    control.call("detach", vm="vm1")
    with pytest.raises(ConnectionLost):
        for _ in range(50):
            conn.call("PING")
            time.sleep(0.05)


def test_agent_restart_keeps_every_slice_and_guests_reconnect(tmp_path):
    first = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    ControlClient(first.control).call("attach", vm="vm1", mem="48M", compute="50%")
    with Connection(first.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(M).close()
    first.stop()
    again = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        (s,) = ControlClient(again.control).call("list")
        assert (s["mem"], s["compute"]) == (48 * M, 50)
        with Connection(again.vm_address("vm1")) as conn:
            assert Device(connection=conn).total_memory == 48 * M
    finally:
        again.stop()


def test_a_killed_slice_executor_releases_its_reservations(agent, control):
    control.call("attach", vm="vm1", mem="32M")
    victim = Connection(agent.vm_address("vm1"))
    held = Device(connection=victim).allocate(30 * M)
    (st,) = control.call("status")
    os.kill(st["executors"][0]["pid"], signal.SIGKILL)
    _wait(lambda: control.call("status")[0]["mem_used"] == 0)
    with Connection(agent.vm_address("vm1")) as conn:  # a fresh executor, the whole quota
        Device(connection=conn).allocate(30 * M)


def test_cli_talks_to_the_agent_with_json_and_tables(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    out = runner.invoke(cli, base + ["attach", "vm1", "--mem", "0.5G", "--compute", "0.25"])
    assert out.exit_code == 0, out.output
    assert "attached vm1: 512 MiB, compute 25%, GPU 0" in out.output
    out = runner.invoke(cli, base + ["list"])
    assert "vm1" in out.output and "512 MiB" in out.output and "25%" in out.output
    out = runner.invoke(cli, base + ["status", "--json"])
    assert '"mem_used": 0' in out.output
    out = runner.invoke(cli, base + ["gpus"])
    assert "hvgpu fake GPU" in out.output and "compute time-shared" in out.output
    out = runner.invoke(cli, base + ["attach", "vm3", "--mem", "4X", "--cid", "9"])
    assert out.exit_code == 1 and "not a size" in out.output
    out = runner.invoke(cli, base + ["attach", "vm9", "--mem", "1G"])
    assert out.exit_code == 1 and "pass --cid N" in out.output
    out = runner.invoke(cli, base + ["detach", "nope"])
    assert out.exit_code == 1 and "no slice is attached to 'nope'" in out.output


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")
