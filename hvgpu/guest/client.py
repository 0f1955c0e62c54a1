"""The guest end of the data lane: one connection to the host agent.

Synchronous ops send a frame and wait for its reply; one-way ops (launches,
host-to-device copies, memsets, event records) are sent and not waited for,
so they pipeline. Small one-way frames are coalesced: they leave in one send
when 64 KiB have gathered, before any synchronous op, or at the latest about
100 µs later (a flusher thread), so a burst of launches costs the agent one
wake-up instead of one per launch while a lone launch still starts at once.
A reply that carries the error of an earlier one-way op raises ``CudaError``
with ``deferred=True``. Every call holds the connection's lock, so threads may
share a connection.

An agent that stays silent for the connection's timeout ($HVGPU_TIMEOUT
seconds, default 60) while a reply is awaited, or takes none of what is sent
for that long, gives ``AgentLost`` and the connection is closed; the agent's
progress frames, sent while it works on something long (a synchronize behind a
long kernel), restart that clock.

A connection that is lost (the agent stopped or was restarted, the executor of
the vGPU ended, the slice was detached, the agent fell silent, or it sent
something that is not the protocol) raises ``hvgpu.errors.AgentLost``: a
``CudaError`` with CUDA_ERROR_DEVICE_UNAVAILABLE (46), the status the
``libcuda.so.1`` shim returns in the same case, and a ``ConnectionLost``. The
connection is closed then and every later call on it raises the same; the GPU
work it held is gone (a new ``Connection`` starts afresh).

Must not import ``hvgpu.host`` or anything the guest package does not ship.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import sys
import threading
import time

from hvgpu import __version__
from hvgpu.errors import (AddressError, AgentLost, CompileError, ConnectionLost, CudaError,
                          HvgpuError, ProtocolError, TransportError)
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.address import Address, parse_address
from hvgpu.virtio.framing import (FrameReader, PeerSilent, pack_header, send_all, send_frame,
                                  set_silence_timeout)
from hvgpu.virtio.transport import connect, send_with_fds
# As the libcuda shim behaves: one definition for both (tuning.py).
from hvgpu.virtio.tuning import BATCH_BYTES, DEFAULT_TIMEOUT, MIN_TIMEOUT, STAGE_MIN
from hvgpu.virtio.tuning import ENV_AGENT as ENV_ADDRESS
from hvgpu.virtio.tuning import ENV_TIMEOUT

CHUNK = 8 << 20  # host-to-device copies travel as frames of this size
SMALL_COPY = 16 << 10  # host-to-device copies up to this size are coalesced too
FLUSH_DELAY = 100e-6  # the longest a coalesced frame waits for company

_HDR = P.HEADER
_LAUNCH_OP = P.OP["LAUNCH_KERNEL"]
# The frame header and LAUNCH_KERNEL's fixed fields in one pack, both from the table.
_LAUNCH = struct.Struct(_HDR.format + codec.REQUEST[_LAUNCH_OP].fixed.format.lstrip("<"))
_HTOD_OP, _FREE_OP = P.OP["MEMCPY_HTOD"], P.OP["MEM_FREE"]
_COMPILE_OPS = (P.OP["MODULE_COMPILE"], P.OP["MODULE_COMPILE_HEADERS"])
_LAUNCH_FIXED = codec.REQUEST[_LAUNCH_OP].fixed.size
_DEVICE_UNAVAILABLE = P.CUDA_ERROR_DEVICE_UNAVAILABLE


def timeout_seconds(text: str | None = None) -> float | None:
    """$HVGPU_TIMEOUT (or ``text``) in seconds: unset gives the default, 0 never
    gives up (None), values under the minimum are raised to it."""
    text = os.environ.get(ENV_TIMEOUT, "") if text is None else text
    if not text.strip():
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0 or seconds == float("inf"):
        raise HvgpuError(f"{ENV_TIMEOUT}={text!r} is not a number of seconds (0: no timeout)",
                         code="bad-timeout")
    return None if seconds == 0 else max(seconds, MIN_TIMEOUT)


def default_address(device: int = 0, text: str | None = None) -> Address:
    """Where this VM's vGPU ``device`` is served.

    ``text`` (default $HVGPU_AGENT): one address per device, comma-separated,
    or one address whose port + N reaches device N (vsock, hvsock, tcp: the
    agent listens so); without it, the host's agent over vsock at the data
    lane's port + N.
    """
    text = os.environ.get(ENV_ADDRESS) if text is None else text
    if not text:
        return Address("vsock", cid=P.HOST_CID, port=P.DEFAULT_PORT + device)
    items = [t.strip() for t in text.split(",") if t.strip()]
    if device < len(items):
        return parse_address(items[device])
    base = parse_address(items[0])
    if len(items) == 1 and base.scheme != "unix":
        return dataclasses.replace(base, port=base.port + device)
    raise AddressError(f"{ENV_ADDRESS}={text!r} gives no address for device {device}: list "
                       "one address per device, comma-separated")


def process_name() -> str:
    """This process as ``ps`` and nvidia-smi name it: its argv[0]."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            first = f.read(4096).split(b"\0", 1)[0]
        if first:
            return first.decode(errors="replace")
    except OSError:
        pass
    return sys.argv[0] if sys.argv and sys.argv[0] else "python"


