"""Devices, memory, streams and events of the guest Python API.

Shaped after NVIDIA's ``cuda.core``: ``Device`` is the vGPU the agent gives
this guest, ``Buffer`` is device memory at its real device address, streams
and events map 1:1 onto the host's. Copies accept any buffer-protocol object
(numpy arrays, bytearrays, memoryviews); numpy is not required.

What CUDA refuses raises ``CudaError`` with its status; a lost connection to the
agent raises ``AgentLost``, a ``CudaError`` with CUDA_ERROR_DEVICE_UNAVAILABLE
(46), on that call and every later one (see ``hvgpu.guest``).

Must not import ``hvgpu.host``; talks to the host only through ``Connection``.
"""

from __future__ import annotations

import weakref

from hvgpu.errors import CudaError
from hvgpu.guest.client import Connection
from hvgpu.guest.runtime import default_connection
from hvgpu.virtio import protocol as P

ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
_EVENT_DISABLE_TIMING = 0x2
_STREAM_NON_BLOCKING = 0x1


def _nbytes(obj) -> int:
    return memoryview(obj).nbytes


def _stream_handle(stream) -> int:
    return 0 if stream is None else stream.handle


class Device:
    """One of the guest's vGPUs. Each is its own connection (to the executor of that
    vGPU on its GPU), which serves it as its device 0."""

    def __init__(self, device_id: int = 0, *, connection: Connection | None = None):
        self.device_id = device_id
        self.conn = connection or default_connection(device_id)
        self._cache: dict = {}

    def __repr__(self) -> str:
        return f"<hvgpu Device {self.device_id} via {self.conn.address}>"

    def _get(self, key, fetch):
        if key not in self._cache:
            self._cache[key] = fetch()
        return self._cache[key]

    def attribute(self, attrib: int) -> int:
        return self._get(("attr", attrib), lambda: self.conn.call(
            "DEVICE_GET_ATTRIBUTE", attrib, 0)[0])

    @property
    def name(self) -> str:
        return self._get("name", lambda: self.conn.call("DEVICE_GET_NAME", 0)[0])

    @property
    def uuid(self) -> str:
        raw = self._get("uuid", lambda: self.conn.call("DEVICE_GET_UUID", 0)[0])
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    @property
    def total_memory(self) -> int:
        return self._get("mem", lambda: self.conn.call("DEVICE_TOTAL_MEM", 0)[0])

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.attribute(ATTR_COMPUTE_CAPABILITY_MAJOR),
                self.attribute(ATTR_COMPUTE_CAPABILITY_MINOR))

    @property
    def multiprocessor_count(self) -> int:
        return self.attribute(ATTR_MULTIPROCESSOR_COUNT)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes, as cuMemGetInfo reports them on the host."""
        return self.conn.call("MEM_GET_INFO")

    @property
    def default_stream(self) -> "Stream":
        return Stream(self.conn, 0)

    def allocate(self, size: int) -> "Buffer":
        ptr, = self.conn.call("MEM_ALLOC", int(size))
        return Buffer(self.conn, ptr, int(size))

    def pinned(self, size: int):
        """Page-locked host memory (cudaMallocHost): ``PinnedMemory`` whose ``view`` is
        a writable memoryview. It lies in the region the agent offers
        (``hvgpu attach --region``; on a unix socket, a memfd), so copies from and to it
        are DMA on the host and carry no bytes on the socket. CudaError
        CUDA_ERROR_NOT_SUPPORTED where no region can be had."""
        return self.conn.pinned(int(size))

    def create_stream(self, *, non_blocking: bool = True) -> "Stream":
        handle, = self.conn.call("STREAM_CREATE", _STREAM_NON_BLOCKING if non_blocking else 0)
        return Stream(self.conn, handle, owned=True)

    def create_event(self, *, timing: bool = True) -> "Event":
        handle, = self.conn.call("EVENT_CREATE", 0 if timing else _EVENT_DISABLE_TIMING)
        return Event(self.conn, handle)

    def sync(self) -> None:
        """Wait for all work of this guest's context (cuCtxSynchronize)."""
        self.conn.call("CTX_SYNCHRONIZE")


