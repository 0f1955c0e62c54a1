"""One guest connection's data lane: the loop, the handshake, deferred errors, progress.

The session reads frames from the guest's socket and serves each through the
ops table (``ops``): every op's check (is this handle, this device range the
guest's?), its charge on the slice's quota and its action on the
``GpuDevice``. The session holds what the guest holds (handle tables, device
ranges, its ledger); ``ops.release`` gives it all back when the guest goes.

One-way ops are never answered; their first error is kept and reported by
the next synchronising op instead of running it (CUDA's asynchronous-error
model); STREAM_END_CAPTURE is run all the same, and a failed one-way frame
invalidates the capture its stream is in. Runs of them are served by a C loop
(``launch_burst``) that makes the same checks against tables the session keeps
in step with its own (handles, device ranges); a frame the loop does not serve
comes to the Python path. A malformed frame whose length is known gets an
error and the session goes on; a frame that breaks the framing (bad magic,
oversize) ends the connection after saying why. Anything unexpected ends the
session alone: the guest gets HV_INTERNAL where a reply can still be framed,
then the connection closes; the error is logged once, and everything the guest
held, its socket included, is released at once.

What a guest can make the session hold is bounded: payloads are kept as
their bytes arrive (``framing``), payloads kept whole are capped (each op's
``payload`` in the table: :data:`MAX_MODULE_IMAGE`, :data:`MAX_SOURCE`), and
copies go through the executor's one staging pool. Every send on the guest's
socket holds the session's send lock, so a progress frame (``progress``) never
lands inside a reply.

Must not import CUDA (``cuda_device`` does), serve an op outside the table, or
touch other guests.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from hvgpu import __version__
from hvgpu.errors import ConnectionLost, CudaError, ProtocolError
from hvgpu.host.executor import admission, ops
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.device import (STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD,
                                        GpuDevice)
from hvgpu.host.executor.graphs import Graphs
from hvgpu.host.executor.graph_memory import GraphMemory
from hvgpu.host.executor.ipc import Exports, Held
from hvgpu.host.executor.kernel_output import KernelOutput
from hvgpu.host.executor.launch_burst import LaunchBurst, unavailable_reason
from hvgpu.host.executor.ops import checks, memory
from hvgpu.host.executor.ops.modules import MAX_MODULE_IMAGE, MAX_SOURCE  # noqa: F401
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, Ledger, quietly
from hvgpu.host.executor.progress import Heartbeat
from hvgpu.host.executor.staging import StagingPool
from hvgpu.host.executor.tables import Allocations, Handles
from hvgpu.host.executor.pools import Pools
from hvgpu.host.executor import host_maps, regions
from hvgpu.host.executor.vmm import VirtualMemory
from hvgpu.host.logs import clip
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import FrameReader, PeerClosed, pack_header

log = logging.getLogger(__name__)

_HELLO, _PING = P.OP["HELLO"], P.OP["PING"]
_REGION_ATTACH = P.OP["REGION_ATTACH"]
# The lane's bookkeeping, which the guest library does on its own (a region on the first
# large copy, its rooms): a deferred CUDA error waits for the next CUDA call instead,
# which must not lose it, nor leave a room or region held that the guest thinks it gave.
_REGION_SETUP = frozenset(P.OP[name] for name in ("REGION_ATTACH", "REGION_DETACH", "REGION_ALLOC",
                                               "REGION_FREE", "HOST_MAP"))
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
# Payloads a session holds whole before using them (ops/modules.py); larger ones are
# refused (CUDA_ERROR_INVALID_VALUE) and skipped, so the session goes on.
_PAYLOAD_LIMITS = {code: op.payload for code, op in ops.TABLE.items() if op.payload}
_TAKES_PAYLOAD = frozenset(op.code for op in P.OPS if op.request_payload)
# A frame begun and then left unfinished holds memory here until it ends: past this
# much silence in its middle the connection is closed (between frames a guest may be
# idle as long as it likes).
MID_FRAME_SILENCE = 60.0
_PROGRESS_FLAGS = P.FLAG_REPLY | P.FLAG_PROGRESS
_OUTPUT_FLAGS = P.FLAG_REPLY | P.FLAG_OUTPUT


class Session:
    """Serves one guest connection until it closes."""

    def __init__(self, sock: socket.socket, device: GpuDevice | None, *, peer: str,
                 cache: CompileCache | None = None, device_error: CudaError | None = None,
                 quota=None, owns_device: bool = True, slice_name: str = "",
                 compute: int = 0, vgpus: Callable[[], int] | None = None,
                 staging: StagingPool | None = None, heartbeat: Heartbeat | None = None,
                 on_poisoned: Callable[[int], None] | None = None,
                 executor_regions: regions.ExecutorRegions | None = None,
                 neighbours: Callable[[], list] | None = None,
                 uploads: admission.UploadBudget | None = None,
                 kernel_output: KernelOutput | None = None,
                 ipc: Exports | None = None):
        self.slice_name, self.compute = slice_name, compute
        self.sock = sock
        self.send_lock = threading.Lock()
        self.busy: tuple[float, int, int] | None = None  # (since, op, seq) of the frame in work
        self.streaming = False  # a reply's payload is being sent: no other frame may cut in
        self.progress = False  # the guest set CAP_PROGRESS
        self.kernel_output = kernel_output  # what kernels print, for the guest (CAP_OUTPUT)
        self.takes_output = False  # the guest set CAP_OUTPUT
        self.last_progress = 0.0
        self.tail = b""  # unsent end of a progress frame (send lock held to touch it)
        self.closed = False
        self.heartbeat = heartbeat
        self.device = device
        # The guest's share of the slice's quota (quota: reserve(n) / release(n) / usage();
        # None: the whole GPU, nothing charged).
        self.ledger = Ledger(quota, settle=lambda: self.pools.settle())
        # How many vGPUs the guest's VM has (each its own connection): its device count.
        self.vgpus = vgpus or (lambda: 1)
        # Called with the status of a kernel fault, which poisons the whole process.
        self.on_poisoned = on_poisoned or (lambda status: None)
        self.owns_device = owns_device
        # Every session of this executor (this VM's vGPU alone): VGPU_PROCESSES lists them.
        self.neighbours = neighbours or (lambda: [self])
        self.client_pid, self.client_name = 0, ""  # the process the guest says it is
        self.monitor = False  # the guest only looks (CAP_MONITOR): it is no process here
        self.device_error = device_error or CudaError(P.HV_NO_GPU, "no device")
        self.peer = peer
        self.cache = cache or CompileCache(None)
        self.reader = FrameReader(sock, accept_fds=sock.family == socket.AF_UNIX,
                                  mid_frame_silence=MID_FRAME_SILENCE)
        self.uploads = uploads or admission.PROCESS_UPLOADS
        self.compile_slots = admission.compile_slots(self.cache.directory)
        self.allocs = Allocations()
        self.allocations: dict[int, memory.Allocation] = {}  # by address: cuMemAlloc's
        # CUDA IPC: the executor's exports, which its sessions (this VM's processes on
        # this vGPU) share, and what this one exported and opened
        self.ipc = ipc if ipc is not None else Exports()
        self.ipc_held = Held()
        self.exec_charges: dict[int, int] = {}  # instantiated graph -> bytes it took
        self.upload_stream = None  # the executor's own, for uploads at instantiation
        self.globals: dict[int, Allocations] = {}  # module handle -> its variables' ranges
        self.modules = Handles("module")
        self.linked: dict[int, bytes] = {}  # LINK's images until LINK_IMAGE fetches them
        self.next_link = 0
        self.limit_charges: dict[int, int] = {}  # context limit -> what its setting holds
        self.functions = Handles("function")
        self.streams = Handles("stream")
        self.events = Handles("event")
        # CUDA arrays and mipmapped arrays (ops/arrays.py), and the driver's values of
        # the texture and surface objects this guest made
        self.arrays = Handles("array")
        self.mipmaps = Handles("mipmapped array")
        self.textures: set[int] = set()
        self.surfaces: set[int] = set()
        self.layouts: dict[int, list] = {}
        self.graphs = Graphs(device)  # captures, graphs, what a graph may still reach
        self.vmm = VirtualMemory(device, self.ledger.charge, self.ledger.uncharge,
                                 DEVICE_MEMORY, self.ipc, self.ledger.hand_over)
        self.pools = Pools(device, self.ledger.charge, self.ledger.uncharge, DEVICE_MEMORY,
                           self.stream, accounted=quota is not None, exports=self.ipc,
                           hand_over=self.ledger.hand_over)
        # Allocation and free nodes of its graphs, and what their memory is charged
        self.graph_memory = GraphMemory(device, self.ledger.charge, self.ledger.uncharge,
                                        accounted=lambda: self.ledger.quota is not None)
        self.graphs.memory = self.graph_memory
        self.launchable: dict[int, tuple] = {}  # function handle -> (function, params size)
        self.deferred: tuple[CudaError, int, int] | None = None
        self.staging = staging  # the executor's pool; None: one of its own, made on first use
        # Regions: the executor's budget and VM region; none by default
        self.executor_regions = executor_regions or regions.ExecutorRegions(0)
        self.regions: dict[int, regions.Attached] = {}
        self.host_maps = host_maps.HostMaps()  # its pinned memory mapped at its addresses
        self.region_ids = 0
        self.frame_fd: int | None = None  # the descriptor the REGION_ATTACH in work came with
        self.owns_staging = staging is None
        self.version = 0
        self.serving = _SERVING  # op -> serve(session, hdr, body)
        self.counts = {"frames": 0, "launches": 0, "h2d_bytes": 0, "d2h_bytes": 0}
        self.by_op: dict[int, int] = {}  # op << 1 | one-way -> frames (see op_counts)
        self.errors: dict[int, int] = {}  # CUDA status -> the guest's calls that failed with it
        self.burst = self._launch_burst()

    @property
    def quota(self):
        """What the slice's quota is charged through (None: the whole GPU)."""
        return self.ledger.quota

    @quota.setter
    def quota(self, quota) -> None:
        self.ledger.quota = quota

    @property
    def charged(self) -> int:
        """Bytes of the slice's quota this guest holds."""
        return self.ledger.charged

    @property
    def module_charges(self) -> dict[int, int]:
        """Module handle -> bytes of the quota its load was charged."""
        return {handle: m.charge for handle, m in self.modules.objects.items()}

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
        self.graph_memory.ranges.mirror = burst
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
        serving = self.serving
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
            if hdr.op not in serving:
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
            if hdr.op in _REGION_SETUP:
                self.frame_fd = self.reader.take_fd() if hdr.op == _REGION_ATTACH else None
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
            result = self.serving[hdr.op](self, hdr, body)
        except (CudaError, ProtocolError) as exc:
            if self.reader.payload_left:
                self.reader.skip_payload()
            if isinstance(exc, ProtocolError):
                exc = CudaError(P.HV_BAD_FRAME, str(exc))
            self._failed(hdr, oneway, exc, body)
            return
        if self.reader.payload_left:
            self.reader.skip_payload()
        if not oneway and result is not ops.ALREADY_REPLIED:
            self._send(_reply_frame(hdr.op, hdr.seq, codec.REPLY[hdr.op].encode(result or ())))

    def _wait_before_telling(self, hdr, body) -> None:
        """Carries out a synchronisation whose reply will be an earlier error: its own
        failure (a bad handle, the sticky error itself) changes nothing of that reply."""
        try:
            if self.device is not None:
                self.serving[hdr.op](self, hdr, body)
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
                burst.set_ring(memory.staging(self).copy_ring())  # None: Python copies them
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
            stream = self.stream(fixed.unpack_from(body)[at])
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
            | P.CAP_MONITOR | (P.CAP_OUTPUT if self.kernel_output is not None else 0)
        if self.device is not None:
            mycaps |= self.executor_regions.caps
            if self.reader.fds is None:  # descriptors travel on unix sockets only
                mycaps &= ~P.CAP_REGION_MEMFD
        log.info("%s: connected, protocol v%d, client %s", self.peer, chosen, clip(client))
        reply = (chosen, 0, caps & mycaps, P.MAX_PAYLOAD, P.MAX_BODY, self.peer,
                 f"hvgpu {__version__}")
        self._send(_reply_frame(hdr.op, hdr.seq, codec.REPLY[_HELLO].encode(reply)))
        self.progress = bool(caps & P.CAP_PROGRESS)
        self.takes_output = bool(caps & mycaps & P.CAP_OUTPUT)
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
        """A reply frame, after what kernels printed since the last one."""
        with self.send_lock:
            try:
                if self.kernel_output is not None:
                    self.output_locked(data)
                self.send_locked(data)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ConnectionLost(f"guest went away while sending: {exc}") from None

    def send_locked(self, data) -> None:
        """Send ``data`` with the send lock held (the caller's), after the rest of a
        progress frame if one was left half-sent."""
        if self.tail:  # the rest of a progress frame the heartbeat could not finish
            self.sock.sendall(self.tail)
            self.tail = b""
        self.sock.sendall(data)

    def output_locked(self, reply) -> None:
        """Before ``reply`` (a reply's header, send lock held): what kernels printed,
        as FLAG_OUTPUT frames of the same op and seq; dropped, with a note in the log,
        for a guest that cannot take them."""
        out = self.kernel_output.take()
        if not out:
            return
        op, seq = reply_of(reply)
        if not self.takes_output:
            log.info("%s: %d bytes of kernel printf output dropped: the guest's runtime does "
                     "not take it (an older hvgpu)", self.peer, len(out))
            return
        for at in range(0, len(out), P.MAX_PAYLOAD):
            chunk = out[at:at + P.MAX_PAYLOAD]
            self.send_locked(pack_header(op, _OUTPUT_FLAGS, seq, 0, 0, len(chunk)))
            self.send_locked(chunk)

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
        ops.release(self)
        if self.burst is not None:
            self.burst.close()
            self.burst = None
        if self.owns_device:
            quietly(self.device.close)
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

    def stream(self, handle: int) -> Any:
        """The device's stream a guest's stream number names (CudaError if none)."""
        return checks.stream(self, handle)


# op -> serve(session, hdr, body): decode, check, charge, act (ops/table.py)
_SERVING: dict[int, Callable] = {code: op.serve for code, op in ops.TABLE.items()}


def reply_of(frame) -> tuple[int, int]:
    """The op and seq of a frame's header."""
    hdr = P.HEADER.unpack_from(frame)
    return hdr[3], hdr[5]


def _reply_frame(op: int, seq: int, body: bytes, status: int = 0) -> bytes:
    return pack_header(op, P.FLAG_REPLY, seq, status, len(body)) + body
