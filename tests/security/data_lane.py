"""Helpers of the hostile-guest tests of the data lane: raw frames, a raw guest of
an in-process session, and what an executor process holds (its fds, threads and
memory, read from /proc)."""

from __future__ import annotations

import os
import socket
import threading
import time

from hvgpu.host.executor.session import Session
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import FrameReader, pack_header
from hvgpu.virtio.transport import socket_pair

HELLO = P.OP["HELLO"]


def hello(caps: int = 0, payload: bytes = b"", seq: int = 1, announce: int | None = None) -> bytes:
    """A HELLO frame; ``announce`` overrides the payload length the header gives."""
    body = codec.REQUEST[HELLO].encode((P.VERSION, P.MIN_VERSION, caps, "hostile"))
    plen = len(payload) if announce is None else announce
    return pack_header(HELLO, 0, seq, 0, len(body), plen) + body + payload


def frame(op: str | int, *values, flags: int = 0, seq: int = 2, payload: bytes = b"",
          announce: int | None = None) -> bytes:
    code = P.OP[op] if isinstance(op, str) else op
    body = codec.REQUEST[code].encode(values) if code in codec.REQUEST else b""
    plen = len(payload) if announce is None else announce
    return pack_header(code, flags, seq, 0, len(body), plen) + body + payload


def raw(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(address.removeprefix("unix://"))
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything the agent sends until it closes (socket.timeout if it never does)."""
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return data
        data += chunk


def frames_in(data: bytes) -> list:
    """(flags, op, seq, status, body) of each whole frame in ``data``."""
    out, pos = [], 0
    while pos + P.HEADER.size <= len(data):
        (_, _, flags, op, _, seq, status, blen, _, plen) = P.HEADER.unpack_from(data, pos)
        body = data[pos + P.HEADER.size:pos + P.HEADER.size + blen]
        out.append((flags, op, seq, status, body))
        pos += P.HEADER.size + blen + plen
    return out


def read_reply(sock: socket.socket) -> tuple:
    """The next whole frame (flags, op, seq, status, body), progress frames skipped."""
    while True:
        head = exactly(sock, P.HEADER.size)
        (_, _, flags, op, _, seq, status, blen, _, plen) = P.HEADER.unpack(head)
        body = exactly(sock, blen)
        exactly(sock, plen)
        if not flags & P.FLAG_PROGRESS:
            return flags, op, seq, status, body


def exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def vm_status(agent, vm: str = "vm1") -> dict:
    """``hvgpu status`` of the VM's vGPU 0."""
    return next(s for s in agent.api.status() if s["vm"] == vm and not s.get("device"))


def executor_pid(agent, vm: str = "vm1") -> int:
    """The pid of the VM's executor (it starts with the VM's first connection)."""
    wait_for(lambda: vm_status(agent, vm)["executors"], f"an executor for {vm}")
    return vm_status(agent, vm)["executors"][-1]["pid"]


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def rss(pid: int) -> int:
    """Resident memory in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class SessionGuest:
    """A raw guest talking to an in-process Session (in a thread) over a socket pair.

    ``python_ops`` lists the op of every frame the session's Python path read after
    the handshake: what its C loop did not serve.
    """

    def __init__(self, device, quota=None, ipc=None):
        """``ipc``: the executor's table of exports, where guests are processes of one VM
        (ipc.Exports shared by their sessions)."""
        self.sock, host = socket_pair()
        self.sock.settimeout(30)
        self.session = Session(host, device, peer="test-guest", quota=quota, ipc=ipc)
        self.python_ops: list[int] = []
        read = self.session.reader.read_frame

        def counted():
            hdr, body = read()
            self.python_ops.append(hdr.op)
            return hdr, body

        self.session.reader.read_frame = counted
        self.thread = threading.Thread(target=self.session.serve, daemon=True)
        self.thread.start()
        self.reader = FrameReader(self.sock)
        self.seq = 1
        self.sock.sendall(hello(seq=1))
        hdr, _ = self.reader.read_frame()
        assert hdr.status == 0
        self.python_ops.clear()

    def oneway(self, op: str, *values, payload: bytes = b"") -> bytes:
        """A one-way frame with the next seq, not sent."""
        self.seq += 1
        return frame(op, *values, flags=P.FLAG_ONEWAY, seq=self.seq, payload=payload)

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def call(self, op: str, *values, payload: bytes = b""):
        """(status, the reply's values) or, failed, (status, (failed op, failed seq,
        message)); a reply's payload comes last among its values."""
        self.seq += 1
        self.sock.sendall(frame(op, *values, seq=self.seq, payload=payload))
        hdr, body = self.reader.read_frame()
        data = self.reader.read_payload() if hdr.payload_len else None
        if hdr.status:
            failed_op, _, failed_seq, message = codec.ERROR.decode(body)
            return hdr.status, (failed_op, failed_seq, message)
        values = codec.REPLY[P.OP[op]].decode(body)
        return 0, values + ((data,) if data is not None else ())

    def ok(self, op: str, *values, payload: bytes = b""):
        status, values = self.call(op, *values, payload=payload)
        assert status == 0, (op, status, values)
        return values[0] if len(values) == 1 else values

    def close(self) -> None:
        self.sock.close()
        self.thread.join(30)
        assert not self.thread.is_alive()
