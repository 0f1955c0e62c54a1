"""Frames on a stream socket: a fixed header, a body, raw payload.

:class:`FrameReader` buffers small frames so that a burst of pipelined
one-way frames costs one ``recv`` and reads bulk payload straight into the
caller's destination (``recv_into``) without an intermediate copy. What it
holds grows with the bytes that arrived, never with what a header announces:
a peer that announces a large body or payload and then goes quiet costs only
what it sent.

A reader given ``mid_frame_silence`` raises :class:`PeerSilent` when the peer
sends part of a frame and then nothing, or fewer than MID_FRAME_PROGRESS bytes,
for that long: between frames a peer may be idle as long as it likes, but a
frame begun is held in memory (and reserved for) until it ends.

A socket given a silence timeout (:func:`set_silence_timeout`) raises
:class:`PeerSilent` when the peer sends nothing, or takes nothing, for that
long; a busy peer says it is still there with progress frames
(``FLAG_PROGRESS``), which :meth:`FrameReader.drain_progress` consumes while
a send is stalled.

It must not interpret bodies or know any op: that is ``codec``'s and the
session's job.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Callable, NamedTuple

from hvgpu.errors import ConnectionLost, ProtocolError
from hvgpu.virtio import protocol as P

_HDR = P.HEADER
_SMALL_PAYLOAD = 64 << 10  # below this, header and payload go in one send
_CHUNK = 1 << 20  # a payload read whole, or skipped, moves through this much at a time
MAX_HELD_FDS = 4  # descriptors received and not yet taken by a frame
# Bytes a frame begun must bring in each span of the reader's mid-frame silence: a
# guest under emulation sends that in well under a second.
MID_FRAME_PROGRESS = 64 << 10
_FD_SPACE = socket.CMSG_SPACE(MAX_HELD_FDS * 4)
_SILENT = (BlockingIOError, TimeoutError)  # a kernel (SO_RCVTIMEO) or Python timeout passed


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


class PeerSilent(ConnectionLost):
    """The peer sent nothing, or took nothing, for the socket's silence timeout."""

    code = "peer-silent"


def set_silence_timeout(sock: socket.socket, seconds: float | None) -> None:
    """Make a blocking socket's receives and sends give up after ``seconds``
    without progress (None or 0: never).

    The kernel keeps the timeout (SO_RCVTIMEO/SO_SNDTIMEO), so a frame costs
    no extra system call; a receive or send that times out raises
    :class:`PeerSilent` here and in :func:`send_all`.
    """
    seconds = max(0.0, seconds or 0.0)
    whole = int(seconds)
    tv = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    target = sock
    if sock.family == getattr(socket, "AF_VSOCK", None):
        # Python passes an AF_VSOCK socket's option values as 64-bit integers, never as
        # bytes, but the kernel takes these two as a struct timeval: set them through a
        # second descriptor of the same socket that Python treats as a plain one.
        target = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, os.dup(sock.fileno()))
    try:
        target.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        target.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    finally:
        if target is not sock:
            target.close()


def send_all(sock: socket.socket, data, on_stall: Callable[[], bool] | None = None) -> None:
    """Send every byte of ``data``.

    When a send timeout passes with nothing sent, ``on_stall()`` says whether
    the peer is still there (True: keep trying); without it, or when it says
    False, the peer is silent.
    """
    view = memoryview(data).cast("B")
    try:
        while view.nbytes:
            try:
                view = view[sock.send(view):]
            except _SILENT:
                if on_stall is None or not on_stall():
                    raise PeerSilent("the peer took no data for the connection's "
                                     "timeout") from None
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ConnectionLost(f"peer went away while sending: {exc}") from None


def pack_header(op: int, flags: int, seq: int, status: int, body_len: int,
                payload_len: int = 0) -> bytes:
    return _HDR.pack(P.MAGIC, P.VERSION, flags, op, 0, seq, status, body_len, 0, payload_len)


