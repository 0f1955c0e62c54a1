"""The agent and its executors end to end over unix sockets, with the GPU
test double: the handshake, and every kind of bad input a guest can send."""

from __future__ import annotations

import json
import os
import signal
import struct
import socket
import threading
import time

import numpy as np
import pytest

from hvgpu.errors import ConnectionLost, CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import FrameReader, pack_header, send_frame
from hvgpu.virtio.transport import connect

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
SLEEP = 'extern "C" __global__ void sleep_ms(int ms) {}'


def raw(agent, hello=True):
    """A bare socket to the agent, optionally after a correct HELLO."""
    sock = connect(agent.address)
    reader = FrameReader(sock)
    if hello:
        send_frame(sock, 0x01, 0, 1, 0, codec.REQUEST[0x01].encode((1, 1, 0, "raw test")))
        hdr, _ = reader.read_frame()
        assert hdr.status == 0
    return sock, reader


def reply(reader):
    hdr, body = reader.read_frame()
    if hdr.status:
        return hdr, codec.ERROR.decode(body)
    return hdr, codec.REPLY[hdr.op].decode(body)


def saxpy_works(agent) -> bool:
    return saxpy_works_at(agent.address)


def saxpy_works_at(address) -> bool:
    """A whole program (allocate, copy, compile, launch, copy back) gives the right y."""
    with Connection(address) as conn:
        dev = Device(connection=conn)
        kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
        x = np.arange(1000, dtype=np.float32)
        dx, dy = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
        dx.copy_from(x)
        dy.copy_from(np.ones_like(x))
        launch(kernel, LaunchConfig(grid=4, block=256), np.float32(2), dx, dy, 1000)
        out = np.empty_like(x)
        dy.copy_to(out)
        return bool(np.array_equal(out, 2 * x + 1))


