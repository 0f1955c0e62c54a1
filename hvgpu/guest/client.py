"""The guest end of the data lane: one connection to the host agent.

The connection itself is the guest's C client library (``libhvgpu-client.so.1``,
built from the ``libcuda.so.1`` shim's own sources: ``shim/wire.c``,
``region_lane.c``, ``region.c``, ``pcopy.c``; docs/design/guest-client.md says why),
called through ctypes: framing, the HELLO handshake, coalescing, the
region lane, staging and parallel copies are that library's, the same
code the shim runs. This module encodes request bodies and decodes replies with
``hvgpu.virtio.codec`` and turns the library's statuses into exceptions; it
must not put frames on a socket itself.

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

import ctypes
import dataclasses
import os
import sys
import threading
import time

from hvgpu import __version__
from hvgpu.errors import (AddressError, AgentLost, CompileError, CudaError, HvgpuError,
                          TransportError)
from hvgpu.guest.shim import CLIENT_LIBRARY, ShimMissing
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.address import Address, parse_address
from hvgpu.virtio.tuning import DEFAULT_TIMEOUT, MIN_TIMEOUT
from hvgpu.virtio.tuning import ENV_AGENT as ENV_ADDRESS
from hvgpu.virtio.tuning import ENV_TIMEOUT

FLUSH_DELAY = 100e-6  # the longest a coalesced frame waits for company
REPLY_BYTES = 64 << 10  # a reply body up to this size is read into the connection's buffer

_LAUNCH_OP = P.OP["LAUNCH_KERNEL"]
_LAUNCH_FIXED = codec.REQUEST[_LAUNCH_OP].fixed  # LAUNCH_KERNEL's fixed fields, from the table
_FREE_OP = P.OP["MEM_FREE"]
_COMPILE_OPS = (P.OP["MODULE_COMPILE"], P.OP["MODULE_COMPILE_HEADERS"])
_CLOSING = (P.HV_VERSION, P.HV_HANDSHAKE, P.HV_OVERSIZE)  # the agent hangs up after these
_DEVICE_UNAVAILABLE = P.CUDA_ERROR_DEVICE_UNAVAILABLE
# hvgpu_client_open's status where it returns no connection (wire.c)
_OPEN_LOST, _OPEN_TIMED_OUT = -1, -2

_lib = None
_lib_lock = threading.Lock()


class ClientMissing(ShimMissing):
    """The install had no C compiler, so the guest's client library was not built."""

    code = "client-missing"