class Connection:
    """A handshaken connection to the agent; one CUDA context on the host."""

    def __init__(self, address: Address | str | None = None, *, timeout: float | None = None,
                 monitor: bool = False):
        """``timeout``: seconds for connecting and of silence while waiting for the
        agent (default $HVGPU_TIMEOUT, else 60; 0: none). ``monitor``: the connection
        only looks (hvgpu-guest smi), so the vGPU does not list it among its processes."""
        self.address = parse_address(address) if isinstance(address, str) else (
            address or default_address())
        self.timeout = timeout_seconds() if timeout is None else (
            timeout_seconds(str(timeout)) if timeout else None)
        try:
            self.sock = connect(self.address, timeout=self.timeout)
        except TransportError as exc:
            if exc.code != "connect-timeout":
                raise
            raise CudaError(_DEVICE_UNAVAILABLE, f"the hvgpu agent at {self.address} did not "
                            f"accept a connection within {self.timeout:g} s "
                            f"({ENV_TIMEOUT})") from None
        set_silence_timeout(self.sock, self.timeout)
        self.reader = FrameReader(self.sock, bufsize=1 << 16)
        self.lock = threading.RLock()
        self.seq = 0
        self.closed = False
        self.lost: str | None = None  # why the connection was lost, once it is
        self._pending_frees: list[int] = []
        self._out = bytearray()  # coalesced one-way frames not yet sent
        self._out_pending = threading.Event()
        self._flusher: threading.Thread | None = None
        self.shared = None  # hvgpu.guest.shm.SharedLane, made on the first copy that can use it
        wanted = P.CAP_NVRTC | P.CAP_PARAM_INFO | P.CAP_PROGRESS | P.CAP_SHM_DEVICE
        if self.address.scheme == "unix":  # descriptors (memfds) travel on these alone
            wanted |= P.CAP_SHM_MEMFD
        if monitor:
            wanted |= P.CAP_MONITOR
        version, _, caps, max_payload, _, peer, agent = self.call(
            "HELLO", P.VERSION, P.MIN_VERSION, wanted,
            P.client_text(f"hvgpu-guest {__version__}", os.getpid(), process_name()))
        self.version, self.caps, self.peer, self.agent = version, caps, peer, agent
        self.max_payload = max_payload

    # -- framing ------------------------------------------------------------

    def _next_seq(self) -> int:
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return self.seq

    def _check_open(self) -> None:
        if self.closed:
            raise AgentLost(_DEVICE_UNAVAILABLE, self.lost or (
                f"the connection to the hvgpu agent at {self.address} was closed by this "
                "program"))

    def call(self, op: str, *values, payload=None, reply_into=None):
        """Send a synchronous op and return its reply's values.

        ``payload`` is sent raw after the body; a reply payload is read into
        ``reply_into`` (a writable buffer of exactly the reply's size).
        """
        code = P.OP[op]
        body = codec.REQUEST[code].encode(values)
        with self.lock:
            self._check_open()
            self._flush_frees()
            return self._roundtrip(code, body, payload, reply_into)

    def call_with_fds(self, op: str, *values, fds=()):
        """A synchronous op whose frame carries file descriptors (SCM_RIGHTS)."""
        code = P.OP[op]
        body = codec.REQUEST[code].encode(values)
        with self.lock:
            self._check_open()
            seq = self.send_request(code, body, fds)
            return self.read_reply(code, seq)

    def send_request(self, code: int, body: bytes, fds=()) -> int:
        """Send a synchronous op's frame without waiting (lock held); its seq. Replies
        come in the order of their requests: read each with read_reply."""
        self._flush_out()
        seq = self._next_seq()
        frame = pack_header(code, 0, seq, 0, len(body)) + body
        try:
            if fds:
                send_with_fds(self.sock, frame, fds)
            else:
                send_all(self.sock, frame, self._stalled)
        except PeerSilent:
            self._silent(code)
        except (ConnectionLost, OSError) as exc:
            self._broken(exc)
        return seq

    def _await_reply(self, code: int, seq: int):
        """The header and body of the reply to seq, progress frames skipped (lock held)."""
        try:
            while True:
                hdr, rbody = self.reader.read_frame()
                if not hdr.flags & P.FLAG_PROGRESS:
                    break
                self.reader.skip_payload()  # the agent is still at it: wait on
        except PeerSilent:
            self._silent(code)
        except (ConnectionLost, ProtocolError, OSError) as exc:
            self._broken(exc)
        if hdr.seq != seq or not hdr.flags & P.FLAG_REPLY:
            self._broken(ProtocolError(f"reply out of order (seq {hdr.seq}, expected {seq})"))
        return hdr, rbody

    def read_reply(self, code: int, seq: int):
        """The values of the reply to seq (lock held); raises its error."""
        hdr, rbody = self._await_reply(code, seq)
        if hdr.payload_len:
            self._broken(ProtocolError(f"an unexpected payload in the reply to {seq}"))
        if hdr.status != 0:
            self._raise(code, seq, hdr.status, rbody)
        return codec.REPLY[code].decode(rbody)

    def _roundtrip(self, code, body, payload, reply_into):
        self._flush_out()
        seq = self._next_seq()
        try:
            send_frame(self.sock, code, 0, seq, 0, body, payload, self._stalled)
        except PeerSilent:
            self._silent(code)
        except (ConnectionLost, ProtocolError, OSError) as exc:
            self._broken(exc)
        hdr, rbody = self._await_reply(code, seq)
        if hdr.status != 0:
            self.reader.skip_payload()
            self._raise(code, seq, hdr.status, rbody)
        values = codec.REPLY[code].decode(rbody)
        if hdr.payload_len:
            try:
                if reply_into is None:
                    return values + (self.reader.read_payload(),)
                self.reader.read_payload_into(reply_into)
            except PeerSilent:
                self._silent(code)
            except (ConnectionLost, OSError) as exc:
                self._broken(exc)
        return values

    def post(self, op: str, *values, payload=None) -> None:
        """Send a one-way op; its error, if any, surfaces at the next call."""
        code = P.OP[op]
        body = codec.REQUEST[code].encode(values)
        with self.lock:
            self._check_open()
            if payload is None:
                self._queue(pack_header(code, P.FLAG_ONEWAY, self._next_seq(), 0, len(body)) + body)
                return
            self._flush_out()
            try:
                send_frame(self.sock, code, P.FLAG_ONEWAY, self._next_seq(), 0, body, payload,
                           self._stalled)
            except PeerSilent:
                self._silent(code)
            except (ConnectionLost, OSError) as exc:
                self._broken(exc)

    def launch(self, function: int, grid, block, shared_mem: int, stream: int,
               params: bytes) -> None:
        """LAUNCH_KERNEL on the fast path: one pack, coalesced."""
        with self.lock:
            if self.closed:
                self._check_open()
            seq = self.seq = (self.seq + 1) & 0xFFFFFFFF
            self._out += _LAUNCH.pack(P.MAGIC, P.VERSION, P.FLAG_ONEWAY, _LAUNCH_OP, 0, seq, 0,
                                      _LAUNCH_FIXED + len(params), 0, 0, function,
                                      grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                      shared_mem, stream, len(params))
            self._queue(params)

    def _queue(self, frame: bytes) -> None:
        """Add to the coalesced frames (lock held); send when enough gathered."""
        self._out += frame
        if len(self._out) >= BATCH_BYTES:
            self._flush_out()
        elif not self._out_pending.is_set():
            self._out_pending.set()
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                                 name="hvgpu-flusher")
                self._flusher.start()

    def _flush_out(self) -> None:
        """Send the coalesced frames now (lock held)."""
        if self._out:
            # A failed send's traceback may still hold a view of the old buffer (a
            # bytearray with a view cannot be cleared): on failure it is replaced.
            try:
                send_all(self.sock, self._out, self._stalled)
            except PeerSilent:
                self._out = bytearray()
                self._silent(None)
            except (ConnectionLost, OSError) as exc:
                self._out = bytearray()
                self._broken(exc)
            self._out.clear()

    def _flush_loop(self) -> None:
        while True:
            self._out_pending.wait()
            if self.closed:
                return
            time.sleep(FLUSH_DELAY)
            with self.lock:
                self._out_pending.clear()
                if self.closed:
                    return
                try:
                    self._flush_out()
                except HvgpuError:
                    return  # the next call on the connection reports it

    def _may_share(self, n: int) -> bool:
        """Worth asking the shared-memory lane: a large copy, or any once pinned
        memory exists."""
        if not n or not self.caps & (P.CAP_SHM_MEMFD | P.CAP_SHM_DEVICE):
            return False
        return n >= STAGE_MIN or (self.shared is not None and bool(self.shared.pinned))

    def _shared_lane(self):
        if self.shared is None:
            from hvgpu.guest.shm import SharedLane
            self.shared = SharedLane(self)
        return self.shared

    def copy_to_device(self, dst: int, src, stream: int = 0) -> None:
        """Host-to-device copy of any buffer; pipelined (one-way). From pinned memory
        (a shared-memory region) it names offsets; a large pageable source is staged
        through the region; elsewhere its bytes travel on the socket."""
        view = memoryview(src).cast("B")
        n = view.nbytes
        body = codec.REQUEST[_HTOD_OP]
        with self.lock:
            self._check_open()
            if self._may_share(n) and self._shared_lane().upload(dst, view, stream):
                return
            if 0 < n <= SMALL_COPY:  # the bytes are copied here, so the source is free at once
                head = pack_header(_HTOD_OP, P.FLAG_ONEWAY, self._next_seq(), 0, body.fixed.size, n)
                self._queue(head + body.encode((dst, stream)) + bytes(view))
                return
            self._flush_out()
            for off in range(0, n, CHUNK):
                try:
                    send_frame(self.sock, _HTOD_OP, P.FLAG_ONEWAY, self._next_seq(), 0,
                               body.encode((dst + off, stream)), view[off:off + CHUNK],
                               self._stalled)
                except PeerSilent:
                    self._silent(_HTOD_OP)
                except (ConnectionLost, OSError) as exc:
                    self._broken(exc)

    def copy_from_device(self, dst, src: int, stream: int = 0) -> None:
        """Device-to-host copy into any writable buffer; waits for the stream. Into
        pinned memory the bytes come by DMA; a large pageable one is staged through
        the shared-memory region; elsewhere they come on the socket."""
        view = memoryview(dst).cast("B")
        if self._may_share(view.nbytes):
            with self.lock:
                self._check_open()
                self._flush_frees()
                if self._shared_lane().download(view, src, stream):
                    return
        self.call("MEMCPY_DTOH", src, view.nbytes, stream, reply_into=view)

    def free_later(self, dptr: int) -> None:
        """Queue a free from a finaliser; sent before the next synchronous call."""
        self._pending_frees.append(dptr)

    def _flush_frees(self) -> None:
        while self._pending_frees:
            ptr = self._pending_frees.pop()
            try:
                self._roundtrip(_FREE_OP, codec.REQUEST[_FREE_OP].encode((ptr,)), None, None)
            except CudaError:
                pass  # already gone with a reset context; nothing left to free

    # -- errors ---------------------------------------------------------------

    def _raise(self, code: int, seq: int, status: int, body) -> None:
        try:
            failed_op, _, failed_seq, message = codec.ERROR.decode(body)
        except ProtocolError:
            failed_op, failed_seq, message = code, seq, ""
        deferred = failed_seq != seq
        cls = CompileError if (code in _COMPILE_OPS and not deferred) else CudaError
        err = cls(status, message, op=P.op_name(failed_op), deferred=deferred)
        if status in (P.HV_VERSION, P.HV_HANDSHAKE, P.HV_OVERSIZE):
            self.lost = f"the hvgpu agent at {self.address} closed the connection after: {err}"
            self.close()  # the agent closes its end after these
        raise err

    def _stalled(self) -> bool:
        """A send made no headway for the timeout: is the agent still there?"""
        return self.reader.drain_progress() > 0

    def _silent(self, code: int | None):
        self._out = bytearray()  # an agent that takes nothing is sent nothing more
        self._lose(f"the hvgpu agent at {self.address} did not answer for {self.timeout:g} s "
                   f"({ENV_TIMEOUT}); the connection is closed", code)

    def _broken(self, exc: Exception):
        what = "broke the protocol" if isinstance(exc, ProtocolError) else "went away"
        self._lose(f"lost the connection to the hvgpu agent at {self.address} ({what}: {exc}); "
                   "the GPU work of this connection is gone", None)

    def _lose(self, why: str, code: int | None):
        """Close the connection for good and raise AgentLost, as every later call will."""
        self.lost = why
        self.close()
        raise AgentLost(_DEVICE_UNAVAILABLE, why,
                        op=P.op_name(code) if code is not None else "") from None

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            if self.shared is not None:
                self.shared.forget()  # its mappings stay valid; the agent frees its side
            try:
                self._flush_out()  # one-way work already issued still reaches the GPU
            except HvgpuError:
                pass
            self.closed = True
            self._out_pending.set()  # lets the flusher thread end
            try:
                self.sock.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
