"""One guest connection's data lane: handshake, op dispatch, validation.

The session reads frames from the guest's socket, checks every handle and
device address against what this guest owns, and drives a ``GpuDevice``.
One-way ops are never answered; their first error is kept and reported by
the next synchronising op instead of running it (CUDA's asynchronous-error
model); STREAM_END_CAPTURE is run all the same, and a failed one-way frame
invalidates the capture its stream is in. Runs of them are served by a C loop (``launch_burst``) that makes the
same checks against tables the session keeps in step with its own (handles,
device ranges); a frame the loop does not serve comes to the Python path. A malformed frame whose length is known gets an error and the
session goes on; a frame that breaks the framing (bad magic, oversize)
ends the connection after saying why. Anything unexpected ends the session
alone: the guest gets HV_INTERNAL where a reply can still be framed, then the
connection closes; the error is logged once, and everything the guest held,
its socket included, is released at once.

What a guest can make the session hold is bounded: payloads are kept as
their bytes arrive (``framing``), payloads kept whole are capped
(:data:`MAX_MODULE_IMAGE`, :data:`MAX_SOURCE`), and copies go through the
executor's one staging pool. Every send on the guest's socket holds the
session's send lock, so a progress frame (``progress``) never lands inside
a reply.

Must not import CUDA (``cuda_device`` does) and must not touch other guests.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

from hvgpu import __version__
from hvgpu.errors import ConnectionLost, CudaError, ProtocolError
from hvgpu.host.executor import admission, nvrtc_policy
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.device_memory import DeviceMemoryLock
from hvgpu.host.executor.device import (STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD,
                                        GpuDevice)
from hvgpu.host.executor.graphs import Graphs
from hvgpu.host.executor.launch_burst import LaunchBurst, unavailable_reason
from hvgpu.host.executor.progress import Heartbeat
from hvgpu.host.executor.staging import StagingPool
from hvgpu.host.executor.tables import Allocations, Handles
from hvgpu.host.executor.pools import Pools
from hvgpu.host.executor import regions
from hvgpu.host.executor.vmm import VirtualMemory
from hvgpu.host.logs import clip
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as region_layout
from hvgpu.virtio.framing import FrameReader, PeerClosed, pack_header

log = logging.getLogger(__name__)

_HELLO, _PING, _LAUNCH = P.OP["HELLO"], P.OP["PING"], P.OP["LAUNCH_KERNEL"]
_SHM_ATTACH = P.OP["SHM_ATTACH"]
# The lane's bookkeeping, which the guest library does on its own (a region on the first
# large copy, its rooms): a deferred CUDA error waits for the next CUDA call instead,
# which must not lose it, nor leave a room or region held that the guest thinks it gave.
_SHM_SETUP = frozenset(P.OP[name] for name in ("SHM_ATTACH", "SHM_DETACH", "SHM_ALLOC",
                                               "SHM_FREE"))
_LAUNCH_FIXED = codec.REQUEST[_LAUNCH].fixed
# Ending a capture is never skipped for an earlier one-way frame's error (which waits for
# the next call): the capture would go on here while the guest believes it over.
_END_CAPTURE = P.OP["STREAM_END_CAPTURE"]
# A synchronisation that reports an earlier one-way frame's error still waits for the
# work it names first, as the driver's does: a program that logs the error and goes on
# must not find the GPU still busy with what it believed finished.
_WAITS = frozenset(P.OP[name] for name in ("CTX_SYNCHRONIZE", "STREAM_SYNCHRONIZE",
                                           "EVENT_SYNCHRONIZE"))
# Where each op that names a stream has it, among its fixed fields.
_STREAM_FIELD = {code: c.names.index("stream") for code, c in codec.REQUEST.items()
                 if "stream" in c.names}
_OPS_LOGGED = 12  # the busiest ops named in the closing log line; the rest are summed
_HEADER_SIZE = P.HEADER.size
_OP_SEQ = P.header_fields("op", "seq")  # a header's op and seq, read in place
# What a failed frame of the C loop called, for its error.
_DRIVER_CALL = {P.OP[op]: call for op, call in (
    ("LAUNCH_KERNEL", "cuLaunchKernel"), ("LAUNCH_KERNEL_EX", "cuLaunchKernelEx"),
    ("EVENT_RECORD", "cuEventRecord"), ("STREAM_WAIT_EVENT", "cuStreamWaitEvent"),
    ("MEMSET", "cuMemsetAsync"), ("MEMCPY_DTOD", "cuMemcpyDtoDAsync"),
    ("MEMCPY_HTOD", "cuMemcpyHtoDAsync"))}
_LAUNCH_ATTR_SIZE = 72  # sizeof(CUlaunchAttribute)
_MAX_FUNC_ATTRIBUTES = 32  # FUNC_GET_ATTRIBUTES answers in a 32-bit mask
_EVENT_ATTRS = {7, 12}  # PROGRAMMATIC_EVENT, LAUNCH_COMPLETION_EVENT: they hold guest handles

# Payloads a session holds whole before using them; larger ones are refused
# (CUDA_ERROR_INVALID_VALUE) and skipped, so the session goes on.
MAX_MODULE_IMAGE = 256 << 20  # MODULE_LOAD_DATA: a PTX, cubin or fatbin image
MAX_SOURCE = nvrtc_policy.MAX_SOURCE  # MODULE_COMPILE(_HEADERS): source and its headers
_PAYLOAD_LIMITS = {P.OP["MODULE_LOAD_DATA"]: (MAX_MODULE_IMAGE, "module image"),
                   P.OP["MODULE_COMPILE"]: (MAX_SOURCE, "source"),
                   P.OP["MODULE_COMPILE_HEADERS"]: (MAX_SOURCE, "source with its headers")}
_TAKES_PAYLOAD = frozenset(op.code for op in P.OPS if op.request_payload)
# A frame begun and then left unfinished holds memory here until it ends: past this
# much silence in its middle the connection is closed (between frames a guest may be
# idle as long as it likes).
MID_FRAME_SILENCE = 60.0
# How long a compilation waits for the VM's compiler slot before it is refused: two
# compilations that each reach their limits (compiler.py: 60 CPU s, 150 s in all).
COMPILE_WAIT = 300.0
_PROGRESS_FLAGS = P.FLAG_REPLY | P.FLAG_PROGRESS


class Session:
    """Serves one guest connection until it closes."""

    def __init__(self, sock: socket.socket, device: GpuDevice | None, *, peer: str,
                 cache: CompileCache | None = None, device_error: CudaError | None = None,
                 quota=None, owns_device: bool = True, slice_name: str = "",
                 compute: int = 0, vgpus: Callable[[], int] | None = None,
                 staging: StagingPool | None = None, heartbeat: Heartbeat | None = None,
                 on_poisoned: Callable[[int], None] | None = None,
                 shared: regions.Shared | None = None,
                 neighbours: Callable[[], list] | None = None,
                 uploads: admission.UploadBudget | None = None):
        self.slice_name, self.compute = slice_name, compute
        self.sock = sock
        self.send_lock = threading.Lock()
        self.busy: tuple[float, int, int] | None = None  # (since, op, seq) of the frame in work
        self.streaming = False  # a reply's payload is being sent: no other frame may cut in
        self.progress = False  # the guest set CAP_PROGRESS
        self.last_progress = 0.0
        self.tail = b""  # unsent end of a progress frame (send lock held to touch it)
        self.closed = False
        self.heartbeat = heartbeat
        self.device = device
        self.quota = quota  # reserve(n) / release(n) / usage(); None: the whole GPU
        # How many vGPUs the guest's VM has (each its own connection): its device count.
        self.vgpus = vgpus or (lambda: 1)
        # Called with the status of a kernel fault, which poisons the whole process.
        self.on_poisoned = on_poisoned or (lambda status: None)
        self.owns_device = owns_device
        # Every session of this executor (this VM's vGPU alone): VGPU_PROCESSES lists them.
        self.neighbours = neighbours or (lambda: [self])
        self.client_pid, self.client_name = 0, ""  # the process the guest says it is
        self.monitor = False  # the guest only looks (CAP_MONITOR): it is no process here
        self.owns_device = owns_device
        self.device_error = device_error or CudaError(P.HV_NO_GPU, "no device")
        self.peer = peer
        self.cache = cache or CompileCache(None)
        self.reader = FrameReader(sock, accept_fds=sock.family == socket.AF_UNIX,
                                  mid_frame_silence=MID_FRAME_SILENCE)
        self.uploads = uploads or admission.PROCESS_UPLOADS
        self.compile_slots = admission.compile_slots(self.cache.directory)
        self.allocs = Allocations()
        self.charged = 0  # bytes of the slice's quota this guest holds
        self.alloc_charges: dict[int, int] = {}  # allocation -> bytes charged for it
        self.module_charges: dict[int, int] = {}  # module handle -> bytes its load took
        self.exec_charges: dict[int, int] = {}  # instantiated graph -> bytes it took
        self.upload_stream = None  # the executor's own, for uploads at instantiation
        self.globals: dict[int, Allocations] = {}  # module handle -> its variables' ranges
        self.modules = Handles("module")
        self.functions = Handles("function")
        self.streams = Handles("stream")
        self.events = Handles("event")
        self.layouts: dict[int, list] = {}
        self.graphs = Graphs(device)  # captures, graphs, what a graph may still reach
        self.vmm = VirtualMemory(device, self._charge, self._uncharge, DEVICE_MEMORY)
        self.pools = Pools(device, self._charge, self._uncharge, DEVICE_MEMORY, self._stream,
                           accounted=quota is not None)
        self.launchable: dict[int, tuple] = {}  # function handle -> (function, params size)
        self.deferred: tuple[CudaError, int, int] | None = None
        self.staging = staging  # the executor's pool; None: one of its own, made on first use
        # Shared-memory regions: the executor's budget and VM region; none by default
        self.shared = shared or regions.Shared(0)
        self.regions: dict[int, regions.Attached] = {}
        self.region_ids = 0
        self.frame_fd: int | None = None  # the descriptor the SHM_ATTACH in work came with
        self.owns_staging = staging is None
        self.version = 0
        self.handlers: dict[int, Callable] = {
            code: getattr(self, "op_" + op.name.lower()) for code, op in P.OPS_BY_CODE.items()}
        self.counts = {"frames": 0, "launches": 0, "h2d_bytes": 0, "d2h_bytes": 0}
        self.by_op: dict[int, int] = {}  # op << 1 | one-way -> frames (see op_counts)
        self.errors: dict[int, int] = {}  # CUDA status -> the guest's calls that failed with it
        self.burst = self._launch_burst()

    def _launch_burst(self) -> LaunchBurst | None:
        """The C loop for runs of one-way frames, or None: every frame takes the Python
        path."""
        entries = self.device.driver_entries() if self.device is not None else None
        if not entries:
            return None
        if unavailable_reason():
            log.warning("%s: one-way frames go through the Python path (slower): %s",
                        self.peer, unavailable_reason())
            return None
        burst = LaunchBurst(entries)
        for special in (STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD):
            burst.set_stream(special, self.device.handle_value(self.device.stream(special)))
        # Still empty: from here the C loop hears of every range a copy may touch.
        self.allocs.mirror = self.pools.allocs.mirror = self.vmm.accessible.mirror = burst
        return burst

    # -- the loop ---------------------------------------------------------

    def serve(self) -> None:
        """Serve until the guest leaves or something fails; always ends closed."""
        try:
            if self.heartbeat is not None:
                self.heartbeat.add(self)
            if self.device is not None:
                self.device.bind_thread()
            self._serve()
        except PeerClosed:
            log.info("%s closed the connection", self.peer)
        except ConnectionLost as exc:
            log.warning("%s: %s", self.peer, exc)
        except OSError as exc:  # the guest's socket failed under us: it is gone
            log.warning("%s: the connection failed: %s", self.peer, exc)
        except Exception as exc:  # a bug or a broken host: this session ends, the executor goes on
            log.error("%s: unexpected %s; closing the connection", self.peer,
                      type(exc).__name__, exc_info=True)
            busy = self.busy
            self._last_word(busy[1] if busy else 0, busy[2] if busy else 0, P.HV_INTERNAL,
                            f"the executor failed unexpectedly ({type(exc).__name__}); "
                            "closing the connection")
        finally:
            self.close()

    def _serve(self) -> None:
        if not self._handshake():
            return
        reader = self.reader
        read_frame = reader.read_frame
        handlers = self.handlers
        monotonic = time.monotonic
        graphs = self.graphs
        while True:
            self.busy = None
            # While a capture is under way every frame takes the Python path, which keeps
            # copies the executor stages out of graphs.
            burst = self.burst
            if burst is not None and not reader.payload_left and not graphs.origins:
                self._run_burst(burst)
            try:
                hdr, body = read_frame()
            except ProtocolError as exc:
                self._fatal(0, 0, exc)
                return
            self.busy = (monotonic(), hdr.op, hdr.seq)
            self.counts["frames"] += 1
            oneway = hdr.flags & P.FLAG_ONEWAY
            key = hdr.op << 1 | (oneway != 0)
            self.by_op[key] = self.by_op.get(key, 0) + 1
            if hdr.version != self.version:
                self._fatal(hdr.op, hdr.seq, ProtocolError(
                    f"frame of protocol version {hdr.version} on a v{self.version} connection"))
                return
            handler = handlers.get(hdr.op)
            if handler is None:
                self.reader.skip_payload()
                self._failed(hdr, oneway, CudaError(
                    P.HV_UNKNOWN_OP, f"op 0x{hdr.op:02x} is not part of protocol v{self.version}"))
                continue
            if hdr.payload_len:
                refused = self._refuse_payload(hdr)
                if refused is not None:
                    self._failed(hdr, oneway, refused, body)  # before the bytes are skipped
                    self.reader.skip_payload()
                    continue
            if hdr.op in _SHM_SETUP:
                self.frame_fd = self.reader.take_fd() if hdr.op == _SHM_ATTACH else None
                try:
                    self._serve_one(hdr, body, oneway)
                finally:
                    if self.frame_fd is not None:  # the frame failed before taking it
                        os.close(self.frame_fd)
                        self.frame_fd = None
                continue
            if not oneway and self.deferred is not None and hdr.op != _END_CAPTURE:
                self.reader.skip_payload()
                if hdr.op in _WAITS:
                    self._wait_before_telling(hdr, body)
                err, op, seq = self.deferred
                self.deferred = None
                self._reply_error(hdr.op, hdr.seq, err.status, err.detail, failed_op=op,
                                  failed_seq=seq)
                continue
            self._serve_one(hdr, body, oneway)

    def _serve_one(self, hdr, body, oneway) -> None:
        try:
            if self.device is None and hdr.op != _PING:
                raise self.device_error
            if oneway and self.graphs.origins:  # each a node the driver keeps
                self.graphs.count_frame()
            if hdr.op == _LAUNCH:  # the hot path: no generic decode
                result = self.launch(body)
            else:
                result = self.handlers[hdr.op](hdr, *codec.REQUEST[hdr.op].decode(body))
        except (CudaError, ProtocolError) as exc:
            if self.reader.payload_left:
                self.reader.skip_payload()
            if isinstance(exc, ProtocolError):
                exc = CudaError(P.HV_BAD_FRAME, str(exc))
            self._failed(hdr, oneway, exc, body)
            return
        if self.reader.payload_left:
            self.reader.skip_payload()
        if not oneway and result is not _ALREADY_REPLIED:
            self._send(_reply_frame(hdr.op, hdr.seq, codec.REPLY[hdr.op].encode(result or ())))

    def _wait_before_telling(self, hdr, body) -> None:
        """Carries out a synchronisation whose reply will be an earlier error: its own
        failure (a bad handle, the sticky error itself) changes nothing of that reply."""
        try:
            if self.device is not None:
                self.handlers[hdr.op](hdr, *codec.REQUEST[hdr.op].decode(body))
        except (CudaError, ProtocolError) as exc:
            log.debug("%s: %s before a deferred error: %s", self.peer, P.op_name(hdr.op), exc)

    def _refuse_payload(self, hdr) -> CudaError | None:
        """Why this frame's payload is not accepted, or None."""
        if hdr.op not in _TAKES_PAYLOAD:
            return CudaError(P.HV_BAD_FRAME, f"{P.op_name(hdr.op)} carries no payload, "
                                             f"this frame announced {hdr.payload_len} bytes")
        limit = _PAYLOAD_LIMITS.get(hdr.op)
        if limit is not None and hdr.payload_len > limit[0]:
            return CudaError(P.CUDA_ERROR_INVALID_VALUE,
                             f"a {limit[1]} of {hdr.payload_len} bytes exceeds the agent's "
                             f"limit of {limit[0] >> 20} MiB")
        return None

    def _run_burst(self, burst: LaunchBurst) -> None:
        """Serve buffered one-way frames in C until it stops at a frame the Python path
        must judge, which is read next.

        A frame the C loop serves that has arrived in part is waited for here, as
        read_frame would wait for it, so that frames cut by the socket's reads do not
        fall to the Python path.
        """
        reader = self.reader
        monotonic = time.monotonic
        while True:
            if reader.end - reader.start < _HEADER_SIZE:
                self.busy = None  # waiting for the guest, not working for it
                reader.fill(_HEADER_SIZE)
            self.busy = (monotonic(), *_OP_SEQ.unpack_from(reader.buf, reader.start))
            done = burst.run(reader.buf, reader.start, reader.end, self.version,
                             reader.max_body)
            reader.start += done.consumed
            if done.consumed:
                self.counts["frames"] += done.frames
                self.counts["launches"] += done.launched
                self.counts["h2d_bytes"] += done.h2d_bytes
                for op, n in done.counts.items():  # one-way frames, by op
                    key = op << 1 | 1
                    self.by_op[key] = self.by_op.get(key, 0) + n
            if done.status:
                self._burst_failed(done.status, done.op, done.seq)
            elif done.want_ring:
                burst.set_ring(self._staging().copy_ring())  # None: Python copies them
            elif done.need and done.need <= len(reader.buf):
                self.busy = None
                reader.fill(done.need)
            elif reader.end - reader.start >= _HEADER_SIZE:
                self.busy = None
                return

    def _spoil_capture(self, op: int, body) -> None:
        """A one-way frame failed while a capture is under way: the capture its stream is
        in is invalidated, so that it never ends as a graph the guest believes holds that
        frame's work (the guest hears of the failure only at a later call)."""
        at = _STREAM_FIELD.get(op)
        fixed = codec.REQUEST[op].fixed if at is not None else None
        if fixed is None or len(body) < fixed.size:
            return  # not work on a stream; or malformed, which no capture holds either
        try:
            stream = self._stream(fixed.unpack_from(body)[at])
        except CudaError:
            return  # no stream of this guest: not in any capture
        self.graphs.invalidate(stream)

    def _burst_failed(self, status: int, op: int, seq: int) -> None:
        self.errors[status] = self.errors.get(status, 0) + 1
        if status in P.STICKY_STATUSES:
            self.on_poisoned(status)
        err = CudaError(status, _DRIVER_CALL.get(op, P.op_name(op)))
        log.debug("%s: %s seq %d failed: %s", self.peer, P.op_name(op), seq, err)
        if self.deferred is None:
            self.deferred = (err, op, seq)


    def _handshake(self) -> bool:
        try:
            hdr, body = self.reader.read_frame()
        except ProtocolError as exc:
            self._fatal(0, 0, exc)
            return False
        if hdr.op != _HELLO:
            self._reply_error(hdr.op, hdr.seq, P.HV_HANDSHAKE,
                              f"the first frame must be HELLO, not {P.op_name(hdr.op)}")
            return False
        if hdr.payload_len:
            log.warning("%s: HELLO with a %d-byte payload; closing the connection", self.peer,
                        hdr.payload_len)
            self._reply_error(hdr.op, hdr.seq, P.HV_BAD_FRAME,
                              f"HELLO carries no payload, this one announced {hdr.payload_len} "
                              "bytes; closing the connection")
            return False
        try:
            version, min_version, caps, client = codec.REQUEST[_HELLO].decode(body)
        except ProtocolError as exc:
            self._reply_error(hdr.op, hdr.seq, P.HV_BAD_FRAME, str(exc))
            return False
        chosen = min(version, P.VERSION)
        if chosen < max(min_version, P.MIN_VERSION):
            self._reply_error(hdr.op, hdr.seq, P.HV_VERSION,
                              f"the agent speaks protocol v{P.MIN_VERSION}..v{P.VERSION}, "
                              f"the guest v{min_version}..v{version}")
            log.warning("%s: refused protocol v%d..v%d", self.peer, min_version, version)
            return False
        self.version = chosen
        mycaps = (self.device.caps if self.device is not None else 0) | P.CAP_PROGRESS \
            | P.CAP_MONITOR
        if self.device is not None:
            mycaps |= self.shared.caps
            if self.reader.fds is None:  # descriptors travel on unix sockets only
                mycaps &= ~P.CAP_SHM_MEMFD
        log.info("%s: connected, protocol v%d, client %s", self.peer, chosen, clip(client))
        reply = (chosen, 0, caps & mycaps, P.MAX_PAYLOAD, P.MAX_BODY, self.peer,
                 f"hvgpu {__version__}")
        self._send(_reply_frame(hdr.op, hdr.seq, codec.REPLY[_HELLO].encode(reply)))
        self.progress = bool(caps & P.CAP_PROGRESS)
        self.monitor = bool(caps & P.CAP_MONITOR)
        self.client_pid, self.client_name = P.parse_client(client)
        return True

    def _failed(self, hdr, oneway: bool, err: CudaError, body=None) -> None:
        self.errors[err.status] = self.errors.get(err.status, 0) + 1
        if err.status in P.STICKY_STATUSES:
            self.on_poisoned(err.status)
        log.debug("%s: %s seq %d failed: %s", self.peer, P.op_name(hdr.op), hdr.seq, err)
        if oneway:
            if self.graphs.origins and body is not None:
                self._spoil_capture(hdr.op, body)
            if self.deferred is None:
                self.deferred = (err, hdr.op, hdr.seq)
        else:
            self._reply_error(hdr.op, hdr.seq, err.status, err.detail)

    def _reply_error(self, op: int, seq: int, status: int, message: str, *,
                     failed_op: int | None = None, failed_seq: int | None = None) -> None:
        body = codec.encode_error(op if failed_op is None else failed_op,
                                  seq if failed_seq is None else failed_seq, message)
        self._send(_reply_frame(op, seq, body, status))

    def _fatal(self, op: int, seq: int, exc: ProtocolError) -> None:
        status = P.HV_OVERSIZE if exc.code == "oversize" else P.HV_BAD_FRAME
        self.errors[status] = self.errors.get(status, 0) + 1
        log.warning("%s: closing the connection: %s", self.peer, exc)
        try:
            self._reply_error(op, seq, status, f"{exc}; closing the connection")
        except (ConnectionLost, OSError):
            pass

    # -- sending: one frame at a time on the guest's socket ------------------------

    def _send(self, data) -> None:
        with self.send_lock:
            try:
                self._sendall_locked(data)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ConnectionLost(f"guest went away while sending: {exc}") from None

    def _sendall_locked(self, data) -> None:
        if self.tail:  # the rest of a progress frame the heartbeat could not finish
            self.sock.sendall(self.tail)
            self.tail = b""
        self.sock.sendall(data)

    def _last_word(self, op: int, seq: int, status: int, message: str) -> None:
        """An error reply before closing, where the frame allows one; never waits."""
        with self.send_lock:
            if self.streaming or self.closed:
                return  # inside a reply's payload: the guest sees the connection end instead
            try:
                self.sock.send(_reply_frame(op, seq, codec.encode_error(op, seq, message), status),
                               socket.MSG_DONTWAIT)
            except OSError:
                pass

    def send_progress(self, now: float, after: float, every: float) -> None:
        """Called by the heartbeat: a progress frame if the guest waits on long work."""
        busy = self.busy
        if busy is None or not self.progress or now - busy[0] < after \
                or now - self.last_progress < every:
            return
        if not self.send_lock.acquire(blocking=False):
            return  # a reply is going out: that says enough
        try:
            if self.busy is not busy or self.streaming or self.closed:
                return
            frame = self.tail or pack_header(busy[1], _PROGRESS_FLAGS, busy[2], 0, 0)
            try:
                sent = self.sock.send(frame, socket.MSG_DONTWAIT)
            except OSError:
                return  # its buffer is full, or it is gone: the session finds out itself
            self.tail = frame[sent:]  # rare: finished at the next chance, never left half-sent
            self.last_progress = now
        finally:
            self.send_lock.release()

    def close(self) -> None:
        """Free everything this guest held and close its socket, at once."""
        if self.closed:
            return
        self.closed = True
        if self.heartbeat is not None:
            self.heartbeat.remove(self)
        try:
            self._release()
        except Exception:  # releasing must not outlive the session: say so once, close anyway
            log.error("%s: releasing the session failed", self.peer, exc_info=True)
        finally:
            if self.reader.fds:
                self.reader.close_fds()
            with self.send_lock:
                try:
                    self.sock.close()
                except OSError:
                    pass
            self.handlers = {}  # its bound methods would keep this session for the cyclic GC

    def _release(self) -> None:
        if self.device is None:
            return
        c = self.counts
        log.info("%s: served %d frames (%d launches, %d bytes to the GPU, %d bytes back); "
                 "releasing %d allocations (%d bytes), %d pool allocations, %d mappings, "
                 "%d modules, %d streams, %d events",
                 self.peer, c["frames"], c["launches"], c["h2d_bytes"], c["d2h_bytes"],
                 len(self.allocs), self.allocs.total, len(self.pools.allocs),
                 len(self.vmm.mappings), len(self.modules.objects),
                 len(self.streams.objects), len(self.events.objects))
        if self.by_op:
            log.info("%s: frames by op: %s", self.peer, self.op_counts())
        # Captures end and graphs go first: what they held back is released with them.
        with DEVICE_MEMORY:
            self.graphs.release_all(self._stream)
        self.exec_charges.clear()  # with the rest of the charge, below
        if self.upload_stream is not None:
            _quietly(self.device.stream_destroy, self.upload_stream)
            self.upload_stream = None
        for attached in self.regions.values():
            _quietly(self._drop_region, attached)
        self.regions.clear()
        if self.staging is not None and self.owns_staging:
            self.staging.close()
        self.staging = None
        if self.vmm.mappings:
            # Unmapping does not wait for the GPU (cuMemFree does): work still queued on
            # the guest's streams must not find its memory gone.
            for stream in (*self.streams.objects.values(), self.device.stream(STREAM_LEGACY),
                           self.device.stream(STREAM_PER_THREAD)):
                _quietly(self.device.stream_synchronize, stream)
        self.pools.release_all()  # pool memory first, on the streams it was allocated on
        self.vmm.release_all()
        for release, table in ((self.device.event_destroy, self.events.objects),
                               (self.device.stream_destroy, self.streams.objects)):
            for obj in list(table.values()):
                _quietly(release, obj)
            table.clear()
        # Device memory goes back under the lock a module load measures under (another
        # session's load would otherwise be charged less than it took).
        with DEVICE_MEMORY:
            for module in self.modules.objects.values():
                _quietly(self.device.module_unload, module)
            self.modules.objects.clear()
            for ptr in list(self.allocs.starts):
                _quietly(self.device.mem_free, ptr)
        self._uncharge(self.charged)
        self.alloc_charges.clear()
        self.module_charges.clear()
        self.allocs = Allocations()
        if self.burst is not None:
            self.burst.close()
            self.burst = None
        if self.owns_device:
            _quietly(self.device.close)
        self.device = None

    def stats(self) -> dict:
        """What this guest did so far, for the executor's STATS to the agent; read from
        another thread while the session runs (copies of its counters, never a lock the
        session takes)."""
        c = self.counts
        by_op, errors = dict(self.by_op), dict(self.errors)  # each copy is one step
        return {"launches": c["launches"], "to_gpu": c["h2d_bytes"],
                "from_gpu": c["d2h_bytes"],
                "round_trips": sum(n for key, n in by_op.items() if not key & 1),
                "errors": errors}

    def op_counts(self) -> str:
        """The frames this guest sent, per op, busiest first: "LAUNCH_KERNEL 900 one-way,
        FUNC_SET_ATTRIBUTE 2 sync + 30 one-way, ..." (sync: each was a round trip)."""
        per_op: dict[int, list[int]] = {}
        for key, n in self.by_op.items():
            per_op.setdefault(key >> 1, [0, 0])[key & 1] += n
        ranked = sorted(per_op.items(), key=lambda item: (-sum(item[1]), P.op_name(item[0])))
        parts = [P.op_name(op) + " " + " + ".join(
                     f"{n} {kind}" for n, kind in zip(counts, ("sync", "one-way")) if n)
                 for op, counts in ranked[:_OPS_LOGGED]]
        rest = ranked[_OPS_LOGGED:]
        if rest:
            parts.append(f"{sum(sum(c) for _, c in rest)} more in {len(rest)} other ops")
        return ", ".join(parts)

    # -- helpers -------------------------------------------------------------

    def _stream(self, handle: int) -> Any:
        if handle in (STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD):
            return self.device.stream(handle)
        return self.streams.get(handle)

    def _check_range(self, ptr: int, n: int, what: str) -> None:
        """Inside an allocation of this guest (cuMemAlloc, pool or readable-writable
        mapped memory), or a module variable it looked up."""
        if self.graphs.origins:  # a capture under way may take this work in
            self._graph_reaches(ptr)
        if self.allocs.holds(ptr, n) or self.pools.allocs.holds(ptr, n) \
                or self.vmm.covers(ptr, n):
            return
        for ranges in self.globals.values():
            if ranges.holds(ptr, n):
                return
        why = self.vmm.why_not(ptr)
        if why is not None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{what}: {why}")
        # Refused (check raises): said from the view of the allocation ptr falls in, if any.
        (self.pools.allocs if self.pools.allocs.holds(ptr, 1) else self.allocs).check(
            ptr, n, what)

    def _staging(self) -> StagingPool:
        if self.staging is None:
            self.staging = StagingPool(self.device)
        return self.staging

    # -- ops (names follow protocol.OPS; each returns the reply's values) ----

    def op_hello(self, hdr, *values):
        raise CudaError(P.HV_HANDSHAKE, "HELLO was already done on this connection")

    def op_ping(self, hdr):
        return ()

    def op_driver_get_version(self, hdr):
        return (self.device.driver_version(),)

    def op_device_get_count(self, hdr):
        return (self.vgpus(),)

    def _check_device(self, ordinal: int) -> None:
        if ordinal != 0:
            raise CudaError(P.CUDA_ERROR_INVALID_DEVICE,
                            f"device {ordinal}: a connection serves one vGPU, its device 0 "
                            "(each of a VM's vGPUs has its own connection)")

    def op_device_get_attribute(self, hdr, attrib, ordinal):
        self._check_device(ordinal)
        return (self.device.attribute(attrib),)

    def op_device_get_name(self, hdr, ordinal):
        self._check_device(ordinal)
        return (self.device.name(),)

    def op_device_get_uuid(self, hdr, ordinal):
        self._check_device(ordinal)
        return (self.device.uuid(),)

    def op_device_total_mem(self, hdr, ordinal):
        self._check_device(ordinal)
        if self.quota is not None:
            return (self.quota.usage()[1],)  # the guest's device is its slice
        return (self.device.total_mem(),)

    def op_device_get_attributes(self, hdr, ordinal, count):
        self._check_device(ordinal)
        if not 0 < count <= 1024:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{count} attributes asked for")
        values = []
        for attrib in range(1, count + 1):
            try:
                values.append(self.device.attribute(attrib))
            except CudaError:
                values.append(0)  # unknown to this driver: as a device without the feature
        return (b"".join(int(v).to_bytes(4, "little", signed=True) for v in values),)

    def op_slice_info(self, hdr):
        if self.quota is None:
            return ("", self.device.total_mem(), 0, 0)
        used, limit = self.quota.usage()
        return (self.slice_name, limit, used, self.compute)

    def op_vgpu_processes(self, hdr):
        rows: dict[int, list] = {}  # pid -> [name, bytes]: one row per process
        for session in self.neighbours():
            if session.monitor or session.closed or session.version == 0:
                continue
            row = rows.setdefault(session.client_pid, [session.client_name, 0])
            row[1] += max(0, session.charged)
        listed = sorted(rows.items())[:P.MAX_PROCESSES]
        return (len(listed), b"".join(pid.to_bytes(4, "little") for pid, _ in listed),
                b"".join(used.to_bytes(8, "little") for _, (_, used) in listed),
                "\0".join(name for _, (name, _) in listed))

    def op_vgpu_utilization(self, hdr):
        ask = getattr(self.quota, "utilization", None)  # None: the whole GPU, no slice
        util = ask() if ask is not None else None
        return (0, 0) if util is None else (1, util)

    def op_ctx_synchronize(self, hdr):
        self.device.synchronize()
        self.pools.settle()

    def op_ctx_get_limit(self, hdr, limit):
        return (self.device.ctx_limit(limit),)

    def op_mem_get_info(self, hdr):
        self.pools.settle()
        free, total = self.device.mem_info()
        if self.quota is not None:
            used, limit = self.quota.usage()
            return (max(0, min(limit - used, free)), limit)
        return (free, total)

    def _charge(self, n: int) -> None:
        """Charge ``n`` bytes to the slice; CUDA_ERROR_OUT_OF_MEMORY past its quota."""
        if self.quota is not None and n:
            try:
                self.quota.reserve(n)
            except CudaError as exc:
                # Pools may have given memory back since they were last settled.
                if exc.status != P.CUDA_ERROR_OUT_OF_MEMORY or not self.pools.settle():
                    raise
                self.quota.reserve(n)
            self.charged += n

    def _uncharge(self, n: int) -> None:
        if self.quota is not None and n:
            self.charged -= n
            _quietly(self.quota.release, n)

    def op_mem_alloc(self, hdr, size):
        if size == 0:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes")
        # Charged as the driver takes it (its granularity), not as asked, so that
        # many small allocations cannot hold more than the quota.
        charge = self.device.footprint(size)
        self._charge(charge)
        try:
            with DEVICE_MEMORY:
                ptr = self.device.mem_alloc(size)
        except CudaError:
            self._uncharge(charge)
            raise
        self.allocs.add(ptr, size)
        self.alloc_charges[ptr] = charge
        return (ptr,)

    def op_mem_free(self, hdr, dptr):
        self.allocs.remove(dptr)
        if dptr in self.graphs.allocations and self.graphs.park(
                f"allocation 0x{dptr:x}", lambda: self._free(dptr)):
            return  # a graph may still write it: freed, and uncharged, when the last goes
        self._free(dptr)

    def _free(self, dptr: int) -> None:
        with DEVICE_MEMORY:
            self.device.mem_free(dptr)
        self._uncharge(self.alloc_charges.pop(dptr, 0))

    def _graph_reaches(self, ptr: int) -> None:
        base = self.allocs.base_of(ptr)
        if base is not None:
            self.graphs.allocations.add(base)

    def _graph_reads_params(self, params) -> None:
        """A kernel a graph runs: every aligned 8 bytes of its parameters that falls in
        an allocation may be a pointer it writes through."""
        words = memoryview(params)[:len(params) // 8 * 8].cast("B").cast("Q")
        for value in words:
            self._graph_reaches(value)

    def _load_module(self, image) -> int:
        """Load and charge what the load took of device memory (module variables:
        a `__device__` array takes its size at load, with no cuMemAlloc)."""
        if self.quota is None:
            return self.modules.add(self.device.module_load(image))
        with DEVICE_MEMORY.measuring():
            free_before = self.device.mem_info()[0]
            module = self.device.module_load(image)
            taken = max(0, free_before - self.device.mem_info()[0])
        try:
            self._charge(taken)
        except CudaError as exc:
            with DEVICE_MEMORY:  # as every release: another session's load may be measuring
                _quietly(self.device.module_unload, module)
            raise CudaError(exc.status, f"the module's variables take {taken} bytes of device "
                            f"memory: {exc.detail}") from None
        handle = self.modules.add(module)
        self.module_charges[handle] = taken
        return handle

    def op_memcpy_htod(self, hdr, dst, stream):
        n = hdr.payload_len
        self._check_range(dst, n, "destination")
        s = self._stream(stream)
        self.graphs.refuse_if_capturing(s, "a copy from pageable host memory")
        self._staging().upload(self.reader.read_payload_into, dst, n, s)
        self.counts["h2d_bytes"] += n

    def op_memcpy_dtoh(self, hdr, src, size, stream):
        self._check_range(src, size, "source")
        s = self._stream(stream)
        self.graphs.refuse_if_capturing(s, "a copy to pageable host memory")
        lock = self.send_lock
        started = False

        def start():
            nonlocal started
            with lock:
                self.streaming = started = True  # until the last byte: no progress frame cuts in
            send(pack_header(hdr.op, P.FLAG_REPLY, hdr.seq, 0, 0, size))

        def send(view):
            try:
                with lock:
                    self._sendall_locked(view)
            except OSError as exc:
                raise ConnectionLost(f"guest went away during a copy: {exc}") from None

        try:
            self._staging().download(src, size, s, start, send)
        except CudaError as exc:
            if started:  # the guest is owed bytes we cannot produce
                raise ConnectionLost(f"copy failed after its reply began ({exc}); "
                                     "closing the connection") from None
            raise
        self.counts["d2h_bytes"] += size
        self.streaming = False
        return _ALREADY_REPLIED

    def op_memcpy_dtod(self, hdr, dst, src, size, stream):
        self._check_range(dst, size, "destination")
        self._check_range(src, size, "source")
        self.device.memcpy_dtod_async(dst, src, size, self._stream(stream))

    def op_memset(self, hdr, dst, count, value, width, stream):
        if width not in (1, 2, 4):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"memset width {width} is not 1, 2 or 4")
        self._check_range(dst, count * width, "destination")
        self.device.memset_async(dst, value, width, count, self._stream(stream))

    def op_module_load_data(self, hdr):
        with self.uploads.holding(hdr.payload_len, "module image"):
            image = self.reader.read_payload()
            if not image:
                raise CudaError(P.CUDA_ERROR_INVALID_IMAGE, "empty module image")
            return (self._load_module(image),)

    def op_module_compile(self, hdr, name, options):
        return self._compile(hdr, name, options, [], [hdr.payload_len])

    def op_module_compile_headers(self, hdr, name, options, header_names, sizes):
        names = [h for h in header_names.split("\0") if h]
        if len(sizes) % 8 or len(sizes) // 8 != len(names) + 1:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"{len(names)} header names need {8 * (len(names) + 1)} bytes of "
                            f"sizes, not {len(sizes)}")
        counts = [int.from_bytes(sizes[i:i + 8], "little") for i in range(0, len(sizes), 8)]
        if sum(counts) != hdr.payload_len:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"sizes add up to {sum(counts)} bytes, the payload is "
                            f"{hdr.payload_len}")
        return self._compile(hdr, name, options, names, counts)

    def _compile(self, hdr, name, options, names: list[str], counts: list[int]):
        """NVRTC through nvrtc_policy's checks, then the per-VM cache or a confined child."""
        name = nvrtc_policy.check_program_name(name)
        nvrtc_policy.check_header_names(names)
        opts = nvrtc_policy.check_options([o for o in options.split("\0") if o], names)
        with self.uploads.holding(hdr.payload_len, "source with its headers"):
            return self._compile_held(name, names, counts, opts)

    def _compile_held(self, name, names, counts, opts):
        data = self.reader.read_payload()
        parts, at = [], 0
        for n in counts:
            parts.append(data[at:at + n])
            at += n
        source, headers = parts[0], dict(zip(names, parts[1:]))
        nvrtc_policy.check_includes(source, headers, name)
        key = CompileCache.key(self.device.compiler_id(), name, opts, source, headers)
        image, build_log, hit = self.cache.get_or_build(
            key, lambda: self._build(source, name, opts, headers))
        log.info("%s: compiled %s (%s)", self.peer, name, "cache hit" if hit else "NVRTC")
        return (self._load_module(image), build_log[:P.MAX_MESSAGE])

    def _build(self, source, name, opts, headers):
        """A compilation in one of the VM's compiler slots (waiting for one if need be)."""
        with self.compile_slots.slot(COMPILE_WAIT):
            return self.device.compile(source, name, opts, headers)

    def op_module_unload(self, hdr, module):
        obj = self.modules.get(module)
        charge = self.module_charges.get(module, 0)

        def unload():
            with DEVICE_MEMORY:
                self.device.module_unload(obj)
            self._uncharge(charge)

        if not self.graphs.park(f"module {module}", unload):  # its code may be in a graph
            unload()
        self.modules.pop(module)
        self.module_charges.pop(module, None)
        ranges = self.globals.pop(module, None)
        if ranges is not None:
            ranges.clear()  # and so out of the C loop's table
        for fid in [f for f, (m, _) in self.functions.objects.items() if m == module]:
            self.functions.pop(fid)
            self.layouts.pop(fid, None)
            self.launchable.pop(fid, None)
            if self.burst is not None:
                self.burst.drop_function(fid)

    def op_module_get_function(self, hdr, module, name):
        fn = self.device.module_function(self.modules.get(module), name)
        return (self.functions.add((module, fn)),)

    def op_module_get_global(self, hdr, module, name):
        dptr, size = self.device.module_global(self.modules.get(module), name)
        ranges = self.globals.setdefault(module, Allocations(self.burst))
        if dptr not in ranges.sizes and size:
            ranges.add(dptr, size)
        return (dptr, size)

    def op_func_get_attribute(self, hdr, function, attrib):
        return (self.device.func_attribute(self.functions.get(function)[1], attrib),)

    def op_func_get_attributes(self, hdr, function, count):
        if not 0 < count <= _MAX_FUNC_ATTRIBUTES:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"{count} function attributes asked for (1..{_MAX_FUNC_ATTRIBUTES})")
        fn = self.functions.get(function)[1]
        known, values = 0, []
        for attrib in range(count):
            try:
                values.append(self.device.func_attribute(fn, attrib))
                known |= 1 << attrib
            except CudaError as exc:
                if exc.status != P.CUDA_ERROR_INVALID_VALUE:
                    raise
                values.append(0)  # an attribute this driver does not have
        return (known, struct.pack(f"<{count}i", *values))

    def op_func_set_attribute(self, hdr, function, attrib, value):
        self.device.func_set_attribute(self.functions.get(function)[1], attrib, value)

    def op_func_set_cache_config(self, hdr, function, config):
        self.device.func_set_cache_config(self.functions.get(function)[1], config)

    def op_occupancy_max_blocks(self, hdr, function, block_size, shared_mem, flags):
        fn = self.functions.get(function)[1]
        return (self.device.occupancy_max_blocks(fn, block_size, shared_mem, flags),)

    def op_occupancy_available_smem(self, hdr, function, blocks, block_size):
        fn = self.functions.get(function)[1]
        return (self.device.occupancy_available_smem(fn, blocks, block_size),)

    def op_launch_kernel_ex(self, hdr, function, gx, gy, gz, bx, by, bz, shared, stream, params,
                            attrs):
        fn = self._launch_params(function, params)
        if len(attrs) % _LAUNCH_ATTR_SIZE:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"{len(attrs)} bytes of launch attributes is not a whole number")
        for i in range(0, len(attrs), _LAUNCH_ATTR_SIZE):
            if int.from_bytes(attrs[i:i + 4], "little") in _EVENT_ATTRS:
                raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, "launch attributes naming events")
        if self.graphs.origins:
            self._graph_reads_params(params)
        self.device.launch_ex(fn, (gx, gy, gz), (bx, by, bz), shared, self._stream(stream),
                              params, attrs)
        self.counts["launches"] += 1

    def op_occupancy_clusters(self, hdr, which, function, gx, gy, gz, bx, by, bz, shared, attrs):
        if which not in (0, 1) or len(attrs) % _LAUNCH_ATTR_SIZE:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "bad cluster occupancy query")
        fn = self.functions.get(function)[1]
        return (self.device.occupancy_clusters(which, fn, (gx, gy, gz), (bx, by, bz), shared,
                                               attrs),)

    def op_tensor_map_encode_tiled(self, hdr, dtype, rank, address, dims, strides, box,
                                   element_strides, interleave, swizzle, l2, oob):
        if not 1 <= rank <= 5 or len(dims) != 8 * rank or len(strides) != 8 * (rank - 1) \
                or len(box) != 4 * rank or len(element_strides) != 4 * rank:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"tensor map arrays do not match rank {rank}")
        return (self.device.tensor_map_encode_tiled(
            dtype, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2,
            oob),)

    def _launchable(self, function: int) -> tuple:
        entry = self.launchable.get(function)
        if entry is None:
            layout = self._layout(function)
            entry = self.launchable[function] = (
                self.functions.get(function)[1], (layout[-1][0] + layout[-1][1]) if layout else 0)
            if self.burst is not None:
                self.burst.set_function(function, self.device.handle_value(entry[0]), entry[1])
        return entry

    def _launch_params(self, function: int, params) -> Any:
        """The function to launch, once the parameter buffer has the kernel's size."""
        entry = self.launchable.get(function)
        fn, need = entry if entry is not None else self._launchable(function)
        if len(params) != need:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"parameter buffer is {len(params)} bytes, the kernel takes {need}")
        return fn

    def _layout(self, function: int) -> list:
        layout = self.layouts.get(function)
        if layout is None:
            layout = self.device.param_layout(self.functions.get(function)[1])
            self.layouts[function] = layout
        return layout

    def op_func_get_param_info(self, hdr, function):
        layout = self._layout(function)
        self._launchable(function)  # the guest asks before its first launch: C takes that one
        return (b"".join(o.to_bytes(4, "little") + s.to_bytes(4, "little") for o, s in layout),)

    def launch(self, body) -> None:
        """LAUNCH_KERNEL, decoded in place; the parameters go to the driver as a view."""
        size = _LAUNCH_FIXED.size
        if len(body) < size:
            raise ProtocolError(f"body of {len(body)} bytes is shorter than the {size} "
                                "its fields need", code="bad-frame")
        function, gx, gy, gz, bx, by, bz, shared, stream, n = _LAUNCH_FIXED.unpack_from(body)
        if len(body) != size + n:
            raise ProtocolError(f"parameter length {n} does not match the body", code="bad-frame")
        params = body[size:]
        if self.graphs.origins:
            self._graph_reads_params(params)
        self.device.launch(self._launch_params(function, params), (gx, gy, gz), (bx, by, bz),
                           shared, self._stream(stream), params)
        self.counts["launches"] += 1

    def op_launch_kernel(self, hdr, *values):
        raise AssertionError("LAUNCH_KERNEL is served by Session.launch")

    def op_stream_create(self, hdr, flags):
        return (self._add_stream(self.device.stream_create(flags)),)

    def op_stream_create_priority(self, hdr, flags, priority):
        return (self._add_stream(self.device.stream_create(flags, priority)),)

    def _add_stream(self, stream) -> int:
        handle = self.streams.add(stream)
        if self.burst is not None:
            self.burst.set_stream(handle, self.device.handle_value(stream))
        return handle

    def op_stream_priority_range(self, hdr):
        return self.device.stream_priority_range()

    def op_stream_destroy(self, hdr, stream):
        obj = self.streams.get(stream)
        if stream in self.graphs.origins:  # as the driver does: its capture ends, failed
            try:
                with DEVICE_MEMORY:
                    self.graphs.destroy(self.graphs.end(stream, obj))
            except CudaError:
                pass
        self.device.stream_destroy(obj)
        self.streams.pop(stream)
        if self.burst is not None:
            self.burst.drop_stream(stream)

    def op_stream_synchronize(self, hdr, stream):
        self.device.stream_synchronize(self._stream(stream))
        self.pools.settle()

    def op_stream_query(self, hdr, stream):
        if not self.device.stream_query(self._stream(stream)):
            raise CudaError(P.CUDA_ERROR_NOT_READY)

    def op_stream_wait_event(self, hdr, stream, event, flags):
        self.graphs.event_used(event)
        self.device.stream_wait_event(self._stream(stream), self.events.get(event), flags)

    def op_event_create(self, hdr, flags):
        event = self.device.event_create(flags)
        handle = self.events.add(event)
        if self.burst is not None:
            self.burst.set_event(handle, self.device.handle_value(event))
        return (handle,)

    def op_event_destroy(self, hdr, event):
        obj = self.events.get(event)
        if event not in self.graphs.events or \
                not self.graphs.park(f"event {event}", lambda: self.device.event_destroy(obj)):
            self.device.event_destroy(obj)
        self.graphs.events.discard(event)
        self.events.pop(event)
        if self.burst is not None:
            self.burst.drop_event(event)

    def op_event_record(self, hdr, event, stream):
        self.graphs.event_used(event)
        self.device.event_record(self.events.get(event), self._stream(stream))

    def op_event_query(self, hdr, event):
        if not self.device.event_query(self.events.get(event)):
            raise CudaError(P.CUDA_ERROR_NOT_READY)

    def op_event_synchronize(self, hdr, event):
        self.device.event_synchronize(self.events.get(event))
        self.pools.settle()

    # -- stream capture and graphs (graphs.Graphs keeps the books) ----------------------

    def op_stream_begin_capture(self, hdr, stream, mode):
        return self.graphs.begin(stream, self._stream(stream), mode)

    def op_stream_end_capture(self, hdr, stream):
        return (self.graphs.end(stream, self._stream(stream)),)

    def op_stream_capture_info(self, hdr, stream, nodes):
        if nodes not in (0, 1):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"STREAM_CAPTURE_INFO nodes {nodes}")
        return self.graphs.info(self._stream(stream), nodes=bool(nodes))

    def op_graph_instantiate(self, hdr, graph, flags):
        """Instantiated and uploaded at once, and charged what that took of device memory
        (an instantiation's own memory, which no cuMemAlloc shows), as module loads are."""
        if self.quota is None:
            return (self.graphs.instantiate(graph, flags),)
        failed = None
        with DEVICE_MEMORY.measuring():
            free_before = self.device.mem_info()[0]
            handle = self.graphs.instantiate(graph, flags)
            try:
                stream = self._upload_stream()
                self.device.graph_upload(self.graphs.execs.get(handle), stream)
                self.device.stream_synchronize(stream)
            except CudaError as exc:
                failed = exc
            taken = max(0, free_before - self.device.mem_info()[0])
        if failed is None:
            try:
                self._charge(taken)
            except CudaError as exc:
                failed = CudaError(exc.status, f"the instantiated graph takes {taken} bytes of "
                                   f"device memory: {exc.detail}")
        if failed is not None:
            with DEVICE_MEMORY:
                _quietly(self.graphs.destroy_exec, handle)
            raise failed
        self.exec_charges[handle] = taken
        return (handle,)

    def _upload_stream(self):
        """A stream of the executor's own for uploads: no capture or wait of the guest's
        is on it."""
        if self.upload_stream is None:
            self.upload_stream = self.device.stream_create(1)  # CU_STREAM_NON_BLOCKING
        return self.upload_stream

    def op_graph_get_nodes(self, hdr, graph, most):
        return self.graphs.list_nodes(graph, most)

    def op_graph_create(self, hdr, flags):
        return (self.graphs.create(flags),)

    def _kernel_node(self, function, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                     shared_mem, params) -> tuple:
        fn = self._launch_params(function, params)  # the guest's, with the kernel's size
        self._graph_reads_params(params)
        return (fn, (grid_x, grid_y, grid_z), (block_x, block_y, block_z), shared_mem,
                bytes(params))

    def op_graph_add_kernel_node(self, hdr, graph, function, gx, gy, gz, bx, by, bz, smem,
                                 deps, params):
        kernel = self._kernel_node(function, gx, gy, gz, bx, by, bz, smem, params)
        return (self.graphs.add_node(graph, deps, lambda g, d: self.device.graph_add_kernel(
            g, d, *kernel)),)

    def op_graph_add_memset_node(self, hdr, graph, dst, pitch, value, width_bytes, width,
                                 height, deps):
        if width_bytes not in (1, 2, 4) or not width or not height:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"memset node of {height} rows of "
                            f"{width} elements of {width_bytes} bytes")
        row = width * width_bytes
        if height > 1 and pitch < row:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"pitch {pitch} under a row of {row}")
        self._check_range(dst, (height - 1) * pitch + row, "destination")
        self._graph_reaches(dst)
        return (self.graphs.add_node(graph, deps, lambda g, d: self.device.graph_add_memset(
            g, d, dst, pitch, value, width_bytes, width, height)),)

    def op_graph_add_memcpy_node(self, hdr, graph, kind, region, dst, src, size, deps):
        if kind == 0:
            self._check_range(dst, size, "destination")
            self._check_range(src, size, "source")
        elif kind == 1:
            room = src
            src = self._region(region).address(src, size, "source")
            self._check_range(dst, size, "destination")
        elif kind == 2:
            room = dst
            dst = self._region(region).address(dst, size, "destination")
            self._check_range(src, size, "source")
        else:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"memcpy node kind {kind}")
        if not size:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "a memcpy node of 0 bytes")
        for ptr in ((dst, src) if kind == 0 else (dst,) if kind == 1 else (src,)):
            self._graph_reaches(ptr)
        if kind:
            self.graphs.regions.add(region)
            self._graph_reaches_room(region, room)
        return (self.graphs.add_node(graph, deps, lambda g, d: self.device.graph_add_memcpy(
            g, d, kind, dst, src, size)),)

    def op_graph_add_empty_node(self, hdr, graph, deps):
        return (self.graphs.add_node(graph, deps, self.device.graph_add_empty),)

    def op_graph_add_event_node(self, hdr, graph, wait, reserved, event, deps):
        obj = self.events.get(event)
        if wait not in (0, 1):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"event node kind {wait}")
        self.graphs.events.add(event)
        return (self.graphs.add_node(graph, deps, lambda g, d: self.device.graph_add_event(
            g, d, wait, obj)),)

    def op_graph_add_dependencies(self, hdr, graph, sources, targets):
        self.graphs.add_dependencies(graph, sources, targets)

    def op_graph_exec_kernel_node_set_params(self, hdr, exec_, node, function, gx, gy, gz,
                                             bx, by, bz, smem, params):
        kernel = self._kernel_node(function, gx, gy, gz, bx, by, bz, smem, params)
        ex, n = self.graphs.exec_node(exec_, node)
        self.device.graph_exec_kernel_set(ex, n, *kernel)

    def op_graph_exec_update(self, hdr, exec_, graph):
        return self.graphs.update(exec_, graph)

    def op_graph_launch(self, hdr, exec_, stream):
        s = self._stream(stream)
        if self.graphs.capturing(s):  # a graph in a graph: copies of it, without bound
            raise CudaError(P.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a graph launched on a "
                            "capturing stream (a child graph node) is not built by hvgpu")
        self.graphs.launch(exec_, s)

    def op_graph_upload(self, hdr, exec_, stream):
        self.graphs.upload(exec_, self._stream(stream))

    def op_graph_destroy(self, hdr, graph):
        with DEVICE_MEMORY:  # it may hold device memory, and what it parked
            self.graphs.destroy(graph)

    def op_graph_exec_destroy(self, hdr, exec_):
        with DEVICE_MEMORY:
            self.graphs.destroy_exec(exec_)
        self._uncharge(self.exec_charges.pop(exec_, 0))

    # -- virtual memory management (vmm.VirtualMemory keeps the books) --------------

    def op_mem_address_reserve(self, hdr, size, alignment, addr, flags):
        return (self.vmm.reserve(size, alignment, addr, flags),)

    def op_mem_address_free(self, hdr, dptr, size):
        self.vmm.free_addresses(dptr, size)

    def op_mem_create(self, hdr, size, type_, handle_types, loc_type, loc_id, alloc_flags):
        return (self.vmm.create(size, type_, handle_types, loc_type, loc_id, alloc_flags),)

    def op_mem_release(self, hdr, handle):
        self.vmm.release(handle)

    def op_mem_map(self, hdr, dptr, size, offset, handle, flags):
        self.vmm.map(dptr, size, offset, handle, flags)

    def op_mem_unmap(self, hdr, dptr, size):
        self.vmm.unmap(dptr, size)

    def op_mem_set_access(self, hdr, dptr, size, descs):
        self.vmm.set_access(dptr, size, descs)

    def op_mem_get_access(self, hdr, dptr):
        return (self.vmm.get_access(dptr),)

    def op_mem_get_granularity(self, hdr, option):
        return (self.vmm.granularity(option),)

    def op_mem_retain_handle(self, hdr, dptr):
        return (self.vmm.retain(dptr),)

    def op_mem_handle_info(self, hdr, handle):
        return (self.vmm.handle_size(handle),)

    # -- stream-ordered allocation (pools.Pools keeps the books) ----------------------

    def op_mem_pool_create(self, hdr, type_, handle_types, loc_type, loc_id, max_size, usage):
        return (self.pools.create(type_, handle_types, loc_type, loc_id, max_size, usage),)

    def op_mem_pool_destroy(self, hdr, pool):
        self.pools.destroy(pool)

    def op_mem_pool_default(self, hdr):
        return (self.pools.default(),)

    def op_mem_alloc_async(self, hdr, size, pool, stream):
        self.graphs.refuse_if_capturing(self._stream(stream), "cuMemAllocAsync (a graph "
                                        "memory node, which hvgpu does not build)")
        return (self.pools.alloc(size, pool, stream),)

    def op_mem_free_async(self, hdr, dptr, stream):
        self.graphs.refuse_if_capturing(self._stream(stream), "cuMemFreeAsync (a graph "
                                        "memory node, which hvgpu does not build)")
        self.pools.free(dptr, stream)

    def op_mem_pool_set_attribute(self, hdr, pool, attrib, value):
        self.pools.set_attribute(pool, attrib, value)

    def op_mem_pool_get_attribute(self, hdr, pool, attrib):
        return (self.pools.get_attribute(pool, attrib),)

    def op_mem_pool_trim_to(self, hdr, pool, keep):
        self.pools.trim(pool, keep)

    def op_event_elapsed_time(self, hdr, start, end):
        return (self.device.event_elapsed(self.events.get(start), self.events.get(end)),)


    # -- the shared-memory lane (executor/regions.py) ------------------------

    def op_shm_attach(self, hdr, kind, flags, size):
        fd, self.frame_fd = self.frame_fd, None
        try:
            if flags:
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"SHM_ATTACH flags {flags:#x}")
            if len(self.regions) >= regions.MAX_REGIONS:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, "a connection attaches at most "
                                f"{regions.MAX_REGIONS} shared-memory regions")
            if kind == region_layout.KIND_MEMFD:
                if fd is None:
                    raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                    "SHM_ATTACH of a memfd came without its descriptor")
                regions.check_memfd(fd, size)
                self.shared.budget.take(size, "a memfd region")
                owned, fd = fd, None  # the Region's from here: it closes it, even failing
                try:
                    got = regions.Region(owned, size, self.device, kind=region_layout.KIND_MEMFD)
                except BaseException:
                    self.shared.budget.give(size)
                    raise
                attached = regions.Attached(got, owned=True)
            elif kind == region_layout.KIND_DEVICE:
                if fd is not None:
                    raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                    "SHM_ATTACH of the device region takes no descriptor")
                if any(not a.owned for a in self.regions.values()):
                    raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                    "the device region is already attached on this connection")
                attached = regions.Attached(self.shared.attach_device(self.device), owned=False)
                if size not in (0, attached.region.size):
                    raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                    f"the VM's region is {attached.region.size} bytes, not "
                                    f"{size} (0 takes it whole)")
            else:
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"no region kind {kind}")
        finally:
            if fd is not None:
                os.close(fd)
        self.region_ids += 1
        self.regions[self.region_ids] = attached
        log.info("%s: attached a %s region of %d bytes as %d", self.peer,
                 "memfd" if attached.owned else "device", attached.region.size, self.region_ids)
        device = 0 if attached.owned else self.shared.vgpu
        return self.region_ids, device, attached.region.size, attached.region.token

    def _region(self, region: int) -> regions.Attached:
        attached = self.regions.get(region)
        if attached is None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"region {region} is not attached on this connection")
        return attached

    def _drop_region(self, attached: regions.Attached) -> None:
        """After the GPU is done with it: no DMA may outlive the mapping or the room."""
        self.device.synchronize()
        attached.give_all()
        if attached.owned:
            attached.region.close()
            self.shared.budget.give(attached.region.size)

    def op_shm_detach(self, hdr, region):
        attached = self._region(region)
        # A graph may copy from or to it: unmapped only once no graph is left.
        if region not in self.graphs.regions or \
                not self.graphs.park(f"region {region}", lambda: self._drop_region(attached)):
            self._drop_region(attached)
        self.graphs.regions.discard(region)
        del self.regions[region]

    def op_shm_alloc(self, hdr, region, reserved, size):
        return (self._region(region).take(size),)

    def op_shm_free(self, hdr, region, reserved, offset):
        attached = self._region(region)
        if offset not in attached.rooms:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"offset {offset} is not an allocation of this connection")
        self.device.synchronize()  # cuMemFreeHost waits for the device, too
        if (region, offset) in self.graphs.rooms:  # a graph may still copy to or from it
            size = attached.rooms.pop(offset)  # the guest's no more; the region's later
            if self.graphs.park(f"room {offset} of region {region}",
                                lambda: attached.region.rooms.give(offset, size)):
                return
            attached.rooms[offset] = size
        attached.give(offset)

    def _graph_reaches_room(self, region: int, offset: int) -> None:
        """A graph may copy to or from ``offset`` of ``region``: in the VM's device region,
        the room it lies in goes back to the region only once no graph is left."""
        attached = self.regions[region]
        if not attached.owned:
            for at, n in attached.rooms.items():
                if at <= offset < at + n:
                    self.graphs.rooms.add((region, at))

    def op_memcpy_htod_shm(self, hdr, dst, region, reserved, offset, size, stream):
        self.graphs.region_used(region)
        src = self._region(region).address(offset, size, "source")
        self._check_range(dst, size, "destination")
        if self.graphs.origins:  # a capture under way may take it in
            self._graph_reaches_room(region, offset)
        if size:
            self.device.memcpy_htod_async(dst, src, size, self._stream(stream))
        self.counts["h2d_bytes"] += size

    def op_memcpy_dtoh_shm(self, hdr, region, reserved, offset, src, size, stream):
        self.graphs.region_used(region)
        dst = self._region(region).address(offset, size, "destination")
        self._check_range(src, size, "source")
        if self.graphs.origins:
            self._graph_reaches_room(region, offset)
        if size:
            self.device.memcpy_dtoh_async(dst, src, size, self._stream(stream))
        self.counts["d2h_bytes"] += size

_ALREADY_REPLIED = object()
# One per executor process: a module's cost is the driver's free memory before and
# after its load, which another session's (or, through its lock file, another VM's
# executor's) allocation or release must not change in between; every call that takes
# or gives back device memory holds it shared, a measurement exclusive. Re-entrant: a
# release can run what a graph held back (parked), which takes it again.
DEVICE_MEMORY = DeviceMemoryLock()


def _reply_frame(op: int, seq: int, body: bytes, status: int = 0) -> bytes:
    return pack_header(op, P.FLAG_REPLY, seq, status, len(body)) + body


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # releasing at exit: report, never stop releasing
        log.debug("release failed: %s", exc)

