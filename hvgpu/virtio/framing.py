"""Frames on a stream socket: a fixed header, a body, raw payload.

:class:`FrameReader` buffers small frames so that a burst of pipelined
one-way frames costs one ``recv`` and reads bulk payload straight into the
caller's destination (``recv_into``) without an intermediate copy.
It must not interpret bodies or know any op: that is ``codec``'s and the
session's job.
"""

from __future__ import annotations

import socket
from typing import NamedTuple

from hvgpu.errors import ConnectionLost, ProtocolError
from hvgpu.virtio import protocol as P

_HDR = P.HEADER
_SMALL_PAYLOAD = 64 << 10  # below this, header and payload go in one send


class Header(NamedTuple):
    version: int
    flags: int
    op: int
    seq: int
    status: int
    body_len: int
    payload_len: int


class PeerClosed(ConnectionLost):
    """The peer closed the connection cleanly, between two frames."""

    code = "peer-closed"


def pack_header(op: int, flags: int, seq: int, status: int, body_len: int,
                payload_len: int = 0) -> bytes:
    return _HDR.pack(P.MAGIC, P.VERSION, flags, op, 0, seq, status, body_len, 0, payload_len)


def send_frame(sock: socket.socket, op: int, flags: int, seq: int, status: int,
               body: bytes = b"", payload=None) -> None:
    """Send one frame; ``payload`` is any buffer, sent without re-encoding."""
    plen = 0 if payload is None else memoryview(payload).nbytes
    head = pack_header(op, flags, seq, status, len(body), plen) + body
    try:
        if plen == 0:
            sock.sendall(head)
        elif plen < _SMALL_PAYLOAD:
            sock.sendall(head + bytes(payload))
        else:
            sock.sendall(head)
            sock.sendall(memoryview(payload).cast("B"))
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ConnectionLost(f"peer went away while sending: {exc}") from None


class FrameReader:
    """Reads frames from a blocking stream socket.

    The body returned by :meth:`read_frame` is a view into the reader's
    buffer, valid until the next call to :meth:`read_frame`. The frame's
    payload must be consumed (read or skipped) before the next frame.
    """

    def __init__(self, sock: socket.socket, bufsize: int = 1 << 20,
                 max_body: int = P.MAX_BODY, max_payload: int = P.MAX_PAYLOAD):
        self.sock = sock
        self.buf = bytearray(max(bufsize, max_body + _HDR.size))
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.max_body = max_body
        self.max_payload = max_payload
        self.payload_left = 0

    def _fill(self, need: int) -> None:
        """Make at least ``need`` bytes available from ``start``."""
        if self.start + need > len(self.buf):
            n = self.end - self.start
            self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        while self.end - self.start < need:
            try:
                got = self.sock.recv_into(self.view[self.end:])
            except ConnectionResetError:
                got = 0
            if got == 0:
                if self.end == self.start:
                    raise PeerClosed("peer closed the connection")
                raise ConnectionLost(f"peer vanished mid-frame ({self.end - self.start} "
                                     f"of {need} bytes received)")
            self.end += got

    def read_frame(self) -> tuple[Header, memoryview]:
        if self.payload_left:
            raise RuntimeError("previous frame's payload was not consumed")
        self._fill(_HDR.size)
        (magic, version, flags, op, _, seq, status, body_len, _,
         payload_len) = _HDR.unpack_from(self.buf, self.start)
        if magic != P.MAGIC:
            raise ProtocolError(f"bad magic 0x{magic:04x}: not an hvgpu frame",
                                code="bad-frame")
        hdr = Header(version, flags, op, seq, status, body_len, payload_len)
        if body_len > self.max_body:
            raise ProtocolError(f"body of {body_len} bytes exceeds the limit of "
                                f"{self.max_body}", code="oversize")
        if payload_len > self.max_payload:
            raise ProtocolError(f"payload of {payload_len} bytes exceeds the limit of "
                                f"{self.max_payload} per frame", code="oversize")
        self._fill(_HDR.size + body_len)
        body_at = self.start + _HDR.size
        self.start = body_at + body_len
        self.payload_left = payload_len
        return hdr, self.view[body_at:self.start]

    def read_payload_into(self, dest) -> None:
        """Fill ``dest`` (a writable buffer) with the next len(dest) payload bytes."""
        dest = memoryview(dest).cast("B")
        n = dest.nbytes
        if n > self.payload_left:
            raise RuntimeError(f"asked for {n} payload bytes, {self.payload_left} left")
        have = min(self.end - self.start, n)
        if have:
            dest[:have] = self.view[self.start:self.start + have]
            self.start += have
        pos = have
        while pos < n:
            try:
                got = self.sock.recv_into(dest[pos:])
            except ConnectionResetError:
                got = 0
            if got == 0:
                raise ConnectionLost(f"peer vanished mid-payload ({pos} of {n} bytes)")
            pos += got
        self.payload_left -= n

    def read_payload(self) -> bytes:
        data = bytearray(self.payload_left)
        self.read_payload_into(data)
        return bytes(data)

    def skip_payload(self) -> None:
        scratch = bytearray(min(self.payload_left, 1 << 20) or 1)
        while self.payload_left:
            k = min(self.payload_left, len(scratch))
            self.read_payload_into(memoryview(scratch)[:k])
