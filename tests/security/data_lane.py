"""Helpers of the hostile-guest tests of the data lane: raw frames, and what an
executor process holds (its fds, threads and memory, read from /proc)."""

from __future__ import annotations

import os
import socket
import time

from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

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