class Buffer:
    """Device memory; ``ptr`` is the real device address on the host."""

    def __init__(self, conn: Connection, ptr: int, size: int):
        self.conn, self.ptr, self.size = conn, ptr, size
        self._finalizer = weakref.finalize(self, conn.free_later, ptr)

    def __repr__(self) -> str:
        return f"<hvgpu Buffer 0x{self.ptr:x} {self.size} bytes>"

    @property
    def handle(self) -> int:
        return self.ptr

    def __int__(self) -> int:
        return self.ptr

    def copy_from(self, src, *, stream=None, offset: int = 0) -> None:
        """Copy host bytes (any buffer) into this buffer; does not wait.

        The source may be reused as soon as this returns: its bytes are on
        their way to the host. Pinned memory (``Device.pinned``) is the
        exception, as for cudaMemcpyAsync: the host's DMA reads it in place, so
        it must not change until the stream (or the device) has been synchronised.
        """
        if isinstance(src, Buffer) and src.conn is not self.conn:
            # Another vGPU's memory (cuMemcpyPeer): its executor is another process,
            # perhaps on another GPU, so the bytes come through this guest.
            self.copy_from(src.copy_to(), stream=stream, offset=offset)
            return
        if isinstance(src, Buffer):
            n = src.size
            self._check(offset, n)
            self.conn.post("MEMCPY_DTOD", self.ptr + offset, src.ptr, n, _stream_handle(stream))
            return
        self._check(offset, _nbytes(src))
        self.conn.copy_to_device(self.ptr + offset, src, _stream_handle(stream))

    def copy_to(self, dst=None, *, stream=None, offset: int = 0):
        """Copy into a writable host buffer (a new bytearray if none); waits."""
        if dst is None:
            dst = bytearray(self.size - offset)
        self._check(offset, _nbytes(dst))
        self.conn.copy_from_device(dst, self.ptr + offset, _stream_handle(stream))
        return dst

    def fill(self, value: int, *, width: int = 1, stream=None) -> None:
        """memset with a 1-, 2- or 4-byte value over the whole buffer."""
        if self.size % width:
            raise ValueError(f"buffer of {self.size} bytes is not a multiple of width {width}")
        self.conn.post("MEMSET", self.ptr, self.size // width, value, width,
                       _stream_handle(stream))

    def _check(self, offset: int, n: int) -> None:
        if offset < 0 or offset + n > self.size:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"{n} bytes at offset {offset} do not fit a {self.size}-byte buffer")

    def close(self) -> None:
        if self._finalizer.detach():
            self.conn.call("MEM_FREE", self.ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Stream:
    def __init__(self, conn: Connection, handle: int, owned: bool = False):
        self.conn, self.handle, self.owned = conn, handle, owned

    def __repr__(self) -> str:
        return f"<hvgpu Stream {self.handle}>"

    def sync(self) -> None:
        self.conn.call("STREAM_SYNCHRONIZE", self.handle)

    @property
    def is_done(self) -> bool:
        try:
            self.conn.call("STREAM_QUERY", self.handle)
        except CudaError as exc:
            if exc.status == P.CUDA_ERROR_NOT_READY and not exc.deferred:
                return False
            raise
        return True

    def record(self, event: "Event | None" = None) -> "Event":
        if event is None:
            event = Event(self.conn, self.conn.call("EVENT_CREATE", 0)[0])
        self.conn.post("EVENT_RECORD", event.handle, self.handle)
        return event

    def wait(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event`` (on the GPU)."""
        self.conn.post("STREAM_WAIT_EVENT", self.handle, event.handle, 0)

    def close(self) -> None:
        if self.owned:
            self.owned = False
            self.conn.call("STREAM_DESTROY", self.handle)


class Event:
    def __init__(self, conn: Connection, handle: int):
        self.conn, self.handle = conn, handle

    def sync(self) -> None:
        self.conn.call("EVENT_SYNCHRONIZE", self.handle)

    @property
    def is_done(self) -> bool:
        try:
            self.conn.call("EVENT_QUERY", self.handle)
        except CudaError as exc:
            if exc.status == P.CUDA_ERROR_NOT_READY and not exc.deferred:
                return False
            raise
        return True

    def __sub__(self, other: "Event") -> float:
        """Milliseconds from ``other`` to this event, as cuda.core has it."""
        return self.conn.call("EVENT_ELAPSED_TIME", other.handle, self.handle)[0]

    def close(self) -> None:
        if self.handle is not None:
            self.conn.call("EVENT_DESTROY", self.handle)
            self.handle = None