def reports(agent, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(agent.reports.glob("*.json")) if agent.reports.exists() else []
        if len(files) >= count:
            return [json.loads(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"expected {count} executor reports")


def test_handshake_names_the_peer_from_the_transport(fake_agent):
    with Connection(fake_agent.address) as conn:
        assert conn.version == 1
        assert conn.peer == f"unix:uid={os.getuid()},pid={os.getpid()}"
        assert conn.caps & P.CAP_PARAM_INFO


def test_newer_guest_is_refused_with_versions_and_agent_serves_on(fake_agent):
    sock, reader = raw(fake_agent, hello=False)
    send_frame(sock, 0x01, 0, 1, 0, codec.REQUEST[0x01].encode((9, 7, 0, "future guest")))
    hdr, (_, _, _, message) = reply(reader)
    assert hdr.status == P.HV_VERSION
    assert "v1..v1" in message and "v7..v9" in message
    assert sock.recv(1) == b""  # closed
    assert saxpy_works(fake_agent)


def test_first_frame_must_be_hello(fake_agent):
    sock, reader = raw(fake_agent, hello=False)
    send_frame(sock, 0x02, 0, 1, 0)
    hdr, (_, _, _, message) = reply(reader)
    assert hdr.status == P.HV_HANDSHAKE and "HELLO" in message


def test_unknown_op_gets_an_explicit_error_and_the_session_goes_on(fake_agent):
    sock, reader = raw(fake_agent)
    send_frame(sock, 0x7F, 0, 2, 0, b"whatever", payload=b"x" * 100)
    hdr, (_, _, _, message) = reply(reader)
    assert hdr.status == P.HV_UNKNOWN_OP and "0x7f" in message
    send_frame(sock, 0x02, 0, 3, 0)
    assert reply(reader)[0].status == 0


def test_unknown_oneway_op_surfaces_at_the_next_sync(fake_agent):
    sock, reader = raw(fake_agent)
    send_frame(sock, 0x7E, P.FLAG_ONEWAY, 2, 0)
    send_frame(sock, 0x02, 0, 3, 0)
    hdr, (failed_op, _, failed_seq, _) = reply(reader)
    assert (hdr.status, hdr.seq, failed_op, failed_seq) == (P.HV_UNKNOWN_OP, 3, 0x7E, 2)
    send_frame(sock, 0x02, 0, 4, 0)
    assert reply(reader)[0].status == 0  # reported once, then cleared


def test_malformed_body_is_refused_and_the_session_goes_on(fake_agent):
    sock, reader = raw(fake_agent)
    send_frame(sock, 0x22, 0, 2, 0, b"\1\2")  # MEM_ALLOC needs 8 bytes
    hdr, (_, _, _, message) = reply(reader)
    assert hdr.status == P.HV_BAD_FRAME and "shorter" in message
    send_frame(sock, 0x22, 0, 3, 0, codec.REQUEST[0x22].encode((64,)))
    assert reply(reader)[0].status == 0


def test_oversize_frame_is_refused_and_the_connection_closed(fake_agent):
    sock, reader = raw(fake_agent)
    sock.sendall(P.HEADER.pack(P.MAGIC, 1, 0, 0x30, 0, 2, 0, 0, 0, P.MAX_PAYLOAD + 1))
    hdr, (_, _, _, message) = reply(reader)
    assert hdr.status == P.HV_OVERSIZE and "closing" in message
    assert sock.recv(1) == b""
    assert saxpy_works(fake_agent)


def test_garbage_instead_of_frames_closes_only_that_connection(fake_agent):
    sock, reader = raw(fake_agent)
    sock.sendall(b"\xde\xad\xbe\xef" * 16)
    hdr, _ = reply(reader)
    assert hdr.status == P.HV_BAD_FRAME
    assert saxpy_works(fake_agent)


def test_truncated_frame_then_gone(fake_agent):
    sock, _ = raw(fake_agent)
    sock.sendall(pack_header(0x22, 0, 2, 0, 8)[:20])
    sock.close()
    assert saxpy_works(fake_agent)


def test_invalid_handles(fake_agent):
    with Connection(fake_agent.address) as conn:
        with pytest.raises(CudaError) as info:
            conn.call("STREAM_SYNCHRONIZE", 12345)
        assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE and "stream" in str(info.value)
        with pytest.raises(CudaError) as info:
            conn.call("MODULE_GET_FUNCTION", 999, "saxpy")
        assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE
        conn.launch(4242, (1, 1, 1), (1, 1, 1), 0, 0, b"")
        with pytest.raises(CudaError) as info:
            conn.call("CTX_SYNCHRONIZE")
        assert info.value.deferred and info.value.op == "LAUNCH_KERNEL"
        assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE
        conn.call("CTX_SYNCHRONIZE")  # cleared after being reported


def test_copy_past_the_end_of_an_allocation(fake_agent):
    with Connection(fake_agent.address) as conn:
        ptr, = conn.call("MEM_ALLOC", 4096)
        conn.copy_to_device(ptr + 4000, b"x" * 200)  # one-way: reported at the next sync
        with pytest.raises(CudaError) as info:
            conn.call("PING")
        assert info.value.status == 1 and "past the end" in str(info.value)
        with pytest.raises(CudaError, match="past the end"):
            conn.copy_from_device(bytearray(8192), ptr)
        with pytest.raises(CudaError, match="not inside any allocation"):
            conn.copy_from_device(bytearray(8), ptr - 64)
        conn.copy_to_device(ptr, b"y" * 4096)  # the drained payload did not desync the stream
        assert conn.copy_from_device(out := bytearray(4096), ptr) is None and out == b"y" * 4096


def test_free_of_a_foreign_pointer(fake_agent):
    with Connection(fake_agent.address) as a, Connection(fake_agent.address) as b:
        ptr, = a.call("MEM_ALLOC", 4096)
        with pytest.raises(CudaError, match="not an allocation of this guest") as info:
            b.call("MEM_FREE", ptr)
        assert info.value.status == 1
        with pytest.raises(CudaError):
            b.copy_from_device(bytearray(16), ptr)  # nor can it read another guest's memory
        a.call("MEM_FREE", ptr)
        with pytest.raises(CudaError):
            a.call("MEM_FREE", ptr)  # double free


def test_kernel_parameter_buffer_must_match_the_layout(fake_agent):
    with Connection(fake_agent.address) as conn:
        kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
        conn.launch(kernel.function, (1, 1, 1), (1, 1, 1), 0, 0, b"\0" * 12)
        with pytest.raises(CudaError, match="parameter buffer is 12 bytes, the kernel takes 28"):
            conn.call("CTX_SYNCHRONIZE")


def test_guest_vanishing_mid_copy_frees_everything_and_others_go_on(fake_agent):
    sock, reader = raw(fake_agent)
    for _ in range(3):
        send_frame(sock, 0x22, 0, 2, 0, codec.REQUEST[0x22].encode((1 << 20,)))
        hdr, (ptr,) = reply(reader)
    body = codec.REQUEST[0x24].encode((ptr, 0))
    sock.sendall(pack_header(0x24, P.FLAG_ONEWAY, 3, 0, len(body), 1 << 20) + body + b"z" * 1000)
    sock.close()
    report, = reports(fake_agent, 1)
    assert report == {"allocated": 3, "freed": 3, "left": 0, "launches": 0, "c_launches": 0}
    assert saxpy_works(fake_agent)


def test_guest_vanishing_while_the_agent_sends_a_large_copy(fake_agent):
    sock, reader = raw(fake_agent)
    send_frame(sock, 0x22, 0, 2, 0, codec.REQUEST[0x22].encode((64 << 20,)))
    _, (ptr,) = reply(reader)
    send_frame(sock, 0x25, 0, 3, 0, codec.REQUEST[0x25].encode((ptr, 64 << 20, 0)))
    sock.recv(1000)
    sock.close()
    report, = reports(fake_agent, 1)
    assert report["left"] == 0
    assert saxpy_works(fake_agent)


def test_a_busy_guest_does_not_hold_up_another(fake_agent):
    busy = Connection(fake_agent.address)
    kernel = Program(SLEEP, connection=busy).compile().get_kernel("sleep_ms")
    launch(kernel, LaunchConfig(), 5000)
    waiting = threading.Thread(target=busy.call, args=("CTX_SYNCHRONIZE",))
    waiting.start()
    assert saxpy_works(fake_agent)
    assert waiting.is_alive()  # the other guest finished while this one was busy
    waiting.join()
    busy.close()


def test_a_killed_executor_loses_its_guest_only(fake_agent):
    victim = Connection(fake_agent.address)
    victim.call("PING")
    pid = next(iter(fake_agent.agent.supervisor.whole))
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ConnectionLost):
        victim.call("PING")
    assert victim.closed
    assert saxpy_works(fake_agent)


def test_sticky_kernel_fault_surfaces_as_cuda_does(fake_agent):
    with Connection(fake_agent.address) as conn:
        kernel = Program('extern "C" __global__ void fault() {}',
                         connection=conn).compile().get_kernel("fault")
        launch(kernel, LaunchConfig())
        with pytest.raises(CudaError) as info:
            conn.call("CTX_SYNCHRONIZE")
        assert info.value.status == 700


def test_agent_without_a_gpu_still_answers_with_the_reason(tmp_path):
    from tests.conftest import RunningAgent

    agent = RunningAgent(tmp_path, "tests.fake_gpu:NoDriver")
    try:
        with Connection(agent.address) as conn:
            conn.call("PING")
            with pytest.raises(CudaError) as info:
                Device(connection=conn).name
            assert info.value.status == P.HV_NO_GPU and "no NVIDIA driver" in str(info.value)
    finally:
        agent.stop()


def test_agent_stop_ends_executors_and_removes_its_socket(tmp_path):
    from tests.conftest import RunningAgent

    agent = RunningAgent(tmp_path, "tests.fake_gpu:FakeDevice")
    conn = Connection(agent.address)
    conn.call("PING")
    agent.stop()
    assert not agent.socket.exists()
    assert not agent.agent.supervisor.whole
    with pytest.raises(ConnectionLost):
        conn.call("PING")


def test_header_layout_is_32_bytes_little_endian():
    head = pack_header(0x35, P.FLAG_ONEWAY, 7, -1, 3, 5)
    assert len(head) == 32
    assert struct.unpack_from("<HBBH", head) == (P.MAGIC, 1, 1, 0x35)
    assert head[:2] == b"HG"


def _client_socket(conn) -> int:
    """The descriptor of conn's socket, which the C library holds: the one whose peer
    is the agent's address."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with probe:
            try:
                peer = probe.getpeername()
            except OSError:
                continue
        if peer == conn.address.path:
            return int(name)
    raise AssertionError("no socket connected to the agent")


def test_a_lone_launch_reaches_the_gpu_without_a_sync(fake_agent):
    conn = Connection(fake_agent.address)
    fd = _client_socket(conn)
    kernel = Program('extern "C" __global__ void noop() {}', connection=conn).compile() \
        .get_kernel("noop")
    launch(kernel, LaunchConfig())
    time.sleep(0.5)  # no sync, no close: only the flusher can have sent it
    hangup = socket.socket(fileno=fd)
    hangup.shutdown(socket.SHUT_RDWR)  # the agent's end sees EOF; nothing more is sent
    hangup.detach()
    report, = reports(fake_agent, 1)
    assert report["launches"] == 1


def test_coalesced_launches_keep_their_order_with_copies(fake_agent):
    with Connection(fake_agent.address) as conn:
        dev = Device(connection=conn)
        kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
        x, y = dev.allocate(16), dev.allocate(16)
        y.fill(0)
        for i in range(1000):  # y += 1*x, with x changed by small coalesced copies
            x.copy_from(np.full(4, i, dtype=np.float32))
            launch(kernel, LaunchConfig(), np.float32(1), x, y, 4)
        out = np.empty(4, dtype=np.float32)
        y.copy_to(out)
        assert list(out) == [sum(range(1000))] * 4


def saxpy_on(conn, x_values):
    """(device, saxpy kernel, x holding x_values, y zeroed), four floats each."""
    dev = Device(connection=conn)
    kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    x, y = dev.allocate(16), dev.allocate(16)
    x.copy_from(np.asarray(x_values, dtype=np.float32))
    y.fill(0)
    return dev, kernel, x, y


def test_runs_of_launches_are_launched_by_the_c_loop_with_the_same_results(fake_agent):
    with Connection(fake_agent.address) as conn:
        dev, kernel, x, y = saxpy_on(conn, range(4))
        for _ in range(1000):
            launch(kernel, LaunchConfig(), np.float32(2), x, y, 4)
        out = np.empty(4, dtype=np.float32)
        y.copy_to(out)
        assert list(out) == [0, 2000, 4000, 6000]
    report, = reports(fake_agent, 1)
    assert report["launches"] == 1000
    assert report["c_launches"] == 1000  # the layout the guest asked for registered it


def test_a_failed_launch_in_a_run_surfaces_at_the_next_sync_and_later_work_still_runs(
        fake_agent):
    with Connection(fake_agent.address) as conn:
        dev, kernel, x, y = saxpy_on(conn, [1] * 4)
        for i in range(401):
            bad = i == 200  # a pointer that is not GPU memory, in the middle of the run
            launch(kernel, LaunchConfig(), np.float32(1), x, y.ptr + (1 << 40) * bad, 4)
        with pytest.raises(CudaError) as caught:
            dev.sync()
        assert caught.value.deferred and caught.value.status == 700
        out = np.empty(4, dtype=np.float32)
        y.copy_to(out)
        assert list(out) == [400] * 4
    report, = reports(fake_agent, 1)
    assert report["launches"] == 401 and report["c_launches"] >= 300


def test_malformed_launch_is_reported_at_the_next_sync(fake_agent):
    sock, reader = raw(fake_agent)
    send_frame(sock, P.OP["LAUNCH_KERNEL"], P.FLAG_ONEWAY, 2, 0, b"\0" * 5)
    send_frame(sock, P.OP["PING"], 0, 3, 0)
    hdr, (failed_op, _, failed_seq, message) = reply(reader)
    assert (hdr.status, failed_op, failed_seq) == (P.HV_BAD_FRAME, P.OP["LAUNCH_KERNEL"], 2)
    assert "shorter" in message
