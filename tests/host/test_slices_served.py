"""Slices end to end: control lane, routing, quota, resize, restart, refusal.

The agent runs in a thread with the GPU test double; VMs are unix sockets
bound to a VM name (as hybrid-vsock sockets are), so the transport names the
slice exactly as a vsock CID does.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.errors import ConnectionLost, CudaError, HvgpuError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch, runtime
from hvgpu.host.control_grpc import ControlClient
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.host.test_agent import SAXPY

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
    s = control.call("attach", vm="vm1", mem="64M", compute="25%",
                     allow_time_shared=True)
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
    ControlClient(first.control).call("attach", vm="vm1", mem="48M", compute="50%",
                                     allow_time_shared=True)
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
    out = runner.invoke(cli, base + ["attach", "vm1", "--mem", "0.5G", "--compute", "0.25",
                                     "--allow-time-shared"])
    assert out.exit_code == 0, out.output
    assert "attached vm1: 512 MiB, compute 25% (not enforced), GPU 0" in out.output
    out = runner.invoke(cli, base + ["list"])
    assert "vm1" in out.output and "512 MiB" in out.output and "25%" in out.output
    out = runner.invoke(cli, base + ["status", "--json"])
    assert '"mem_used": 0' in out.output
    out = runner.invoke(cli, base + ["gpus"])
    assert "hvgpu fake GPU" in out.output and "compute time-shared" in out.output
    out = runner.invoke(cli, base + ["attach", "vm3", "--mem", "4X", "--cid", "9"])
    assert out.exit_code == 2 and "not a size" in out.output  # refused before the agent
    with pytest.raises(HvgpuError, match="'4' has no unit"):  # and by the agent itself
        ControlClient(agent.control).call("attach", vm="vm3", mem="4", cid=9)
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


def two_fake_gpus():
    from hvgpu.host.inventory import Gpu

    return [Gpu(i, f"GPU-0000000{i}-0405-0607-0809-0a0b0c0d0e0f", "hvgpu fake GPU", 1 << 30,
                0, 0, False, False, "test double") for i in (0, 1)]


@pytest.fixture
def two_gpu_agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm1#1", "vm2"),
                           gpus=two_fake_gpus)
    yield running
    running.stop()


def test_a_vm_with_two_vgpus_sees_two_devices_and_copies_between_them(two_gpu_agent,
                                                                       monkeypatch):
    monkeypatch.setattr(runtime, "_defaults", {})
    control = ControlClient(two_gpu_agent.control)
    s = control.call("attach", vm="vm1", mem="64M", count=2)
    assert [(v["device"], v["gpu_index"]) for v in s["vgpus"]] == [(0, 0), (1, 1)]
    monkeypatch.setenv("HVGPU_AGENT", ",".join(two_gpu_agent.vm_address(v)
                                               for v in ("vm1", "vm1#1")))
    try:
        assert runtime.device_count() == 2
        d0, d1 = Device(0), Device(1)
        assert d0.conn is not d1.conn and d1.total_memory == 64 * M
        x0 = d0.allocate(16)
        x0.copy_from(np.arange(4, dtype=np.float32))
        x1, y1 = d1.allocate(16), d1.allocate(16)
        x1.copy_from(x0)  # device 0 -> device 1 (cudaMemcpyPeer)
        y1.fill(0)
        saxpy = Program(SAXPY, connection=d1.conn).compile().get_kernel("saxpy")
        launch(saxpy, LaunchConfig(), np.float32(3), x1, y1, 4)
        out = np.empty(4, dtype=np.float32)
        y1.copy_to(out)
        assert list(out) == [0, 3, 6, 9]
        st = {x["device"]: x for x in control.call("status")}
        # each its own quota, charged as the driver takes memory: 512-byte steps on
        # vGPU 0, whole 2 MiB pages in vGPU 1's address window
        assert st[0]["mem_used"] == 512 and st[1]["mem_used"] == 2 * 2 * M
        assert st[0]["executors"][0]["pid"] != st[1]["executors"][0]["pid"]
    finally:
        for conn in runtime._defaults.values():
            conn.close()
    control.close()


def test_adding_and_detaching_vgpus_and_a_device_the_vm_lacks(two_gpu_agent):
    control = ControlClient(two_gpu_agent.control)
    control.call("attach", vm="vm1", mem="32M")
    with pytest.raises(CudaError, match="has 1 vGPU.*hvgpu attach vm1 --mem SIZE --add"):
        Connection(two_gpu_agent.vm_address("vm1#1"))
    added = control.call("attach", vm="vm1", mem="16M", add=True)
    assert (added["device"], added["gpu_index"]) == (1, 1)
    with Connection(two_gpu_agent.vm_address("vm1#1")) as conn:
        assert Device(connection=conn).total_memory == 16 * M
        assert conn.call("DEVICE_GET_COUNT") == (2,)
    with pytest.raises(HvgpuError, match="detach vGPU 1 of 'vm1' first"):
        control.call("detach", vm="vm1", device=0)
    gone = control.call("detach", vm="vm1", device=1)
    assert [v["device"] for v in gone["vgpus"]] == [1]
    with Connection(two_gpu_agent.vm_address("vm1")) as conn:
        assert conn.call("DEVICE_GET_COUNT") == (1,)
    out = CliRunner().invoke(cli, ["--control", two_gpu_agent.control, "attach", "vm2",
                                   "--mem", "8M", "--count", "2"])
    assert out.exit_code == 0, out.output
    assert "device 0: 8 MiB" in out.output and "device 1: 8 MiB" in out.output
    control.close()


def test_vsock_port_plus_n_reaches_vgpu_n_of_the_connecting_vm(two_gpu_agent):
    from hvgpu.host.names import VgpuKey
    from hvgpu.virtio.address import Address

    class VsockListener:  # what the agent opens at --vsock-port + N, as routing sees it
        def __init__(self, port):
            self.address = Address("vsock", cid=-1, port=port)

    agent = two_gpu_agent.agent
    ports = [VsockListener(P.DEFAULT_PORT + n) for n in range(3)]
    for n, listener in enumerate(ports):
        agent.router.device_ports[listener] = n
    two_gpu_agent.api.attach("vm1", "8M", cid=7, count=2)
    def route(listener, peer):
        return agent.router.route(listener, peer, agent.registry, None)

    assert route(ports[0], "vsock:7:1030") == ("slice", VgpuKey("vm1", 0))
    assert route(ports[1], "vsock:7:1031") == ("slice", VgpuKey("vm1", 1))
    route_, why = route(ports[2], "vsock:7:1032")
    assert route_ == "refuse" and "has 2 vGPU(s), not a device 2" in why
    route_, why = route(ports[1], "vsock:8:1033")
    assert route_ == "refuse" and "hvgpu attach VM --mem SIZE --cid 8" in why


def test_guest_info_and_smi_list_every_vgpu_of_the_vm(two_gpu_agent, capsys):
    from hvgpu.guest.cli import main

    two_gpu_agent.api.attach("vm1", "64M", count=2)
    both = ",".join(two_gpu_agent.vm_address(v) for v in ("vm1", "vm1#1"))
    assert main(["--agent", both, "info"]) == 0
    out = capsys.readouterr().out
    assert "vGPU 0: hvgpu fake GPU, 64 MiB" in out and "vGPU 1: hvgpu fake GPU, 64 MiB" in out
    assert main(["--agent", two_gpu_agent.vm_address("vm1"), "info"]) == 0  # no address for 1
    assert "vGPU 1: cannot be reached: " in capsys.readouterr().out
    assert main(["--agent", both, "smi"]) == 0
    out = capsys.readouterr().out
    assert "VM vm1" in out and out.count("| hvgpu fake GPU ") == 2
    assert out.count("0 MiB / 64 MiB") == 2


def test_a_bound_vms_region_changes_only_while_no_cuda_connection_is_open(agent, control):
    s = control.call("attach", vm="vm1", mem="32M", region="1M")
    assert s["region"] == M and control.call("list")[0]["region"] == M
    with Connection(agent.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(M).close()
        with pytest.raises(HvgpuError, match="while its guest has CUDA connections open"):
            control.call("resize", vm="vm1", region="2M")
        assert control.call("list")[0]["region"] == M
    _wait(lambda: control.call("status")[0]["connections"] == 0)
    assert control.call("resize", vm="vm1", region="2M")["region"] == 2 * M
    assert control.call("resize", vm="vm1", region="0")["region"] == 0  # no region any more
    with pytest.raises(HvgpuError, match="not a size for a region"):
        control.call("resize", vm="vm1", region="3M")
    with pytest.raises(HvgpuError, match="nothing to change: give --mem, --compute and/or "
                       "--region"):
        control.call("resize", vm="vm1")