def library() -> ctypes.CDLL:
    """The C client library, loaded once (RTLD_LOCAL: its symbols stay its own)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            if not CLIENT_LIBRARY.exists():
                raise ClientMissing(
                    f"the hvgpu client library is not built ({CLIENT_LIBRARY} is missing), so "
                    "the Python API cannot reach the agent: install a C compiler (e.g. apt "
                    "install gcc) and reinstall hvgpu-guest (pip install --force-reinstall "
                    "--no-deps hvgpu-guest; hvgpu where that is what is installed), or run "
                    "python3 build_c.py in a source checkout")
            _lib = _declare(ctypes.CDLL(str(CLIENT_LIBRARY), mode=ctypes.RTLD_LOCAL))
        return _lib


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, u16, u32, u64, i = (ctypes.c_void_p, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64,
                            ctypes.c_int)
    pu32, pu64, pi = ctypes.POINTER(u32), ctypes.POINTER(u64), ctypes.POINTER(i)
    for name, res, args in (
            ("hvgpu_client_open", vp, [ctypes.c_char_p, ctypes.c_double, u64, ctypes.c_char_p,
                                       u32, vp, u32, pu32, pi, ctypes.c_char_p, u32]),
            ("hvgpu_client_call", i, [vp, u16, vp, u32, vp, u64, i, vp, u32, pu32, vp, u64,
                                      pu64]),
            ("hvgpu_client_send", i, [vp, u16, vp, u32, i, pu32]),
            ("hvgpu_client_reply", i, [vp, u16, u32, vp, u32, pu32, pu64]),
            ("hvgpu_client_post", i, [vp, u16, vp, u32, vp, u64]),
            ("hvgpu_client_flush", i, [vp]),
            ("hvgpu_client_close", None, [vp]),
            ("hvgpu_client_lost", ctypes.c_char_p, [vp]),
            ("hvgpu_client_refusal", i, [vp, pi, pu32, pu32, pi, ctypes.POINTER(vp), pu32]),
            ("hvgpu_client_reply_body", vp, [vp]),
            ("hvgpu_client_reply_payload", vp, [vp]),
            ("hvgpu_client_upload", i, [vp, u64, vp, u64, u64]),
            ("hvgpu_client_download", i, [vp, vp, u64, u64, u64]),
            ("hvgpu_client_pinned_alloc", i, [vp, u64, ctypes.POINTER(vp)]),
            ("hvgpu_client_pinned_free", i, [vp, vp]),
            ("hvgpu_client_pinned_where", i, [vp, vp, pu32, pu64]),
            ("hvgpu_client_lane", i, [vp, pi, ctypes.POINTER(ctypes.c_char_p)]),
            ("hvgpu_shim_frames", None, [u16, pu64, pu64])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def frames_sent(op: str) -> tuple[int, int]:
    """(synchronous, one-way) frames of ``op`` this process's connections have sent so
    far, all together: which path a copy took, for tests and benchmarks."""
    sync, oneway = ctypes.c_uint64(), ctypes.c_uint64()
    library().hvgpu_shim_frames(P.OP[op], ctypes.byref(sync), ctypes.byref(oneway))
    return sync.value, oneway.value


def _readable(data) -> tuple[object, int]:
    """(something ctypes passes as the address of data's bytes, their count)."""
    if data is None:
        return None, 0
    if isinstance(data, bytes):
        return data, len(data)
    view = memoryview(data).cast("B")
    if view.readonly:
        return bytes(view), view.nbytes
    return (ctypes.c_char * view.nbytes).from_buffer(view), view.nbytes


def _writable(data) -> tuple[object, int]:
    view = memoryview(data).cast("B")
    if view.readonly:
        raise TypeError(f"a copy from the device needs a writable buffer, not a read-only "
                        f"{type(data).__name__}")
    return (ctypes.c_char * view.nbytes).from_buffer(view), view.nbytes


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


class PinnedMemory:
    """Page-locked host memory in the connection's region: ``view`` is
    writable, and copies from and to it (or any buffer inside it) are DMA on the host.
    A copy from it returns before the DMA has read it: change it only after a sync.
    ``view`` must not be used after :meth:`close`."""

    def __init__(self, conn: "Connection", addr: int, size: int, region: int, offset: int):
        self.conn, self.addr, self.size = conn, addr, size
        self.region, self.offset = region, offset  # where the executor finds it
        self.view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")

    def __repr__(self) -> str:
        return f"<hvgpu PinnedMemory {self.size} bytes at {self.addr:#x}>"

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None
            self.conn._free_pinned(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
        self.lib = library()
        self.lock = threading.RLock()
        self.closed = False
        self.lost: str | None = None  # why the connection was lost, once it is
        self._pending_frees: list[int] = []
        self._out_pending = threading.Event()  # one-way frames wait in the library's batch
        self._flusher: threading.Thread | None = None
        self._reply = ctypes.create_string_buffer(REPLY_BYTES)
        self._pinned: set[int] = set()
        wanted = P.CAP_NVRTC | P.CAP_PARAM_INFO | P.CAP_PROGRESS | P.CAP_REGION_DEVICE
        if not monitor:  # what kernels print comes to this process's stdout
            wanted |= P.CAP_OUTPUT
        if self.address.scheme == "unix":  # descriptors (memfds) travel on these alone
            wanted |= P.CAP_REGION_MEMFD
        if monitor:
            wanted |= P.CAP_MONITOR
        client = P.client_text(f"hvgpu-guest {__version__}", os.getpid(),
                               process_name()).encode()
        n, status = ctypes.c_uint32(), ctypes.c_int()
        why = ctypes.create_string_buffer(2048)
        self._w = self.lib.hvgpu_client_open(
            str(self.address).encode(), float(self.timeout or 0), wanted, client, len(client),
            self._reply, REPLY_BYTES, ctypes.byref(n), ctypes.byref(status), why, len(why))
        if not self._w:
            self.closed = True
            said = why.value.decode(errors="replace")
            if status.value == 0:
                raise TransportError(said)
            if status.value == _OPEN_TIMED_OUT:
                raise CudaError(_DEVICE_UNAVAILABLE, said)
            if status.value == _OPEN_LOST:
                self.lost = said
                raise AgentLost(_DEVICE_UNAVAILABLE, said, op="HELLO")
            raise CudaError(status.value, said, op="HELLO")
        version, _, caps, max_payload, _, peer, agent = codec.REPLY[P.OP["HELLO"]].decode(
            ctypes.string_at(self._reply, n.value))
        self.version, self.caps, self.peer, self.agent = version, caps, peer, agent
        self.max_payload = max_payload

    # -- calls -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise AgentLost(_DEVICE_UNAVAILABLE, self.lost or (
                f"the connection to the hvgpu agent at {self.address} was closed by this "
                "program"))

    def call(self, op: str, *values, payload=None, reply_into=None):
        """Send a synchronous op and return its reply's values.

        ``payload`` is sent raw after the body; a reply payload is read into
        ``reply_into`` (a writable buffer of the reply's size), else returned as
        the last value (bytes).
        """
        code = P.OP[op]
        body = codec.REQUEST[code].encode(values)
        with self.lock:
            self._check_open()
            self._flush_frees()
            return self._roundtrip(code, body, payload, reply_into)

    def _roundtrip(self, code: int, body: bytes, payload=None, reply_into=None, fd: int = -1):
        """One synchronous op on the library (lock held): its reply's values."""
        data, n = _readable(payload)
        into, cap = _writable(reply_into) if reply_into is not None else (None, 0)
        body_len, payload_len = ctypes.c_uint32(), ctypes.c_uint64()
        r = self.lib.hvgpu_client_call(self._w, code, body, len(body), data, n, fd, self._reply,
                                       REPLY_BYTES, ctypes.byref(body_len), into, cap,
                                       ctypes.byref(payload_len))
        if r:
            self._fail(r, code)
        values = codec.REPLY[code].decode(self._body(body_len.value))
        if payload_len.value and into is None:
            return values + (ctypes.string_at(self.lib.hvgpu_client_reply_payload(self._w),
                                              payload_len.value),)
        return values

    def _body(self, n: int) -> bytes:
        where = self._reply if n <= REPLY_BYTES else self.lib.hvgpu_client_reply_body(self._w)
        return ctypes.string_at(where, n)

    def call_with_fds(self, op: str, *values, fds=()):
        """A synchronous op whose frame carries a file descriptor (SCM_RIGHTS)."""
        code = P.OP[op]
        body = codec.REQUEST[code].encode(values)
        with self.lock:
            self._check_open()
            seq = self.send_request(code, body, fds)
            return self.read_reply(code, seq)

    def send_request(self, code: int, body: bytes, fds=()) -> int:
        """Send a synchronous op's frame without waiting (lock held); its seq. Replies
        come in the order of their requests: read each with read_reply. ``fds``: at
        most one descriptor, which travels with the frame."""
        if len(fds) > 1:
            raise ValueError(f"one descriptor travels with a frame, not {len(fds)}")
        self._check_open()
        seq = ctypes.c_uint32()
        r = self.lib.hvgpu_client_send(self._w, code, body, len(body), fds[0] if fds else -1,
                                       ctypes.byref(seq))
        if r:
            self._fail(r, code)
        return seq.value

    def read_reply(self, code: int, seq: int):
        """The values of the reply to seq (lock held); raises its error."""
        self._check_open()
        body_len, payload_len = ctypes.c_uint32(), ctypes.c_uint64()
        r = self.lib.hvgpu_client_reply(self._w, code, seq, self._reply, REPLY_BYTES,
                                        ctypes.byref(body_len), ctypes.byref(payload_len))
        if r:
            self._fail(r, code)
        if payload_len.value:
            self._lost_now(f"lost the connection to the hvgpu agent at {self.address} (broke "
                           f"the protocol: an unexpected payload in the reply to {seq}); the "
                           "GPU work of this connection is gone", code)
        return codec.REPLY[code].decode(self._body(body_len.value))

    def post(self, op: str, *values, payload=None) -> None:
        """Send a one-way op; its error, if any, surfaces at the next call."""
        code = P.OP[op]
        self._post(code, codec.REQUEST[code].encode(values), payload)

    def launch(self, function: int, grid, block, shared_mem: int, stream: int,
               params: bytes) -> None:
        """LAUNCH_KERNEL on the fast path: one pack, coalesced."""
        self._post(_LAUNCH_OP, _LAUNCH_FIXED.pack(function, grid[0], grid[1], grid[2], block[0],
                                                  block[1], block[2], shared_mem, stream,
                                                  len(params)) + bytes(params))

    def _post(self, code: int, body: bytes, payload=None) -> None:
        data, n = _readable(payload)
        with self.lock:
            self._check_open()
            r = self.lib.hvgpu_client_post(self._w, code, body, len(body), data, n)
            if r:
                self._fail(r, code)
            if not self._out_pending.is_set():
                self._out_pending.set()
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                                     name="hvgpu-flusher")
                    self._flusher.start()

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
                if self.lib.hvgpu_client_flush(self._w):
                    return  # the next call on the connection reports it

    def copy_to_device(self, dst: int, src, stream: int = 0) -> None:
        """Host-to-device copy of any buffer; pipelined (one-way). From pinned memory
        (a region) it names offsets; a large pageable source is staged
        through the region; elsewhere its bytes travel on the socket. The source may
        be reused on return, pinned memory excepted."""
        data, n = _readable(src)
        if not n:
            return
        with self.lock:
            self._check_open()
            r = self.lib.hvgpu_client_upload(self._w, dst, data, n, stream)
            if r:
                self._fail(r, P.OP["MEMCPY_HTOD"])
            if not self._out_pending.is_set():  # a small copy waits in the batch
                self._out_pending.set()
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                                     name="hvgpu-flusher")
                    self._flusher.start()

    def copy_from_device(self, dst, src: int, stream: int = 0) -> None:
        """Device-to-host copy into any writable buffer; waits for the stream. Into
        pinned memory the bytes come by DMA; a large pageable one is staged through
        the region; elsewhere they come on the socket."""
        into, n = _writable(dst)
        if not n:
            return
        with self.lock:
            self._check_open()
            self._flush_frees()
            r = self.lib.hvgpu_client_download(self._w, into, src, n, stream)
            if r:
                self._fail(r, P.OP["MEMCPY_DTOH"])

    # -- the region lane --------------------------------------------------

    def pinned(self, size: int) -> PinnedMemory:
        """Page-locked host memory in the region (see Device.pinned)."""
        if size <= 0:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"pinned memory of {size} bytes")
        with self.lock:
            self._check_open()
            self._flush_frees()
            p = ctypes.c_void_p()
            r = self.lib.hvgpu_client_pinned_alloc(self._w, size, ctypes.byref(p))
            if r == P.CUDA_ERROR_NOT_SUPPORTED and not self.lib.hvgpu_client_lost(self._w) \
                    and not self._refusal():
                raise CudaError(r, "no pinned memory without a region: "
                                f"{self.lane()[2] or 'none could be had'}")
            if r:
                self._fail(r, P.OP["REGION_ALLOC"])
            self._pinned.add(p.value)
            region, offset = ctypes.c_uint32(), ctypes.c_uint64()
            self.lib.hvgpu_client_pinned_where(self._w, p.value, ctypes.byref(region),
                                               ctypes.byref(offset))
            return PinnedMemory(self, p.value, size, region.value, offset.value)

    def _free_pinned(self, mem: PinnedMemory) -> None:
        with self.lock:
            self._pinned.discard(mem.addr)
            r = self.lib.hvgpu_client_pinned_free(None if self.closed else self._w, mem.addr)
            if r and not self.closed:
                self._fail(r, P.OP["REGION_FREE"])

    def lane(self) -> tuple[str | None, bool, str]:
        """(the region: None not tried yet, "none", "device" the VM's
        device, "memfd"; whether the staging slots are there; why there is none)."""
        staged, why = ctypes.c_int(), ctypes.c_char_p()
        with self.lock:
            if self.closed:
                return None, False, ""
            mode = self.lib.hvgpu_client_lane(self._w, ctypes.byref(staged), ctypes.byref(why))
        return ((None, "none", "device", "memfd")[mode], bool(staged.value),
                (why.value or b"").decode(errors="replace"))

    @property
    def pinned_count(self) -> int:
        """Pinned allocations of this connection not yet closed."""
        return len(self._pinned)

    def free_later(self, dptr: int) -> None:
        """Queue a free from a finaliser; sent before the next synchronous call."""
        self._pending_frees.append(dptr)

    def _flush_frees(self) -> None:
        while self._pending_frees:
            ptr = self._pending_frees.pop()
            try:
                self._roundtrip(_FREE_OP, codec.REQUEST[_FREE_OP].encode((ptr,)))
            except CudaError as exc:
                if isinstance(exc, AgentLost):
                    raise
                # already gone with a reset context; nothing left to free

    # -- errors ---------------------------------------------------------------

    def _refusal(self):
        status, op, seq, earlier = (ctypes.c_int(), ctypes.c_uint32(), ctypes.c_uint32(),
                                    ctypes.c_int())
        message, n = ctypes.c_void_p(), ctypes.c_uint32()
        if not self.lib.hvgpu_client_refusal(self._w, ctypes.byref(status), ctypes.byref(op),
                                             ctypes.byref(seq), ctypes.byref(earlier),
                                             ctypes.byref(message), ctypes.byref(n)):
            return None
        text = ctypes.string_at(message, n.value).decode("utf-8", "replace") if n.value else ""
        return status.value, op.value, bool(earlier.value), text

    def _fail(self, r: int, code: int):
        """Raise what the library's status r on op `code` means (lock held)."""
        lost = self.lib.hvgpu_client_lost(self._w)
        if lost:
            self._lost_now(lost.decode(errors="replace"), code)
        refused = self._refusal()
        if refused is None:  # the library's own: a reply that did not fit its buffer
            raise CudaError(r, "", op=P.op_name(code))
        status, failed_op, deferred, message = refused
        cls = CompileError if (code in _COMPILE_OPS and not deferred) else CudaError
        err = cls(status, message, op=P.op_name(failed_op), deferred=deferred)
        if status in _CLOSING:
            self.lost = f"the hvgpu agent at {self.address} closed the connection after: {err}"
            self.close()
        raise err

    def _lost_now(self, why: str, code: int | None):
        """Close the connection for good and raise AgentLost, as every later call will."""
        self.lost = why
        self.close()
        raise AgentLost(_DEVICE_UNAVAILABLE, why,
                        op=P.op_name(code) if code is not None else "") from None

    def close(self) -> None:
        """Sends the one-way work already issued (it still reaches the GPU) and hangs up.
        Pinned memory stays readable until closed; the agent let go of its side."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._out_pending.set()  # lets the flusher thread end
            w, self._w = self._w, None
            self.lib.hvgpu_client_close(w)

    def __del__(self):
        if not getattr(self, "closed", True) and getattr(self, "_w", None):
            try:
                self.lib.hvgpu_client_close(self._w)
            except Exception:  # interpreter shutdown
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