def send_frame(sock: socket.socket, op: int, flags: int, seq: int, status: int,
               body: bytes = b"", payload=None, on_stall: Callable[[], bool] | None = None
               ) -> None:
    """Send one frame; ``payload`` is any buffer, sent without re-encoding."""
    plen = 0 if payload is None else memoryview(payload).nbytes
    head = pack_header(op, flags, seq, status, len(body), plen) + body
    if plen == 0:
        send_all(sock, head, on_stall)
    elif plen < _SMALL_PAYLOAD:
        send_all(sock, head + bytes(payload), on_stall)
    else:
        send_all(sock, head, on_stall)
        send_all(sock, payload, on_stall)


class FrameReader:
    """Reads frames from a blocking stream socket.

    The body returned by :meth:`read_frame` is a view into the reader's
    buffer, valid until the next call to :meth:`read_frame`. The frame's
    payload must be consumed (read or skipped) before the next frame.
    The buffer starts at ``bufsize`` and grows, by replacing it, only when a
    frame whose header has arrived needs more (at most ``max_body`` plus a
    header); ``buf``, ``start`` and ``end`` may be read directly (the C loop
    of one-way frames does, and moves ``start`` past the frames it served).
    """

    def __init__(self, sock: socket.socket, bufsize: int = 64 << 10,
                 max_body: int = P.MAX_BODY, max_payload: int = P.MAX_PAYLOAD,
                 accept_fds: bool = False, mid_frame_silence: float | None = None):
        self.sock = sock
        self.mid_frame_silence = mid_frame_silence
        self._since: float | None = None  # when the current span of a frame's bytes began
        self._moved = 0  # bytes of the frame in that span
        # Descriptors the peer sent (SCM_RIGHTS, unix sockets only), oldest first; the
        # frame that announces one takes it (take_fd), the reader closes the rest.
        self.fds: list[int] | None = [] if accept_fds else None
        self.buf = bytearray(max(bufsize, _HDR.size))
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0
        self.max_body = max_body
        self.max_payload = max_payload
        self.payload_left = 0

    def _recv_into(self, view: memoryview, flags: int = 0) -> int:
        try:
            if self.fds is not None:
                return self._recvmsg_into(view, flags)
            return self.sock.recv_into(view, 0, flags)
        except ConnectionResetError:
            return 0
        except _SILENT:
            if flags & socket.MSG_DONTWAIT:
                raise
            raise PeerSilent("the peer sent nothing for the connection's timeout") from None

    def _recv_begun(self, view: memoryview) -> int:
        """A receive of the rest of a frame already begun: with ``mid_frame_silence``,
        each such span of time must bring MID_FRAME_PROGRESS bytes (or the frame's end),
        so neither silence nor a trickle holds a frame open. Data already there costs no
        wait and no extra system call."""
        silence = self.mid_frame_silence
        if not silence:
            return self._recv_into(view)
        while True:
            try:
                got = self._recv_into(view, socket.MSG_DONTWAIT)
                self._progress(got, silence)
                return got
            except _SILENT:
                pass
            left = silence - (time.monotonic() - self._since) if self._since else silence
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
            if not poller.poll(max(left, 0.0) * 1000):
                self._progress(0, silence)

    def _progress(self, got: int, silence: float) -> None:
        """Count ``got`` bytes of a frame begun; past a span of ``silence`` seconds
        that brought too few, the peer is silent."""
        now = time.monotonic()
        if self._since is None:
            self._since, self._moved = now, 0
        self._moved += got
        if now - self._since >= silence:
            if self._moved < MID_FRAME_PROGRESS:
                raise PeerSilent(f"the peer sent part of a frame, then {self._moved} bytes in "
                                 f"{silence:g} s (at least {MID_FRAME_PROGRESS} are needed)")
            self._since, self._moved = now, 0

    def _recvmsg_into(self, view: memoryview, flags: int) -> int:
        got, ancillary, _, _ = self.sock.recvmsg_into([view], _FD_SPACE,
                                                      flags | socket.MSG_CMSG_CLOEXEC)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = list(memoryview(data).cast("i")[:len(data) // 4])
                keep = max(0, MAX_HELD_FDS - len(self.fds))
                self.fds.extend(fds[:keep])
                for fd in fds[keep:]:  # a peer that floods descriptors keeps none of them
                    os.close(fd)
        return got

    def take_fd(self) -> int | None:
        """The oldest descriptor the peer sent and no frame took yet, now the caller's."""
        return self.fds.pop(0) if self.fds else None

    def close_fds(self) -> None:
        while self.fds:
            os.close(self.fds.pop())

    def _fill(self, need: int) -> None:
        """Make at least ``need`` bytes available from ``start``."""
        if self.start + need > len(self.buf):
            n = self.end - self.start
            if need > len(self.buf):  # a larger body than any before: only now, as it comes
                size = max(need, min(2 * len(self.buf), self.max_body + _HDR.size))
                grown = bytearray(size)
                grown[:n] = self.view[self.start:self.end]
                self.buf, self.view = grown, memoryview(grown)
            else:
                self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        while self.end - self.start < need:
            view = self.view[self.end:]
            got = self._recv_begun(view) if self.end > self.start else self._recv_into(view)
            if got == 0:
                if self.end == self.start:
                    raise PeerClosed("peer closed the connection")
                raise ConnectionLost(f"peer vanished mid-frame ({self.end - self.start} "
                                     f"of {need} bytes received)")
            self.end += got

    def fill(self, need: int) -> None:
        """Wait until ``need`` bytes from ``start`` are buffered, without growing the
        buffer: the rest of a frame the C loop serves, arrived in part."""
        if need > len(self.buf):
            raise ValueError(f"{need} bytes do not fit the {len(self.buf)}-byte buffer")
        self._fill(need)

    def read_frame(self) -> tuple[Header, memoryview]:
        if self.payload_left:
            raise RuntimeError("previous frame's payload was not consumed")
        self._since = None  # a new frame: its progress is counted afresh
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

    def drain_progress(self) -> int:
        """Consume the progress frames already received, without waiting; how many.

        Anything else that arrived stays buffered for :meth:`read_frame`.
        """
        if self.payload_left:
            return 0
        if self.end == len(self.buf) and self.start:
            n = self.end - self.start
            self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        if self.end < len(self.buf):
            try:
                self.end += self._recv_into(self.view[self.end:], socket.MSG_DONTWAIT)
            except OSError:  # nothing there yet, or gone: read_frame will say which
                pass
        count = 0
        while self.end - self.start >= _HDR.size:
            (magic, _, flags, _, _, _, _, body_len, _,
             payload_len) = _HDR.unpack_from(self.buf, self.start)
            if magic != P.MAGIC or not flags & P.FLAG_PROGRESS or body_len or payload_len:
                break
            self.start += _HDR.size
            count += 1
        return count

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
            got = self._recv_begun(dest[pos:])
            if got == 0:
                raise ConnectionLost(f"peer vanished mid-payload ({pos} of {n} bytes)")
            pos += got
        self.payload_left -= n

    def read_payload(self) -> bytes:
        """The whole payload. It is held as it arrives, so a peer that announces
        more than it sends costs what it sent, not what it announced."""
        data = bytearray()
        scratch = memoryview(bytearray(min(self.payload_left, _CHUNK)))
        while self.payload_left:
            k = min(self.payload_left, len(scratch))
            self.read_payload_into(scratch[:k])
            data += scratch[:k]
        return bytes(data)

    def skip_payload(self) -> None:
        scratch = memoryview(bytearray(min(self.payload_left, _CHUNK) or 1))
        while self.payload_left:
            self.read_payload_into(scratch[:min(self.payload_left, len(scratch))])
