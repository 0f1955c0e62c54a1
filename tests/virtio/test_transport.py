import os
import socket
import threading

import pytest

from hvgpu.errors import TransportError
from hvgpu.virtio import transport
from hvgpu.virtio.address import parse_address


def _echo_once(listener, seen):
    conn, peer = listener.accept()
    seen.append(peer)
    conn.sendall(conn.recv(100))
    conn.close()


def test_unix_peer_is_named_by_its_credentials(tmp_path):
    listener = transport.listen(f"unix://{tmp_path}/a.sock")
    seen = []
    t = threading.Thread(target=_echo_once, args=(listener, seen))
    t.start()
    sock = transport.connect(f"unix://{tmp_path}/a.sock")
    sock.sendall(b"hi")
    assert sock.recv(10) == b"hi"
    t.join()
    assert seen == [f"unix:uid={os.getuid()},pid={os.getpid()}"]
    listener.close()
    assert not (tmp_path / "a.sock").exists()


def test_stale_socket_is_replaced_but_a_live_one_is_not(tmp_path):
    path = tmp_path / "a.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # leaves the file, nobody listening
    live = transport.listen(f"unix://{path}")
    with pytest.raises(TransportError, match="already listening"):
        transport.listen(f"unix://{path}")
    live.close()
    (tmp_path / "plain").write_text("x")
    with pytest.raises(TransportError, match="not a socket"):
        transport.listen(f"unix://{tmp_path}/plain")


def test_connect_to_nothing_says_whether_the_agent_runs(tmp_path):
    with pytest.raises(TransportError, match="agent running"):
        transport.connect(f"unix://{tmp_path}/none.sock")


def test_hybrid_vsock_both_directions(tmp_path):
    """Guest-initiated: the VMM delivers to <path>_<port>. Host-initiated:
    CONNECT <port> on <path>, answered OK by the VMM."""
    listener = transport.listen(f"hvsock://{tmp_path}/vm.vsock:5170")
    assert (tmp_path / "vm.vsock_5170").exists()
    vmm = socket.socket(socket.AF_UNIX)
    vmm.bind(str(tmp_path / "vm.vsock"))
    vmm.listen()

    def fake_vmm():
        conn, _ = vmm.accept()
        line = b""
        while not line.endswith(b"\n"):
            line += conn.recv(1)
        port = int(line.split()[1])
        # relay the host's connection to the guest side, here the agent's socket
        inner = socket.socket(socket.AF_UNIX)
        inner.connect(f"{tmp_path}/vm.vsock_{port}")
        conn.sendall(b"OK 1073741824\n")
        inner.sendall(conn.recv(100))
        conn.sendall(inner.recv(100))

    seen = []
    threads = [threading.Thread(target=fake_vmm), threading.Thread(target=_echo_once,
                                                                    args=(listener, seen))]
    for t in threads:
        t.start()
    sock = transport.connect(f"hvsock://{tmp_path}/vm.vsock:5170")
    sock.sendall(b"ping")
    assert sock.recv(10) == b"ping"
    for t in threads:
        t.join()
    assert seen == [f"hvsock:{tmp_path}/vm.vsock"]
    listener.close()


def test_hybrid_vsock_refusal_is_reported(tmp_path):
    vmm = socket.socket(socket.AF_UNIX)
    vmm.bind(str(tmp_path / "vm.vsock"))
    vmm.listen()
    t = threading.Thread(target=lambda: vmm.accept()[0].close())
    t.start()
    with pytest.raises(TransportError, match="hybrid-vsock"):
        transport.connect(f"hvsock://{tmp_path}/vm.vsock:9")
    t.join()


def test_tcp_loopback():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    listener = transport.listen(f"tcp://127.0.0.1:{port}")
    seen = []
    t = threading.Thread(target=_echo_once, args=(listener, seen))
    t.start()
    sock = transport.connect(f"tcp://127.0.0.1:{port}")
    sock.sendall(b"x")
    assert sock.recv(1) == b"x"
    t.join()
    assert seen[0].startswith("tcp:127.0.0.1:")
    listener.close()


def test_vsock_without_kernel_support_says_what_to_load():
    if transport.vsock_available():
        pytest.skip("this kernel has AF_VSOCK")
    with pytest.raises(TransportError, match="vhost_vsock"):
        transport.listen(parse_address("vsock://any:5170"))
