"""Refused connections cost the agent almost nothing, and a VM's connections are capped.

Once, each refused connection (a VM with no slice: over vsock, any VM on the
host) held an agent thread and a 1 MiB buffer for as long as its peer
trickled bytes: 400 gave 409 threads and 446 MiB, and the agent died at 250
under an address-space limit. Nor was there any limit on a VM's open
connections. Now refusals are answered from the agent's selector loop with
a deadline and a byte budget, at most MAX_REFUSALS wait at once, and a VM
past --max-connections-per-vm is refused with its own status.
"""

from __future__ import annotations

import os
import resource
import threading
import time

import pytest
from click.testing import CliRunner

from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.guest import Connection, Device
from hvgpu.host import agent as agent_module
from hvgpu.host import router as router_module
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import FrameReader, pack_header
from hvgpu.virtio.transport import connect
from tests.conftest import FAKE_DEVICE, RunningAgent

M = 1 << 20


@pytest.fixture
def running(tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    agent.api.attach("vm1", "32M")
    yield agent
    agent.stop()


def _socket_inodes() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _inode(sock) -> str:
    return f"socket:[{os.fstat(sock.fileno()).st_ino}]"


def _connect(address: str):
    """connect(), again while the listen backlog is full (a unix socket says EAGAIN)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return connect(address)
        except TransportError as exc:
            if "temporarily unavailable" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _hello() -> bytes:
    body = codec.REQUEST[0x01].encode((1, 1, 0, "refused guest"))
    return pack_header(0x01, 0, 7, 0, len(body)) + body


def test_hundreds_of_silent_or_trickling_refused_peers_stay_bounded(running):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    served = Connection(running.vm_address("vm1"))
    dev = Device(connection=served)
    threads_before = threading.active_count()
    sockets_before = _socket_inodes()
    peers = []
    try:
        for i in range(400):
            peer = _connect(running.vm_address("vm2"))  # vm2 has no slice
            peers.append(peer)
            if i % 2:
                peer.send(b"\x48")  # a header's first byte; the rest never comes
            if i % 50 == 0:
                dev.allocate(M).close()  # vm1 is served all along
        for round_ in range(3):
            for peer in peers[1::2]:
                try:
                    peer.send(b"\x00")  # trickling
                except OSError:
                    pass  # the agent has closed it: that is the point
            dev.allocate(M).close()
        threads = threading.active_count()
        ours = {_inode(p) for p in peers}
        agents = _socket_inodes() - ours - sockets_before
        assert threads <= threads_before + 4, threads - threads_before
        assert len(agents) <= router_module.MAX_REFUSALS + 8, len(agents)
        assert running.thread.is_alive()
    finally:
        for peer in peers:
            peer.close()
    with pytest.raises(CudaError) as info:  # a well-behaved refused guest is answered
        Connection(running.vm_address("vm2"))
    assert info.value.status == P.HV_NO_SLICE and "hvgpu attach vm2 --mem SIZE" in str(
        info.value)
    dev.allocate(M).close()
    served.close()


def test_a_refused_guest_gets_its_answer_for_its_own_first_frame(running):
    sock = connect(running.vm_address("vm2"))
    frame = _hello()
    sock.sendall(frame[:5])
    sock.sendall(frame[5:])  # split across sends, as a slow link delivers it
    sock.settimeout(20)
    hdr, body = FrameReader(sock).read_frame()
    assert (hdr.op, hdr.seq, hdr.status, hdr.flags) == (0x01, 7, P.HV_NO_SLICE, P.FLAG_REPLY)
    assert "no GPU slice is attached to VM 'vm2'" in codec.ERROR.decode(body)[-1]
    sock.close()


def test_a_refused_peer_announcing_a_huge_body_is_answered_after_its_header(running):
    sock = connect(running.vm_address("vm2"))
    sock.sendall(pack_header(0x01, 0, 9, 0, 1 << 30))  # a 1 GiB body that never comes
    sock.settimeout(20)
    hdr, _ = FrameReader(sock).read_frame()
    assert (hdr.seq, hdr.status) == (9, P.HV_NO_SLICE)
    sock.close()


def test_a_vm_past_its_connection_limit_is_refused_clearly(running):
    running.agent.config.max_connections_per_vm = 3
    running.api.attach("vm2", "16M")
    held = [Connection(running.vm_address("vm1")) for _ in range(3)]
    with pytest.raises(CudaError) as info:
        Connection(running.vm_address("vm1"))
    assert info.value.status == P.HV_TOO_MANY_CONNECTIONS
    assert "HVGPU_ERROR_TOO_MANY_CONNECTIONS" in str(info.value)
    assert "VM 'vm1' has 3 connections open" in str(info.value)
    assert "--max-connections-per-vm" in str(info.value)
    with Connection(running.vm_address("vm2")) as other:  # another VM is not affected
        Device(connection=other).allocate(M).close()
    held.pop().close()
    deadline = time.monotonic() + 20
    while running.api.status()[0]["connections"] != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with Connection(running.vm_address("vm1")) as again:  # room again: served
        Device(connection=again).allocate(M).close()
    for conn in held:
        conn.close()


def test_the_limit_is_an_agent_option_with_a_sensible_default(monkeypatch, tmp_path):
    assert 1 <= agent_module.AgentConfig().max_connections_per_vm <= 1024
    seen = {}

    class Stop(HvgpuError):
        pass

    def capture(config, gpus=None):
        seen["config"] = config
        raise Stop("stop here")

    monkeypatch.setattr(agent_module, "Agent", capture)
    from hvgpu.host.cli import cli

    out = CliRunner().invoke(cli, ["agent", "--no-vsock", "--state-dir", str(tmp_path),
                                   "--max-connections-per-vm", "5"])
    assert out.exit_code == 1 and "stop here" in out.output
    assert seen["config"].max_connections_per_vm == 5
