"""Test double of the executor's GPU: host memory stands in for device memory.

Implements ``hvgpu.host.executor.device.GpuDevice`` so the real session, agent,
transport and guest client run end to end on a machine without a GPU. Kernels
are a handful of Python functions found by name in the "compiled" source.
Lives under tests/ only; the product never loads it.

It models what the driver does and reports (statuses, the free memory each
allocation takes), never the product's own model of it: tests/contract holds it
and the driver to the same expectations, and where they disagree, this changes.

Set HVGPU_FAKE_REPORT to a directory to get one JSON file per executor on
close, saying what the session left allocated (it must be nothing); with
HVGPU_FAKE_REPORT_PINNED set too, also the most pinned host memory it held; with
HVGPU_FAKE_REPORT_GRAPHS, the graphs it was left holding, graph launches, events
destroyed and modules unloaded.

Set HVGPU_FAKE_DEVICE_WIDE to a directory for free memory that is the device's,
as cuMemGetInfo's is: every executor of the double publishes what it takes
there (on each allocation, free, module load and unload, physical memory made
and released, pool growth and trim, instantiation), and each one's free memory
is what all of them leave. HVGPU_FAKE_LOAD_SECONDS makes each module
load take that long, so a test can act while one is measured.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import threading
import time
import types

import numpy as np

from hvgpu.errors import CompileError, CudaError
from hvgpu.virtio import protocol as P

# Statuses by CUDA's names less their prefix (S.INVALID_VALUE), to keep the raises short.
S = types.SimpleNamespace(**{name.removeprefix("CUDA_ERROR_"): code
                             for name, code in P.STATUS_BY_NAME.items()})

BASE = 0x7F00_0000_0000
TOTAL = 1 << 30
GRANULARITY = 2 << 20  # cuMemGetAllocationGranularity, as on current GPUs
POOL_STEP = 512  # a pool hands out its chunks in steps of this
# What the driver takes of device memory per instantiation of a small graph: nothing,
# measured on the H200 (four instantiations of a kernel-and-memset graph took 0 bytes,
# uploaded and launched). FakeDevice.exec_bytes stands for a driver where one would.
GRAPH_EXEC_BYTES = 0
# (not measured yet: tests/contract/test_graphs.py holds it to the driver's figure)
# What cuMemAlloc takes of the free memory cuMemGetInfo reports (seen on the H200, driver
# 580; tests/contract holds the driver to it): up to SMALL_ALLOCATION, allocations are
# carved out of GRANULARITY pages the driver shares among them, SMALL_STEP bytes at a
# step; larger ones take whole pages of their own. The double takes a small one's share
# of a page rather than modelling which page has room: alone, one takes less here than
# on the driver (a whole new page, or nothing); many together take the same.
SMALL_ALLOCATION = 1 << 20
SMALL_STEP = 512
# CUlimit -> its value in a new context (cuCtxGetLimit; 7, 8 are a CIG context's).
LIMITS = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 32, 6: 0, 7: 0, 8: 0, 9: 1}
HOST_PAGE = 4096  # what cuMemAddressReserve asks of a size and a hint
GRAPH_AUTO_FREE_ON_LAUNCH = 1  # CUgraphInstantiate_flags
NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_EMPTY, NODE_WAIT, NODE_RECORD = 0, 1, 2, 5, 6, 7
NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_CONDITIONAL = 10, 11, 13
# What this process's devices hold is one file (HVGPU_FAKE_DEVICE_WIDE), written by
# the threads of its sessions one at a time.
_PUBLISHING = threading.Lock()


class _Pool:
    """A memory pool: chunks of whole granules, handed out front to back, a chunk
    reused once nothing in it is live, given back by trims and at synchronisations
    beyond the release threshold (as the driver's pools do)."""

    def __init__(self, max_size):
        self.max_size = max_size
        self.chunks: dict[int, list] = {}  # base -> [bytearray, next free offset, live count]
        self.live: dict[int, tuple[int, int]] = {}  # allocation -> (chunk base, bytes)
        self.attrs = {1: 1, 2: 1, 3: 1, 4: 0, 6: 0, 8: 0}

    @property
    def reserved(self):
        return sum(len(c[0]) for c in self.chunks.values())

    @property
    def used(self):
        return sum(n for _, n in self.live.values())

    def trim(self, keep):
        """cuMemPoolTrimTo: unused chunks go while the pool still holds at least
        ``keep`` bytes after each (its promise: never fewer than ``keep`` left)."""
        for base in [b for b, c in self.chunks.items() if not c[2]]:
            if self.reserved - len(self.chunks[base][0]) < keep:
                continue
            del self.chunks[base]

    def release_beyond(self, threshold):
        """At a synchronisation: unused chunks go until the pool holds no more than its
        release threshold."""
        for base in [b for b, c in self.chunks.items() if not c[2]]:
            if self.reserved <= threshold:
                break
            del self.chunks[base]


def _saxpy(dev, a, x, y, n):
    xs = dev.array(x, n, np.float32)
    ys = dev.array(y, n, np.float32)
    ys[:] = a * xs + ys


def _matmul(dev, a, b, c, n):
    A = dev.array(a, n * n, np.float32).reshape(n, n)
    B = dev.array(b, n * n, np.float32).reshape(n, n)
    dev.array(c, n * n, np.float32).reshape(n, n)[:] = A @ B


def _tex_copy(dev, tex, out, n):
    """Reads n floats through texture object ``tex`` (its first bytes, row-major) into out:
    what a kernel given the object's value as its parameter can reach."""
    dev.array(out, n, np.float32)[:] = np.frombuffer(dev.texture_bytes(tex, n * 4), np.float32)


def _fault(dev):
    dev.sticky = CudaError(S.ILLEGAL_ADDRESS, "fake kernel accessed an illegal address")


def _sleep(dev, ms):
    time.sleep(ms / 1000)


def _say(dev, value, lines):
    """As a kernel's printf: into the context's buffer, out at the next synchronisation."""
    dev.printf_buffer += b"".join(b"kernel says %d\n" % (value + i) for i in range(lines))


def _countdown(dev, handle, counter, iterations):
    """A WHILE body's kernel: one more iteration, one less to go; the loop goes on while
    any are left (cudaGraphSetConditional)."""
    c = dev.array(counter, 1, np.int32)
    c[0] -= 1
    dev.array(iterations, 1, np.int32)[0] += 1
    dev.conditionals[handle].value = int(c[0] > 0)


def _set_if(dev, handle, flag):
    """Sets an IF node's condition from the int at flag (cudaGraphSetConditional)."""
    dev.conditionals[handle].value = int(dev.array(flag, 1, np.int32)[0] != 0)


def _add_one(dev, p):
    dev.array(p, 1, np.uint32)[0] += 1


def _set_seven(dev, p):
    dev.array(p, 1, np.uint32)[0] = 7


# name -> (parameter layout as cuFuncGetParamInfo gives it, struct format, body)
KERNELS = {
    "saxpy": ([(0, 4), (8, 8), (16, 8), (24, 4)], "<f4xQQi", _saxpy),
    "matmul": ([(0, 8), (8, 8), (16, 8), (24, 4)], "<QQQi", _matmul),
    "noop": ([], "", lambda dev: None),
    "fault": ([], "", _fault),
    "sleep_ms": ([(0, 4)], "<i", _sleep),
    "say": ([(0, 4), (4, 4)], "<ii", _say),  # printf: value, lines
    "burn": ([(0, 8), (8, 4)], "<Qi", lambda dev, out, iters: None),  # bench/multi_tenant.py
    "clustered": ([], "", lambda dev: None),  # its cluster shape was fixed when compiled
    "tex_copy": ([(0, 8), (8, 8), (16, 4)], "<QQi", _tex_copy),
    "countdown": ([(0, 8), (8, 8), (16, 8)], "<QQQ", _countdown),
    "set_if": ([(0, 8), (8, 8)], "<QQ", _set_if),
    "add_one": ([(0, 8)], "<Q", _add_one),  # cuda/enumerate_functions.c
    "set_seven": ([(0, 8)], "<Q", _set_seven),
}

# CUfunction_attribute 0..15 (cuda.h 13.0): what cuFuncGetAttribute answers for a kernel
# before any cuFuncSetAttribute; a kernel's entry in KERNEL_ATTRIBUTES changes some of them.
_SHARED_PER_BLOCK, _SHARED_PER_SM = 49152, 233472
FUNC_ATTRIBUTES = {0: 1024, 1: 0, 2: 0, 3: 0, 4: 32, 5: 90, 6: 90, 7: 0, 8: _SHARED_PER_BLOCK,
                   9: -1, 10: 0, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}
KERNEL_ATTRIBUTES = {"matmul": {1: 8192, 4: 64, 8: _SHARED_PER_BLOCK - 8192},
                     "noop": {4: 8}, "clustered": {11: 2, 12: 1, 13: 1}}
_SETTABLE = range(8, 16)  # the rest are read-only (CUDA_ERROR_INVALID_VALUE)


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


# The driver's C signatures, for the session's C loop (launch_burst.c).
_P, _U64, _SIZE = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
_EXTRA = ctypes.POINTER(ctypes.c_void_p)
C_SIGNATURES = {
    "cuLaunchKernel": (_P, *[ctypes.c_uint] * 7, _P, _P, _EXTRA),
    "cuLaunchKernelEx": (ctypes.POINTER(LaunchConfig), _P, _P, _EXTRA),
    "cuEventRecord": (_P, _P),
    "cuStreamWaitEvent": (_P, _P, ctypes.c_uint),
    "cuEventSynchronize": (_P,),
    "cuMemsetD8Async": (_U64, ctypes.c_ubyte, _SIZE, _P),
    "cuMemsetD16Async": (_U64, ctypes.c_ushort, _SIZE, _P),
    "cuMemsetD32Async": (_U64, ctypes.c_uint, _SIZE, _P),
    "cuMemcpyDtoDAsync": (_U64, _U64, _SIZE, _P),
    "cuMemcpyHtoDAsync": (_U64, _P, _SIZE, _P),
}


def extra_params(extra) -> bytes:
    """The parameter buffer of a launch's `extra` array ({BUFFER_POINTER, p, BUFFER_SIZE,
    &size, END}), or b"" for none."""
    if not extra:
        return b""
    assert (extra[0], extra[2], extra[4]) == (1, 2, None)
    return ctypes.string_at(extra[1], ctypes.c_size_t.from_address(extra[3]).value)


class Event:
    """A fake CUDA event: when it was last recorded, and the capture it was last
    recorded in (a stream that waits for it joins that capture)."""

    __slots__ = ("t", "capture", "timing")

    def __init__(self, timing: bool = True):
        self.t = None
        self.capture = None
        self.timing = timing  # False: created with CU_EVENT_DISABLE_TIMING


class Capture:
    """A stream capture under way: the work its streams were given, in order (a valid
    order of the graph the driver would build), into ``graph``."""

    def __init__(self, cid: int, origin, mode: int):
        self.id, self.origin, self.mode = cid, origin, mode
        self.graph = Graph()
        self.failed: CudaError | None = None


class Graph:
    """What a capture recorded: callables that do the work again."""

    def __init__(self):
        self.ops: list = []
        self.kernels: set[int] = set()  # which of the ops are kernel nodes
        self.destroyed = False
        self._nodes: list = []
        self.origin: "Graph | None" = None  # the graph this one is a clone of
        self.conditionals: list = []  # handles made for it, set to their default at launch
        self.mem_allocs: list[int] = []  # addresses its allocation nodes returned
        self.mem_frees: list[int] = []  # addresses its free nodes free
        self.execs = 0  # instantiations of it not destroyed

    def node(self, i: int) -> "Node":
        """The node of the i-th recorded work: the same object each time, as the
        driver's CUgraphNode is."""
        while len(self._nodes) <= i:
            self._nodes.append(Node(len(self._nodes), self))
        return self._nodes[i]


class Conditional:
    """A conditional handle: its value, and what a launch sets it to first (if anything)."""

    def __init__(self, default: int, flags: int):
        self.value = default
        self.default = default if flags & 1 else None


class GraphExec:
    def __init__(self, graph: Graph, flags: int = 0):
        self.graph = graph
        self.allocs, self.frees = list(graph.mem_allocs), list(graph.mem_frees)
        self.auto_free = bool(flags & GRAPH_AUTO_FREE_ON_LAUNCH)
        self.conditionals = list(graph.conditionals)
        self.ops = list(graph.ops)
        self.kernels = set(graph.kernels)
        self.destroyed = False
        self.launches = 0


class Node:
    """The dependency a capture query names: the last work recorded so far. ``kind`` is
    its CUgraphNodeType where it was said (nodes added by hand, memory nodes); ``mem``
    an allocation node's (address, bytes) or a free node's address."""

    def __init__(self, index: int, graph: "Graph | None" = None):
        self.index = index
        self.graph = graph
        self.kind: int | None = None
        self.mem = None


# CUarray_format -> bytes of a channel, as the driver knows them
ARRAY_FORMATS = {0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4}
ARRAY_LAYERED, ARRAY_SURFACE_LDST, ARRAY_CUBEMAP = 0x01, 0x02, 0x04
FIRST_TEXTURE = 0x1000  # the double's texture and surface object values count from here


class FakeArray:
    """A CUDA array: its rows packed (the driver's layout is its own; copies and
    textures see rows of width * element bytes), height and depth at least 1."""

    def __init__(self, width, height, depth, fmt, channels, flags):
        self.desc = (width, height, depth, fmt, channels, flags)
        self.row = width * ARRAY_FORMATS[fmt] * channels
        self.rows, self.slices = max(height, 1), max(depth, 1)
        self.data = bytearray(self.row * self.rows * self.slices)


def _array_extent(width, height, depth, fmt, channels, flags):
    """The driver's refusals of a descriptor (CUDA_ERROR_INVALID_VALUE)."""
    if fmt not in ARRAY_FORMATS or channels not in (1, 2, 4) or not width:
        raise CudaError(S.INVALID_VALUE, f"fake cuArray3DCreate: {width}x{height}x{depth}, "
                                         f"format 0x{fmt:x}, {channels} channels")
    layers_ok = depth % 6 == 0 and depth if flags & ARRAY_LAYERED else depth == 6
    if flags & ARRAY_CUBEMAP and (width != height or not layers_ok):
        raise CudaError(S.INVALID_VALUE, "fake cuArray3DCreate: a cubemap is square, 6 deep")
    if max(width, height, depth) > 1 << 16:
        raise CudaError(S.INVALID_VALUE, "fake cuArray3DCreate: past the device's limits")


class FakeDevice:
    caps = 3

    def __init__(self, ordinal: int = 0, address_window: int = 0):
        if ordinal != 0:
            raise CudaError(S.INVALID_DEVICE, f"fake host has one GPU, not {ordinal}")
        self.mem: dict[int, bytearray] = {}
        self.taken: dict[int, int] = {}  # allocation -> what it takes of free memory
        self.alloc_bytes = 0  # their sum
        # as CudaDevice: vGPU N >= 1 of a VM allocates in its own address window
        self.next = 0x6000_0000_0000 + (address_window - 1) * (1 << 40) if address_window \
            else BASE
        self.window = address_window
        self.pinned: dict[int, ctypes.Array] = {}
        self.module_bytes: dict[int, int] = {}  # module -> what its arrays take
        self.variables: dict[int, list] = {}  # a module array's address -> [size, memory]
        self.registered: dict[int, int] = {}  # host_register: address -> bytes
        # ... of those, device-mapped (CU_MEMHOSTREGISTER_DEVICEMAP): a kernel reaches
        # them at their host address, as the driver maps them under unified addressing
        self.host_mapped: dict[int, int] = {}
        # streams held by a cuStreamWaitValue not yet satisfied -> (its condition, the
        # work queued behind it), run once another stream's work satisfies it
        self.waiting: dict = {}
        self.memops: list[tuple] = []  # (call, ops, flags) of each stream_memops
        self.pinned_peak = 0  # the most bytes host_alloc had handed out at once
        self.sticky: CudaError | None = None
        self.printf_buffer = b""  # what kernels printed, written out at a synchronisation
        self.allocated = 0
        self.freed = 0
        self.launches = 0
        self.c_launches = 0  # of those, launched by the session's C loop
        self.c_calls: dict[str, int] = {}  # driver entry point -> calls the C loop made
        self.launch_ex_attrs: list[bytes] = []  # each cuLaunchKernelEx's attributes
        self._entries = None  # name -> (address, the callback that keeps it alive)
        self._values: dict = {}  # handle -> its C value, and back
        self.func_attrs: dict = {}  # function -> its attributes, with what was set
        self.cache_configs: dict = {}  # function -> its cuFuncSetCacheConfig preference
        self._handles: dict = {}
        self.reservations: dict[int, int] = {}  # start -> size
        self.physical: dict[int, bytearray] = {}  # id -> memory of a cuMemCreate
        self.compressed: set[int] = set()  # ids of compressible physical memory
        self.mapped: dict[int, list] = {}  # start -> [size, memory, offset, access flags]
        self.pools: dict[int, _Pool] = {}
        self.captures: dict = {}  # stream -> the Capture it records into
        self.blocking: set = set()  # streams created without CU_STREAM_NON_BLOCKING
        self.stream_attrs: dict = {}  # stream -> {launch attribute id: its 64-byte value}
        self.capture_ids = 0
        self.graph_launches = 0
        self.graphs_alive = 0  # graphs and instantiations not destroyed
        self.conditionals: dict[int, Conditional] = {}  # handle value -> its condition
        self.graph_bytes = 0  # device memory instantiations took (exec_bytes each)
        self.exec_bytes = GRAPH_EXEC_BYTES
        self.events_destroyed = 0
        self.modules_unloaded = 0
        self.arrays: dict[int, FakeArray] = {}  # id -> a live array (mipmap levels too)
        self.array_taken: dict[int, int] = {}  # array or mipmapped array id -> bytes taken
        self.textures: dict[int, tuple] = {}  # value -> (bytes of its resource: fn(n))
        self.surfaces: dict[int, FakeArray] = {}
        self.object_values = FIRST_TEXTURE
        self.limits = dict(LIMITS)  # CUlimit -> its value in this context
        self.limit_bytes = 0  # what limits above their defaults reserve
        # Graph memory: the allocations launches made live (address -> memory), and the
        # physical memory the graph pool holds for them (granules), kept until a trim, as
        # the driver's pool keeps it for the next launch.
        self.graph_live: dict[int, bytearray] = {}
        self.graph_reserved = 0
        self.graph_high = [0, 0]  # USED_MEM_HIGH, RESERVED_MEM_HIGH
        self._graph_vas: dict[int, int] = {}  # address -> bytes of each allocation node

    def _on(self, stream, work) -> None:
        """Run work now, or record it into the capture its stream is in; behind a
        wait for a value, queue it until the value is there."""
        capture = self.captures.get(stream)
        if capture is not None:
            capture.graph.ops.append(work)
        elif stream in self.waiting:
            self.waiting[stream][1].append(work)
        else:
            work()
            if self.waiting:
                self._wake()

    def _wake(self) -> None:
        """Streams whose wait is satisfied now run what queued behind it, in order."""
        woke = True
        while woke:
            woke = False
            for stream, (ready, queued) in list(self.waiting.items()):
                if ready():
                    del self.waiting[stream]
                    woke = True
                    for work in queued:
                        self._on(stream, work)

    # -- helpers for kernels -------------------------------------------------

    def _piece(self, ptr: int) -> tuple[bytearray, int, int]:
        """The memory at ptr: (buffer, offset in it, bytes from there to its end)."""
        for base, buf in self.mem.items():
            if base <= ptr < base + len(buf):
                return buf, ptr - base, base + len(buf) - ptr
        for pool in self.pools.values():
            for base, (buf, _, _) in pool.chunks.items():
                if base <= ptr < base + len(buf):
                    return buf, ptr - base, base + len(buf) - ptr
        for base, buf in self.graph_live.items():
            if base <= ptr < base + len(buf):
                return buf, ptr - base, base + len(buf) - ptr
        for base, entry in self.variables.items():
            if base <= ptr < base + entry[0]:
                if entry[1] is None:  # backed once used: most are never touched here
                    entry[1] = bytearray(entry[0])
                return entry[1], ptr - base, base + entry[0] - ptr
        for base, (size, buf, offset, access) in self.mapped.items():
            if base <= ptr < base + size:
                if access != 3:
                    raise CudaError(S.INVALID_VALUE,
                                    f"fake: 0x{ptr:x} is mapped without read-write access")
                return buf, offset + ptr - base, base + size - ptr
        for base, size in self.host_mapped.items():  # the host's bytes themselves
            if base <= ptr < base + size:
                return (ctypes.c_char * size).from_address(base), ptr - base, base + size - ptr
        raise CudaError(S.ILLEGAL_ADDRESS, f"fake: 0x{ptr:x} is not device memory")

    def _find(self, ptr: int, n: int) -> tuple[bytearray, int]:
        buf, off, room = self._piece(ptr)
        if n > room:
            raise CudaError(S.ILLEGAL_ADDRESS, f"fake: 0x{ptr:x}+{n} is not device memory")
        return buf, off

    def _pieces(self, ptr: int, n: int) -> list:
        """(buffer, offset, length) pieces of [ptr, ptr + n): neighbouring mappings are
        one range of addresses, as on the GPU."""
        pieces = []
        while n:
            buf, off, room = self._piece(ptr)
            k = min(n, room)
            pieces.append((buf, off, k))
            ptr, n = ptr + k, n - k
        return pieces

    def _load(self, ptr: int, n: int) -> bytes:
        return b"".join(bytes(buf[off:off + k]) for buf, off, k in self._pieces(ptr, n))

    def _store(self, ptr: int, data: bytes) -> None:
        at = 0
        for buf, off, k in self._pieces(ptr, len(data)):
            buf[off:off + k] = data[at:at + k]
            at += k

    def array(self, ptr: int, count: int, dtype) -> np.ndarray:
        nbytes = count * np.dtype(dtype).itemsize
        buf, off = self._find(ptr, nbytes)
        return np.frombuffer(buf, dtype=dtype, count=count, offset=off)

    def _check(self) -> None:
        if self.sticky is not None:
            raise self.sticky

    # -- GpuDevice -----------------------------------------------------------

    def bind_thread(self):
        pass

    def driver_version(self):
        return 13000

    def attribute(self, attrib):
        values = {1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2147483647, 6: 65535, 7: 65535,
                  8: 49152, 10: 32, 16: 4, 39: 2048, 75: 9, 76: 0, 97: 49152,
                  102: 1, 115: 1,  # VMM and memory pools
                  107: 1,  # generic compression, as an H200's
                  109: 134213632,  # the largest access policy window, as an H200's
                  83: 1, 95: 1,  # managed memory, cooperative launches
                  103: 1, 125: 1,  # POSIX fd handles, IPC events: served among a VM's processes
                  # mapped host memory at the host's address (unified addressing), stream
                  # memory operations of the v2 API (64 bits, NOR), not the v1's or flushes
                  19: 1, 41: 1, 91: 1, 92: 0, 93: 0, 94: 0, 98: 0, 122: 1, 123: 1,
                  119: 9}  # pools' handle types: POSIX fd and fabric, as an H200's
        if os.environ.get("HVGPU_FAKE_H200"):  # an H200's answers, for probing libraries
            values.update({12: 65536, 16: 132, 13: 1980000, 36: 3201000, 37: 6144, 38: 62914560,
                           81: 233472, 82: 65536, 97: 232448, 106: 32, 111: 1024, 120: 1,
                           127: 1, 41: 1, 33: 1, 14: 512, 9: 65536, 15: 1, 31: 1})
        if attrib not in values:
            raise CudaError(S.INVALID_VALUE, f"fake: unknown attribute {attrib}")
        return values[attrib]

    def name(self):
        return "hvgpu fake GPU"

    def uuid(self):
        return bytes(range(16))

    def total_mem(self):
        return TOTAL

    def ctx_limit(self, limit):
        if limit not in self.limits:
            raise CudaError(S.INVALID_VALUE, f"fake: unknown limit {limit}")
        return self.limits[limit]

    def _limit_bytes(self, limits) -> int:
        """What the limits reserve of device memory beyond the defaults: a stack for every
        thread that can be resident (2048 on each of the SMs), the printf FIFO, the heap."""
        threads = 2048 * self.attribute(16)
        return (max(0, limits[0] - LIMITS[0]) * threads + max(0, limits[1] - LIMITS[1])
                + max(0, limits[2] - LIMITS[2]))

    def ctx_set_limit(self, limit, value):
        self._check()
        if limit in (7, 8):  # CIG's: they can only be queried
            raise CudaError(S.UNSUPPORTED_LIMIT, f"fake: limit {limit} cannot be set")
        if limit not in self.limits:
            raise CudaError(S.INVALID_VALUE, f"fake: unknown limit {limit}")
        if limit == 5 and value not in (0, 32, 64, 128):
            raise CudaError(S.INVALID_VALUE, "fake: an L2 fetch granularity of 0..128")
        changed = {**self.limits, limit: value}
        if limit == 0:  # the driver rounds a stack up to 16 bytes
            changed[0] = -(-value // 16) * 16
        if self._used() - self.limit_bytes + self._limit_bytes(changed) > TOTAL:
            raise CudaError(S.OUT_OF_MEMORY, f"fake: limit {limit} = {value} does not fit")
        self.limits = changed
        self.limit_bytes = self._limit_bytes(changed)
        self._publish()

    def _used(self):
        return (self.alloc_bytes + sum(self.module_bytes.values()) + self.limit_bytes
                + sum(self.array_taken.values())
                + self.graph_bytes
                + sum(len(b) for b in self.physical.values())
                + sum(p.reserved for p in self.pools.values())
                + self.graph_reserved)

    def mem_info(self):
        return TOTAL - self._used() - self._others_used(), TOTAL

    def _publish(self):
        shared = os.environ.get("HVGPU_FAKE_DEVICE_WIDE")
        if shared:
            path = os.path.join(shared, str(os.getpid()))
            new = f"{path}.{threading.get_ident()}.new"  # sessions publish from their threads
            # Figured and put in place as one step: a session whose figure was taken
            # before another's release must not put it in place after that release's.
            with _PUBLISHING:
                with open(new, "w") as f:
                    f.write(str(self._used()))
                os.replace(new, path)

    def _others_used(self):
        shared = os.environ.get("HVGPU_FAKE_DEVICE_WIDE")
        if not shared:
            return 0
        total = 0
        for name in os.listdir(shared):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    with open(os.path.join(shared, name)) as f:
                        total += int(f.read() or 0)
                except (OSError, ValueError):
                    pass  # being replaced: the next reading has it
        return total

    def footprint(self, size):
        """What an allocation of ``size`` bytes takes of this double's free memory: the
        model above, its own (the product's is cuda_device.driver_footprint; the contract
        suite holds both to the driver). A vGPU's address window maps whole pages."""
        if self.window or size > SMALL_ALLOCATION:
            return -(-max(size, 1) // GRANULARITY) * GRANULARITY
        bins = SMALL_STEP  # small ones take the smallest bin that holds them, bins doubling
        while bins < size:
            bins *= 2
        return bins

    def mem_alloc(self, size):
        self._check()  # after a kernel's fault, as every call of the driver's
        if size == 0:  # as cuMemAlloc documents
            raise CudaError(S.INVALID_VALUE, "fake cuMemAlloc: 0 bytes")
        taken = self.footprint(size)
        if self._used() + taken > TOTAL:
            raise CudaError(S.OUT_OF_MEMORY, f"fake: {size} bytes do not fit")
        # a window maps whole pages; larger allocations take whole pages of their own,
        # which the driver hands out page-aligned
        align = GRANULARITY if self.window or size > SMALL_ALLOCATION else 256
        ptr = -(-self.next // align) * align
        self.next = ptr + taken + 256  # a gap: no allocation touches the next
        self.mem[ptr] = bytearray(size)
        self.taken[ptr] = taken
        self.alloc_bytes += taken
        self.allocated += 1
        self._publish()
        return ptr

    def mem_free(self, dptr):
        if dptr in self.graph_live:  # a graph's allocation, freed outside the graph
            del self.graph_live[dptr]
            return
        if dptr not in self.mem:
            raise CudaError(S.INVALID_VALUE, "fake: not allocated")
        del self.mem[dptr]
        self.alloc_bytes -= self.taken.pop(dptr)
        self.freed += 1
        self._publish()

    # -- virtual memory management ---------------------------------------------

    def mem_granularity(self, option, compression=0):
        if compression not in (0, 1):
            raise CudaError(S.INVALID_VALUE, f"fake: compression type {compression}")
        return GRANULARITY

    def _reserved(self, ptr, size):
        return any(s <= ptr and ptr + size <= s + n for s, n in self.reservations.items())

    def address_reserve(self, size, alignment, hint):
        # whole granules: the H200's driver refused granularity + 4096 bytes
        if not size or size % GRANULARITY or hint % HOST_PAGE or alignment & (alignment - 1):
            raise CudaError(S.INVALID_VALUE, "fake cuMemAddressReserve: the size is whole "
                            "granules, the hint whole host pages, the alignment a power of two "
                            "or 0")
        align = max(alignment, GRANULARITY)
        start = -(-self.next // align) * align
        self.next = start + size + GRANULARITY  # a gap: no range touches the next
        self.reservations[start] = size
        return start

    def address_free(self, ptr, size):
        if self.reservations.get(ptr) != size:
            raise CudaError(S.INVALID_VALUE, "fake: not a reservation")
        if any(ptr <= m < ptr + size for m in self.mapped):
            raise CudaError(S.INVALID_VALUE, "fake: memory is still mapped there")
        del self.reservations[ptr]

    def mem_create(self, size, compression=0):
        if compression not in (0, 1):
            raise CudaError(S.INVALID_VALUE, f"fake: compression type {compression}")
        if not size or size % GRANULARITY:
            raise CudaError(S.INVALID_VALUE, "fake: size is not a multiple of the granularity")
        if self._used() + size > TOTAL:
            raise CudaError(S.OUT_OF_MEMORY, f"fake: {size} bytes do not fit")
        buf = bytearray(size)
        self.physical[id(buf)] = buf
        if compression and self.attribute(107):  # granted where the device compresses
            self.compressed.add(id(buf))
        self._publish()
        return id(buf)

    def mem_compression(self, handle):
        if handle not in self.physical:
            raise CudaError(S.INVALID_VALUE, "fake: not a handle of cuMemCreate")
        return 1 if handle in self.compressed else 0

    def mem_release(self, handle):
        if any(m[1] is self.physical.get(handle) for m in self.mapped.values()):
            raise CudaError(S.INVALID_VALUE, "fake: the session releases only memory nothing maps")
        del self.physical[handle]
        self.compressed.discard(handle)
        self._publish()

    def mem_map(self, ptr, size, offset, handle):
        if ptr % GRANULARITY:  # as the H200's driver answers it
            raise CudaError(S.NOT_SUPPORTED, "fake cuMemMap: an address inside a granule")
        if not size or (size | offset) % GRANULARITY:
            raise CudaError(S.INVALID_VALUE, "fake cuMemMap: the address, size and offset are "
                                             "whole granules")
        if not self._reserved(ptr, size):
            raise CudaError(S.INVALID_VALUE, "fake: not inside a reservation")
        if any(s < ptr + size and ptr < s + m[0] for s, m in self.mapped.items()):
            raise CudaError(S.INVALID_VALUE, "fake: already mapped")
        if offset + size > len(self.physical[handle]):
            raise CudaError(S.INVALID_VALUE, "fake: past the end of the allocation")
        self.mapped[ptr] = [size, self.physical[handle], offset, 0]

    def _mappings(self, ptr, size):
        starts = sorted(s for s in self.mapped if ptr <= s < ptr + size)
        at = ptr
        for s in starts:
            if s != at:
                break
            at += self.mapped[s][0]
        if not starts or at != ptr + size:
            raise CudaError(S.INVALID_VALUE, "fake: not a range of whole mappings")
        return starts

    def mem_unmap(self, ptr, size):
        for s in self._mappings(ptr, size):
            del self.mapped[s]

    def mem_set_access(self, ptr, size, flags):
        for s in self._mappings(ptr, size):
            self.mapped[s][3] = flags

    def mem_get_access(self, ptr):
        for s, m in self.mapped.items():
            if s <= ptr < s + m[0]:
                return m[3]
        raise CudaError(S.INVALID_VALUE, "fake: not mapped")

    # -- stream-ordered allocation -----------------------------------------------

    def pool_create(self, max_size):
        pool = _Pool(max_size)
        self.pools[id(pool)] = pool
        return pool

    def pool_destroy(self, pool):
        if pool.live:
            raise CudaError(S.INVALID_VALUE,
                            "fake: the session destroys only pools with nothing allocated")
        del self.pools[id(pool)]
        self._publish()

    def pool_alloc(self, size, pool, stream):
        self._check()
        capture = self.captures.get(stream)
        if capture is not None:  # as the driver: an allocation node of the capture's graph
            if capture.failed is not None:
                raise CudaError(S.STREAM_CAPTURE_INVALIDATED, "fake: the capture failed")
            node = self._mem_alloc_node(capture.graph, size)
            return node.mem[0]
        n = -(-size // POOL_STEP) * POOL_STEP
        for base, chunk in pool.chunks.items():
            if chunk[1] + n <= len(chunk[0]):
                break
        else:
            grow = -(-n // GRANULARITY) * GRANULARITY
            if self._used() + grow > TOTAL or (pool.max_size
                                               and pool.reserved + grow > pool.max_size):
                raise CudaError(S.OUT_OF_MEMORY, f"fake: a pool cannot grow by {grow} bytes")
            base = self.next
            self.next += grow + GRANULARITY
            chunk = pool.chunks[base] = [bytearray(grow), 0, 0]
            self._publish()
        ptr = base + chunk[1]
        chunk[1] += n
        chunk[2] += 1
        pool.live[ptr] = (base, n)
        pool.attrs[6] = max(pool.attrs[6], pool.reserved)
        pool.attrs[8] = max(pool.attrs[8], pool.used)
        return ptr

    def pool_free(self, ptr, stream):
        capture = self.captures.get(stream)
        if capture is not None and self._graph_va(ptr):  # a free node of the capture's graph
            if capture.failed is not None:
                raise CudaError(S.STREAM_CAPTURE_INVALIDATED, "fake: the capture failed")
            self._mem_free_node(capture.graph, ptr)
            return
        if ptr in self.graph_live:
            del self.graph_live[ptr]
            return
        for pool in self.pools.values():
            if ptr in pool.live:
                base, _ = pool.live.pop(ptr)
                chunk = pool.chunks[base]
                chunk[2] -= 1
                if not chunk[2]:
                    chunk[1] = 0  # reused from the front once nothing in it is live
                return
        raise CudaError(S.INVALID_VALUE, "fake: not a pool allocation")

    def pool_attribute(self, pool, attrib):
        if attrib == 5:
            return pool.reserved
        if attrib == 7:
            return pool.used
        return pool.attrs[attrib]

    def pool_set_attribute(self, pool, attrib, value):
        if attrib in (6, 8):  # a high mark reset (to 0) starts again from what is held now
            value = pool.reserved if attrib == 6 else pool.used
        pool.attrs[attrib] = value

    def pool_trim(self, pool, keep):
        pool.trim(keep)
        self._publish()

    def _synchronized(self):
        """The driver gives pool memory back beyond each pool's release threshold, and
        writes what kernels printed to the process's standard output."""
        out = self.printf_buffer
        if out:
            self.printf_buffer = b""
            while out:
                out = out[os.write(1, out):]
        for pool in self.pools.values():
            pool.release_beyond(pool.attrs[4])
        self._publish()

    def host_alloc(self, size):
        buf = (ctypes.c_char * size)()
        addr = ctypes.addressof(buf)
        self.pinned[addr] = buf
        self.pinned_peak = max(self.pinned_peak, sum(len(b) for b in self.pinned.values()))
        return addr, memoryview(buf).cast("B")

    def host_free(self, addr):
        self.pinned.pop(addr)

    def host_register(self, addr, size, flags=1):
        self._check()
        if any(a <= addr < a + n or addr <= a < addr + size
               for a, n in self.registered.items()):
            raise CudaError(S.HOST_MEMORY_ALREADY_REGISTERED,
                            "cuMemHostRegister: already registered")
        self.registered[addr] = size
        if flags & 2:  # CU_MEMHOSTREGISTER_DEVICEMAP
            self.host_mapped[addr] = size

    def host_unregister(self, addr):
        if self.registered.pop(addr, None) is None:
            raise CudaError(S.HOST_MEMORY_NOT_REGISTERED, "cuMemHostUnregister: not registered")
        self.host_mapped.pop(addr, None)

    def host_device_pointer(self, addr):
        if any(a <= addr < a + n for a, n in self.host_mapped.items()):
            return addr  # unified addressing: the host's own address
        raise CudaError(S.INVALID_VALUE, "fake cuMemHostGetDevicePointer: not device-mapped "
                                         "registered memory")

    def stream(self, special):
        return ("stream", special)

    def _copy_range(self, ptr: int, n: int, what: str) -> None:
        """A copy's or memset's device range, checked when it is asked for, as the
        driver checks it: one that runs into addresses nothing is mapped at is
        CUDA_ERROR_INVALID_VALUE at the call (measured on the H200), not a fault later."""
        if not n:
            return
        if self.captures and any(b <= ptr and ptr + n <= b + m
                                 for b, m in self._graph_vas.items()):
            return  # a graph allocation's addresses, which a capture's later work may name
        try:
            self._pieces(ptr, n)
        except CudaError as exc:
            raise CudaError(S.INVALID_VALUE, f"fake {what}: {exc.detail}") from None

    def memcpy_htod_async(self, dst, src_addr, n, stream):
        self._check()
        self._copy_range(dst, n, "cuMemcpyHtoDAsync")
        # captured: the host memory is read when the graph runs, as the driver does
        self._on(stream, lambda: self._store(dst, ctypes.string_at(src_addr, n)))

    def memcpy_dtoh_async(self, dst_addr, src, n, stream):
        self._check()
        self._copy_range(src, n, "cuMemcpyDtoHAsync")
        self._on(stream, lambda: ctypes.memmove(dst_addr, self._load(src, n), n))

    def memcpy_dtod_async(self, dst, src, n, stream):
        self._check()
        self._copy_range(src, n, "cuMemcpyDtoDAsync")
        self._copy_range(dst, n, "cuMemcpyDtoDAsync")
        self._on(stream, lambda: self._store(dst, self._load(src, n)))

    def memset_async(self, dst, value, width, count, stream):
        self._check()
        fmt = {1: "B", 2: "H", 4: "I"}[width]
        self._copy_range(dst, count * width, "cuMemsetAsync")
        # cuMemsetD8/D16 take an unsigned char/short: C keeps the value's low bytes
        value &= (1 << 8 * width) - 1
        self._on(stream, lambda: self._store(dst, struct.pack("<" + fmt, value) * count))

    def module_load(self, image):
        image = bytes(image)
        if os.environ.get("HVGPU_FAKE_LOAD_SECONDS"):
            time.sleep(float(os.environ["HVGPU_FAKE_LOAD_SECONDS"]))
        if image[:4] in (b"\x7fELF", b"\x50\xed\x55\xba"):  # cubin / fatbin from nvcc
            names = {k for k in KERNELS if k.encode() + b"\0" in image}
            if os.environ.get("HVGPU_FAKE_ANY_KERNEL"):  # probing which driver calls a
                # library makes: its kernels do nothing; a cubin's are named by its sections
                found = {m.decode() for m in re.findall(rb"\.text\.([A-Za-z_][\w$]*)", image)}
                return {"names": names, "any": True, "listed": sorted(names | found)}
            if not names:
                raise CudaError(S.INVALID_IMAGE,
                                "fake: no kernel this double knows is in the image")
            return {"names": names}
        text = image.decode(errors="replace")
        if "__global__" not in text and ".entry" not in text:  # to the driver, PTX that
            raise CudaError(S.INVALID_IMAGE, "fake: not a module image")  # does not compile
        module = {"names": set(re.findall(r"(?:void|\.entry)\s+(\w+)\s*\(", text)),
                  "globals": {}}
        # Arrays (CUDA C++ __device__ ones, PTX .global ones) take device memory at load,
        # as the driver's do: their size, at an address of their own, backed on first use.
        sizes = {"char": 1, "int": 4, "float": 4, "double": 8}
        arrays = {name: sizes[t] * int(n) for t, name, n in re.findall(
            r"__device__\s+(char|int|float|double)\s+(\w+)\s*\[\s*(\d+)\s*\]", text)}
        arrays.update({name: int(bits) // 8 * int(n) for bits, name, n in re.findall(
            r"\.global\s+(?:\.align\s+\d+\s+)?\.[bsuf](8|16|32|64)\s+(\w+)\s*\[\s*(\d+)\s*\]",
            text)})
        taken = sum(arrays.values())
        if taken:
            if self._used() + taken > TOTAL:
                raise CudaError(S.OUT_OF_MEMORY,
                                f"fake: module variables of {taken} bytes do not fit")
            self.module_bytes[id(module)] = taken
        for name, n in arrays.items():
            ptr = -(-self.next // 256) * 256
            self.next = ptr + n + 256
            module["globals"][name] = (ptr, n)
            self.variables[ptr] = [n, None]
        self._publish()
        return module

    def link(self, options, inputs, log_size):
        """A cubin this double loads (its kernels' names after an ELF magic) from PTX and
        cubin inputs; PTX without an entry or a version is what the driver's JIT refuses
        (CUDA_ERROR_INVALID_PTX, with an error log)."""
        names = []
        for kind, name, data in inputs:
            data = bytes(data)
            if kind == 1:  # PTX
                text = data.decode(errors="replace")
                if ".version" not in text or "ret;" not in text:  # stands in for ptxas's syntax
                    return (S.INVALID_PTX, b"", "", f"ptxas fatal   : {name or 'input'}: "
                            "not PTX (fake)", 0.0)
                names += re.findall(r"\.entry\s+(\w+)\s*\(", text)
            elif data[:4] == b"\x7fELF":
                names += [k for k in KERNELS if k.encode() + b"\0" in data]
            else:
                return S.INVALID_IMAGE, b"", "", "fake: not an image this double links", 0.0
        verbose = dict(options).get(12)
        info = "".join(f"ptxas info    : Compiling entry function '{n}' (fake)\n"
                       for n in names) if verbose else ""
        # an ELF64 header whose section table offset is the image's end (how far a
        # reader of cubins takes it), then the kernels' names
        body = b"".join(n.encode() + b"\0" for n in names)
        header = bytearray(64)
        header[:5] = b"\x7fELF\x02"
        struct.pack_into("<Q", header, 0x28, 64 + len(body))
        return 0, bytes(header) + body, info[:log_size - 1], "", 0.25

    def module_global(self, module, name):
        if module.get("any"):
            return self.mem_alloc(256), 256
        found = module.get("globals", {}).get(name)
        if found is None:
            raise CudaError(S.NOT_FOUND, f"fake: no variable named {name!r}")
        return found

    @staticmethod
    def _compiled(function) -> dict:
        name = function[1] if isinstance(function, tuple) else function
        return {**FUNC_ATTRIBUTES, **KERNEL_ATTRIBUTES.get(name, {})}

    def _func_attrs(self, function) -> dict:
        attrs = self.func_attrs.get(function)
        if attrs is None:
            attrs = self.func_attrs[function] = self._compiled(function)
        return attrs

    def func_attribute(self, function, attrib):
        attrs = self._func_attrs(function)
        if attrib not in attrs:
            raise CudaError(S.INVALID_VALUE, f"fake: unknown function attribute {attrib}")
        return attrs[attrib]

    def func_set_attribute(self, function, attrib, value):
        """As cuFuncSetAttribute documents it (cuda.h 13.0)."""
        attrs = self._func_attrs(function)
        if attrib not in _SETTABLE:
            raise CudaError(S.INVALID_VALUE, f"fake: function attribute {attrib} cannot be set")
        if attrib == 8 and not 0 <= value <= self.attribute(97) - attrs[1]:  # the opt-in limit
            raise CudaError(S.INVALID_VALUE,
                            f"fake: {value} bytes of dynamic shared memory do not fit")
        if attrib == 9 and not -1 <= value <= 100:
            raise CudaError(S.INVALID_VALUE, f"fake: carveout {value} is not a percentage")
        if attrib in (11, 12, 13) and self._compiled(function)[attrib]:
            raise CudaError(S.NOT_PERMITTED,
                            "fake: the cluster shape was set when the kernel was compiled")
        if attrib in (11, 12, 13) and value < 0 or attrib in (10, 14) and value not in (0, 1) \
                or attrib == 15 and value not in (0, 1, 2):
            raise CudaError(S.INVALID_VALUE,
                            f"fake: {value} is not a value of function attribute {attrib}")
        attrs[attrib] = value

    def func_set_cache_config(self, function, config):
        if config not in (0, 1, 2, 3):
            raise CudaError(S.INVALID_VALUE, f"fake: unknown cache configuration {config}")
        self.cache_configs[function] = config

    def _shared_per_sm(self, function) -> int:
        carveout = self._func_attrs(function)[9]  # the preference decides the split
        return _SHARED_PER_SM if carveout < 0 else _SHARED_PER_SM * carveout // 100

    def occupancy_max_blocks(self, function, block_size, shared_mem, flags):
        blocks = max(1, 2048 // max(block_size, 1))
        need = shared_mem + self._func_attrs(function)[1]
        return min(blocks, self._shared_per_sm(function) // need) if need else blocks

    def stream_priority_range(self):
        return 0, -5

    def module_unload(self, module):
        self.module_bytes.pop(id(module), None)
        for ptr, _ in module.get("globals", {}).values():
            del self.variables[ptr]
        self.modules_unloaded += 1
        self._publish()

    def module_function(self, module, name):
        self._check()  # after a kernel's fault, as every call of the driver's
        if module.get("any") and name not in KERNELS:
            return ("any", name)
        if name not in module["names"] or name not in KERNELS:
            raise CudaError(S.NOT_FOUND, f"fake: no kernel named {name!r}")
        return name

    def module_function_names(self, module):
        self._check()
        # a PTX module's every entry, a cubin's known ones (any, when probing a library)
        return module.get("listed") or sorted(module["names"])

    def param_layout(self, function):
        return [] if isinstance(function, tuple) else list(KERNELS[function][0])

    def launch(self, function, grid, block, shared_mem, stream, params):
        self._check()
        self.launches += 1
        if isinstance(function, tuple):
            return
        _, fmt, body = KERNELS[function]
        args = struct.unpack(fmt, params) if fmt else ()  # copied now, as the driver does
        self._on(stream, lambda: body(self, *args))
        capture = self.captures.get(stream)
        if capture is not None:
            capture.graph.kernels.add(len(capture.graph.ops) - 1)

    def driver_entries(self):
        if os.environ.get("HVGPU_FAKE_PYTHON_LAUNCH"):
            return {}
        if self._entries is None:
            h = self._handle
            calls = {
                "cuLaunchKernel": lambda fn, gx, gy, gz, bx, by, bz, shared, stream, _, extra:
                    self._c_launch(h(fn), (gx, gy, gz), (bx, by, bz), shared, h(stream),
                                   extra_params(extra)),
                "cuLaunchKernelEx": lambda config, fn, _, extra: self._c_launch_ex(
                    config.contents, h(fn), extra_params(extra)),
                "cuEventRecord": lambda event, stream: self.event_record(h(event), h(stream)),
                "cuStreamWaitEvent": lambda stream, event, flags:
                    self.stream_wait_event(h(stream), h(event), flags),
                "cuEventSynchronize": lambda event: self.event_synchronize(h(event)),
                "cuMemsetD8Async": lambda dst, value, count, stream:
                    self.memset_async(dst, value, 1, count, h(stream)),
                "cuMemsetD16Async": lambda dst, value, count, stream:
                    self.memset_async(dst, value, 2, count, h(stream)),
                "cuMemsetD32Async": lambda dst, value, count, stream:
                    self.memset_async(dst, value, 4, count, h(stream)),
                "cuMemcpyDtoDAsync": lambda dst, src, n, stream:
                    self.memcpy_dtod_async(dst, src, n, h(stream)),
                "cuMemcpyHtoDAsync": lambda dst, src, n, stream:
                    self.memcpy_htod_async(dst, src, n, h(stream)),
            }
            self._entries = {}
            for name, call in calls.items():
                c_entry = ctypes.CFUNCTYPE(ctypes.c_int, *C_SIGNATURES[name])(
                    self._c_call(name, call))
                self._entries[name] = (ctypes.cast(c_entry, ctypes.c_void_p).value, c_entry)
        return {name: address for name, (address, _) in self._entries.items()}

    def _handle(self, value):
        return self._handles[value or 0]

    def _c_call(self, name, call):
        """``call`` as the driver answers: a status, 0 for success."""
        def entry(*args):
            try:
                call(*args)
            except CudaError as exc:
                return exc.status
            except Exception as exc:  # a bug in the double or the loop: loud, never success
                print(f"fake {name}: {exc!r}")
                return 999
            self.c_calls[name] = self.c_calls.get(name, 0) + 1
            return 0
        return entry

    def _c_launch(self, function, grid, block, shared, stream, params):
        self.launch(function, grid, block, shared, stream, params)
        self.c_launches += 1

    def _c_launch_ex(self, config, function, params):
        attrs = ctypes.string_at(config.attrs, config.num_attrs * 72) if config.num_attrs else b""
        self.launch_ex(function, tuple(config.grid), tuple(config.block), config.shared_mem,
                       self._handle(config.stream), params, attrs)
        self.c_launches += 1

    def handle_value(self, handle):
        value = self._values.get(handle)
        if value is None:
            value = self._values[handle] = len(self._values) + 1
            self._handles[value] = handle
        return value

    def launch_ex(self, function, grid, block, shared_mem, stream, params, attrs):
        self.launch_ex_attrs.append(bytes(attrs))
        attrs = bytes(attrs)
        if any(int.from_bytes(attrs[i:i + 4], "little") == P.LAUNCH_ATTR_COOPERATIVE
               and int.from_bytes(attrs[i + 8:i + 12], "little")
               for i in range(0, len(attrs), P.LAUNCH_ATTR_SIZE)):
            # every block resident at once: the occupancy on each SM, times the SMs
            self._check()
            threads = block[0] * block[1] * block[2]
            most = self.occupancy_max_blocks(function, threads, shared_mem, 0) \
                * self.attribute(16)
            if grid[0] * grid[1] * grid[2] > most:
                raise CudaError(S.COOPERATIVE_LAUNCH_TOO_LARGE,
                                f"fake: {grid} blocks of {threads} threads, {most} resident")
        self.launch(function, grid, block, shared_mem, stream, params)

    def occupancy_available_smem(self, function, blocks, block_size):
        attrs = self._func_attrs(function)
        return max(0, min(attrs[8], self._shared_per_sm(function) // max(blocks, 1) - attrs[1]))

    def occupancy_clusters(self, which, function, grid, block, shared_mem, attrs):
        return 8 if which else 16

    def tensor_map_encode_tiled(self, dtype, rank, address, dims, strides, box, element_strides,
                                interleave, swizzle, l2, oob):
        return struct.pack("<QI", address, rank).ljust(128, b"\0")

    def tensor_map_encode_im2col(self, dtype, rank, address, dims, strides, lower, upper,
                                 channels, pixels, element_strides, interleave, swizzle, l2,
                                 oob, wide, mode):
        if address % 16:  # as the driver: a global address 16-byte aligned
            raise CudaError(S.INVALID_VALUE, "fake cuTensorMapEncodeIm2col: unaligned address")
        return struct.pack("<QII", address, rank, 2 + wide).ljust(128, b"\0")

    def tensor_map_replace_address(self, tensor_map, address):
        if address % 16:
            raise CudaError(S.INVALID_VALUE, "fake cuTensorMapReplaceAddress: unaligned address")
        return struct.pack("<Q", address) + bytes(tensor_map)[8:]

    # -- contexts and device queries the double answers as an H200 would ------------------

    def ctx_record_event(self, event):
        if self.captures:  # as the driver: a capture under way is invalidated, and refused
            raise CudaError(S.STREAM_CAPTURE_UNSUPPORTED, "fake cuCtxRecordEvent: capturing")
        event.capture = None
        event.t = time.perf_counter()  # the double's work is done as it is given

    def ctx_wait_event(self, event):
        if self.captures or event.capture is not None:
            raise CudaError(S.STREAM_CAPTURE_UNSUPPORTED, "fake cuCtxWaitEvent: capturing")
        self.ctx_waits = getattr(self, "ctx_waits", 0) + 1

    def ctx_reset_persisting_l2(self):
        self.l2_resets = getattr(self, "l2_resets", 0) + 1

    def texture_1d_linear_max_width(self, fmt, channels):
        if fmt not in ARRAY_FORMATS or channels not in (1, 2, 4):
            raise CudaError(S.INVALID_VALUE, "fake cuDeviceGetTexture1DLinearMaxWidth: "
                                             f"format {fmt:#x}, {channels} channels")
        return 1 << 28

    def host_atomic_caps(self, operations):
        caps = []
        for (op,) in struct.iter_unpack("<I", operations):
            if op > 12:  # past CU_ATOMIC_OPERATION_FLOAT_MAX
                raise CudaError(S.INVALID_VALUE, f"fake: atomic operation {op}")
            # signed, unsigned, reduction, 32 and 64 bits; floats: 32 and 64 bits
            caps.append(0x18 if op >= 10 else 0x1F)
        return struct.pack(f"<{len(caps)}I", *caps)

    def array_memory_requirements(self, array, mipmapped):
        data = sum(len(a.data) for a in array) if mipmapped else len(array.data)
        return (data + 0xFFFF) & ~0xFFFF, 0x10000

    def compiler_id(self):
        return "fake-nvrtc-sm_90"

    def compile(self, source, name, options, headers):
        if os.environ.get("HVGPU_FAKE_NVRTC") == "real":  # the product's confined NVRTC
            from hvgpu.host.executor.compiler import compile_confined
            return compile_confined(source, name, options, headers, "sm_90")
        if b"#error" in source:
            raise CompileError(S.INVALID_SOURCE, f"{name}(1): error: fake compile failure")
        return bytes(source) + b"".join(bytes(h) for h in headers.values()), \
            "fake-nvrtc: compiled"

    def stream_create(self, flags, priority=0):
        stream = ("stream", object())
        least, greatest = self.stream_priority_range()  # clamped into the range, as CUDA does
        if priority:
            self.stream_attrs[stream] = {8: struct.pack("<i", max(greatest, min(least, priority)))
                                         .ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")}
        if not flags & 1:  # CU_STREAM_NON_BLOCKING unset: it synchronises with legacy work
            self.blocking.add(stream)
        return stream

    def stream_destroy(self, stream):
        self.waiting.pop(stream, None)  # the driver lets its work go on; here it is dropped
        self.stream_attrs.pop(stream, None)

    def stream_set_attribute(self, stream, attr, value):
        """As cuStreamSetAttribute documents each value (cuda.h 13.0)."""
        value = bytes(value).ljust(P.LAUNCH_ATTR_VALUE_SIZE, b"\0")
        bad = CudaError(S.INVALID_VALUE, f"fake cuStreamSetAttribute: not a value of {attr}")
        if attr == 1:  # CUaccessPolicyWindow
            base, n, ratio, hit, miss = struct.unpack_from("<QQfii", value)
            if n > self.attribute(109) or not 0.0 <= ratio <= 1.0 or hit not in (0, 1, 2) \
                    or miss not in (0, 1) or n and not base:
                raise bad
        elif attr == 3:  # CUsynchronizationPolicy
            if struct.unpack_from("<i", value)[0] not in (1, 2, 3, 4):
                raise bad
        elif attr == 8:  # clamped into the priority range
            least, greatest = self.stream_priority_range()
            value = struct.pack("<i", max(greatest, min(least, struct.unpack_from("<i", value)[0])))
        elif attr == 9:  # CUlaunchMemSyncDomainMap: two domains of the device's
            if value[0] >= 4 or value[1] >= 4:
                raise bad
        elif attr == 10:  # CUlaunchMemSyncDomain
            if struct.unpack_from("<i", value)[0] not in (0, 1):
                raise bad
        elif attr == 16:
            if struct.unpack_from("<I", value)[0] not in (0, 1):
                raise bad
        else:
            raise CudaError(S.INVALID_VALUE, f"fake: attribute {attr} is not a stream's")
        keep = {1: 28, 3: 4, 8: 4, 9: 2, 10: 4, 16: 4}[attr]  # the member's bytes
        self.stream_attrs.setdefault(stream, {})[attr] = value[:keep].ljust(
            P.LAUNCH_ATTR_VALUE_SIZE, b"\0")

    def stream_get_attribute(self, stream, attr):
        if attr not in (1, 3, 8, 9, 10, 16):
            raise CudaError(S.INVALID_VALUE, f"fake: attribute {attr} is not a stream's")
        default = {3: struct.pack("<i", 1), 9: bytes((0, 1))}.get(attr, b"")  # AUTO; 0, 1
        return self.stream_attrs.get(stream, {}).get(attr, default.ljust(
            P.LAUNCH_ATTR_VALUE_SIZE, b"\0"))

    def stream_copy_attributes(self, dst, src):
        self.stream_attrs[dst] = dict(self.stream_attrs.get(src, {}))

    # CUstreamWaitValue_flags' comparisons, of 32 or 64 bits (GEQ is cyclic: signed)
    _CONDITIONS = {0: lambda v, want, bits: ((v - want) & (1 << bits) - 1) < 1 << bits - 1,
                   1: lambda v, want, bits: v == want,
                   2: lambda v, want, bits: v & want != 0,
                   3: lambda v, want, bits: ~(v | want) & (1 << bits) - 1 != 0}

    def stream_memops(self, stream, call, ops, flags):
        self._check()
        self.memops.append((call, list(ops), flags))
        if flags:
            raise CudaError(S.INVALID_VALUE, "fake cuStreamBatchMemOp: flags must be 0")
        for operation, op_flags, address, value in ops:
            if operation in (1, 2, 4, 5):
                width = 4 if operation in (1, 2) else 8
                if address % width:
                    raise CudaError(S.INVALID_VALUE, f"fake: 0x{address:x} is not aligned")
                self._copy_range(address, width, "stream memory operation")
                if operation in (2, 5) and op_flags & ~1:
                    raise CudaError(S.INVALID_VALUE, f"fake: write flags {op_flags:#x}")
                if operation in (1, 4) and op_flags & ~((1 << 30) | 3):
                    raise CudaError(S.INVALID_VALUE, f"fake: wait flags {op_flags:#x}")
            elif operation not in (3, 6):
                raise CudaError(S.INVALID_VALUE, f"fake: no memory operation {operation}")
        for operation, op_flags, address, value in ops:
            if operation in (2, 5):
                fmt = "<I" if operation == 2 else "<Q"
                self._on(stream, lambda a=address, d=struct.pack(fmt, value): self._store(a, d))
            elif operation in (1, 4):
                bits = 32 if operation == 1 else 64
                test = self._CONDITIONS[op_flags & 3]
                fmt = "<I" if bits == 32 else "<Q"

                def ready(a=address, want=value, bits=bits, test=test, fmt=fmt):
                    return test(struct.unpack(fmt, self._load(a, bits // 8))[0], want, bits)

                def wait(stream=stream, ready=ready):
                    if not ready():
                        self.waiting[stream] = (ready, [])
                self._on(stream, wait)

    def stream_synchronize(self, stream):
        self._check()
        self._wake()  # the host may have written what a wait waits for
        if stream in self.waiting:  # the driver would wait for ever
            raise CudaError(S.ILLEGAL_STATE, "fake cuStreamSynchronize: the stream waits for "
                                             "a value nothing has written")
        capture = self.captures.get(stream)
        if capture is not None:  # as the driver: refused, and the capture is lost
            capture.failed = CudaError(S.STREAM_CAPTURE_INVALIDATED,
                                       "fake: the capture was invalidated by a "
                                            "synchronisation")
            raise CudaError(S.STREAM_CAPTURE_UNSUPPORTED,
                            "fake cuStreamSynchronize: the stream is capturing")
        self._synchronized()

    def stream_query(self, stream):
        self._check()
        self._wake()
        return stream not in self.waiting

    def stream_wait_event(self, stream, event, flags):
        capture = event.capture
        if capture is not None and stream not in self.captures and capture.failed is None \
                and capture in self.captures.values():
            self.captures[stream] = capture  # joins the capture (a fork)

    def event_create(self, flags):
        return Event(timing=not flags & 2)

    def event_destroy(self, event):
        self.events_destroyed += 1

    def event_record(self, event, stream):
        capture = self.captures.get(stream)
        event.capture = capture
        self._on(stream, lambda: setattr(event, "t", time.perf_counter()))

    # -- stream capture and graphs -------------------------------------------------

    def stream_begin_capture(self, stream, mode):
        if stream in (("stream", 0), ("stream", 1)):
            raise CudaError(S.STREAM_CAPTURE_UNSUPPORTED,
                            "fake cuStreamBeginCapture: the legacy stream cannot capture")
        if stream in self.captures:
            raise CudaError(S.ILLEGAL_STATE, "fake cuStreamBeginCapture: already capturing")
        self.capture_ids += 1
        self.captures[stream] = Capture(self.capture_ids, stream, mode)

    def stream_end_capture(self, stream):
        capture = self.captures.get(stream)
        if capture is None:
            raise CudaError(S.ILLEGAL_STATE, "fake cuStreamEndCapture: not capturing")
        if capture.origin != stream:
            capture.failed = CudaError(S.STREAM_CAPTURE_INVALIDATED,
                                       "fake: ended on a joined stream")
            raise CudaError(S.STREAM_CAPTURE_UNMATCHED,
                            "fake cuStreamEndCapture: not the capture's origin")
        for s in [s for s, c in self.captures.items() if c is capture]:
            del self.captures[s]
        if capture.failed is not None:
            raise capture.failed
        self.graphs_alive += 1
        return capture.graph

    def stream_capture_info(self, stream):
        if stream in (("stream", 0), ("stream", 1)) and self.blocking & self.captures.keys():
            raise CudaError(S.STREAM_CAPTURE_IMPLICIT,
                            "fake cuStreamGetCaptureInfo: the legacy stream would join "
                                 "a capture of a blocking stream")
        capture = self.captures.get(stream)
        if capture is None:
            return 0, 0, None, []
        if capture.failed is not None:
            return 2, capture.id, None, []
        ops = len(capture.graph.ops)
        return 1, capture.id, capture.graph, [capture.graph.node(ops - 1)] if ops else []

    def graph_nodes(self, graph):
        return [graph.node(i) for i in range(len(graph.ops))]

    def graph_node_count(self, graph):
        return len(graph.ops)

    def _add(self, graph, deps, work, kind=None) -> "Node":
        if graph.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake: destroyed graph")
        for d in deps:
            assert d in graph._nodes, "the session passed a node of another graph"
        graph.ops.append(work)
        node = graph.node(len(graph.ops) - 1)
        node.kind = kind
        return node

    def _kernel(self, function, params):
        if isinstance(function, tuple):
            return lambda: None
        _, fmt, body = KERNELS[function]
        args = struct.unpack(fmt, params) if fmt else ()
        return lambda: body(self, *args)

    def graph_create(self):
        self.graphs_alive += 1
        return Graph()

    def graph_add_kernel(self, graph, deps, function, grid, block, shared_mem, params):
        node = self._add(graph, deps, self._kernel(function, params), NODE_KERNEL)
        graph.kernels.add(node.index)
        return node

    def graph_add_memset(self, graph, deps, dst, pitch, value, element_size, width, height):
        fmt = {1: "B", 2: "H", 4: "I"}[element_size]
        # the node's value is an unsigned int, of which an element takes its low bytes
        row = struct.pack("<" + fmt, value & (1 << 8 * element_size) - 1) * width

        def work():
            for r in range(height):
                self._store(dst + r * pitch, row)
        return self._add(graph, deps, work, NODE_MEMSET)

    def graph_add_memcpy(self, graph, deps, kind, dst, src, size):
        if kind == 1:
            work = lambda: self._store(dst, ctypes.string_at(src, size))  # noqa: E731
        elif kind == 2:
            work = lambda: ctypes.memmove(dst, self._load(src, size), size)  # noqa: E731
        else:
            work = lambda: self._store(dst, self._load(src, size))  # noqa: E731
        return self._add(graph, deps, work, NODE_MEMCPY)

    def graph_add_empty(self, graph, deps):
        return self._add(graph, deps, lambda: None, NODE_EMPTY)

    def graph_add_event(self, graph, deps, wait, event):
        if wait:
            return self._add(graph, deps, lambda: None, NODE_WAIT)
        return self._add(graph, deps, lambda: setattr(event, "t", time.perf_counter()),
                         NODE_RECORD)

    def graph_add_dependencies(self, graph, sources, targets):
        for n in (*sources, *targets):
            assert n in graph._nodes, "the session passed a node of another graph"

    def graph_exec_kernel_set(self, exec_, node, function, grid, block, shared_mem, params):
        if node.index not in exec_.kernels:  # added since it was instantiated, or no kernel
            raise CudaError(S.INVALID_VALUE, "fake cuGraphExecKernelNodeSetParams: not a "
                                             "kernel node of the instantiated graph")
        exec_.ops[node.index] = self._kernel(function, params)

    def graph_exec_update(self, exec_, graph):
        if len(graph.ops) != len(exec_.ops):
            return 2, None  # CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
        exec_.ops = list(graph.ops)
        exec_.kernels = set(graph.kernels)
        return 0, None

    def graph_instantiate(self, graph, flags):
        if graph.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphInstantiate: destroyed graph")
        if self._used() + self.exec_bytes > TOTAL:
            raise CudaError(S.OUT_OF_MEMORY, "fake cuGraphInstantiate: out of memory")
        if (graph.mem_allocs or graph.mem_frees) and graph.execs:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphInstantiate: a graph with memory "
                                             "nodes has one instantiation at a time")
        self.graphs_alive += 1
        self.graph_bytes += self.exec_bytes
        self._publish()
        graph.execs += 1
        return GraphExec(graph, flags)

    def graph_launch(self, exec_, stream):
        self._check()
        if exec_.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphLaunch: destroyed graph exec")
        unfreed = [d for d in exec_.allocs if d in self.graph_live]
        if unfreed and not exec_.auto_free:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphLaunch: allocations of its last "
                                             "launch are not freed")
        for d in unfreed:
            del self.graph_live[d]
        exec_.launches += 1
        self.graph_launches += 1

        def replay():
            for cond in exec_.conditionals:
                if cond.default is not None:
                    cond.value = cond.default
            for op in exec_.ops:
                op()
        self._on(stream, replay)

    def graph_upload(self, exec_, stream):
        if exec_.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphUpload: destroyed graph exec")

    def graph_destroy(self, graph):
        if graph.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphDestroy: destroyed twice")
        graph.destroyed = True
        self.graphs_alive -= 1

    def graph_exec_destroy(self, exec_):
        if exec_.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphExecDestroy: destroyed twice")
        exec_.destroyed = True
        exec_.graph.execs -= 1
        self.graphs_alive -= 1
        self.graph_bytes -= self.exec_bytes
        self._publish()

    def graph_conditional_handle_create(self, graph, default, flags):
        if graph.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphConditionalHandleCreate: destroyed")
        value = 0x7000_0000 + len(self.conditionals)
        self.conditionals[value] = cond = Conditional(default, flags)
        graph.conditionals.append(cond)
        return value

    def graph_add_conditional(self, graph, deps, handle, kind, size):
        if kind not in (0, 1, 2) or (kind == 1 and size != 1) or (kind == 0 and size > 2):
            raise CudaError(S.INVALID_VALUE, "fake cuGraphAddNode: conditional node shape")
        cond = self.conditionals[handle]
        bodies = [Graph() for _ in range(size)]

        def run(body):
            for op in body.ops:
                op()

        def work():
            if kind == 1:
                for _ in range(1 << 20):  # bounded, as a test's loop should be
                    if not cond.value:
                        break
                    run(bodies[0])
            elif kind == 0 and cond.value:
                run(bodies[0])
            elif kind == 0 and size == 2:
                run(bodies[1])
            elif kind == 2 and cond.value < size:
                run(bodies[cond.value])
        return self._add(graph, deps, work, NODE_CONDITIONAL), bodies

    def graph_clone(self, graph):
        if graph.destroyed:
            raise CudaError(S.INVALID_HANDLE, "fake cuGraphClone: destroyed graph")
        if graph.mem_allocs or graph.mem_frees:
            raise CudaError(S.NOT_SUPPORTED, "fake cuGraphClone: a graph with memory nodes")
        self.graphs_alive += 1
        clone = Graph()
        clone.ops, clone.kernels, clone.origin = list(graph.ops), set(graph.kernels), graph
        return clone

    def graph_node_find_in_clone(self, node, clone):
        origin = clone.origin
        if origin is None or node not in origin._nodes or node.index >= len(clone.ops):
            raise CudaError(S.INVALID_VALUE, "fake cuGraphNodeFindInClone: not a node of "
                                             "the graph cloned")
        return clone.node(node.index)

    # -- graph memory ---------------------------------------------------------------

    def _graph_va(self, ptr):
        return ptr in self._graph_vas

    def _mem_alloc_node(self, graph, size, deps=None):
        if not size:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphAddMemAllocNode: 0 bytes")
        if size > TOTAL:  # the driver reserves addresses for it: it refuses what never fits
            raise CudaError(S.OUT_OF_MEMORY, f"fake cuGraphAddMemAllocNode: {size} bytes")
        dptr = -(-self.next // GRANULARITY) * GRANULARITY
        self.next = dptr + -(-size // GRANULARITY) * GRANULARITY + GRANULARITY
        self._graph_vas[dptr] = size
        need = -(-size // GRANULARITY) * GRANULARITY

        def work():
            held = sum(-(-len(b) // GRANULARITY) * GRANULARITY for b in self.graph_live.values())
            grow = held + need - self.graph_reserved
            if grow > 0:
                if self._used() + grow > TOTAL:
                    raise CudaError(S.OUT_OF_MEMORY, "fake: the graph's allocation does not fit")
                self.graph_reserved += grow
                self._publish()
            self.graph_live[dptr] = bytearray(size)
            self.graph_high[0] = max(self.graph_high[0], self.graph_reserved)
            self.graph_high[1] = max(self.graph_high[1], self.graph_reserved)
        if deps is None:
            graph.ops.append(work)
            node = graph.node(len(graph.ops) - 1)
        else:
            node = self._add(graph, deps, work)
        node.kind, node.mem = NODE_MEM_ALLOC, (dptr, size)
        graph.mem_allocs.append(dptr)
        return node

    def _mem_free_node(self, graph, dptr, deps=None):
        if not self._graph_va(dptr) or dptr in graph.mem_frees:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphAddMemFreeNode: not an allocation "
                                             "node's address, or freed twice in the graph")
        work = lambda: self.graph_live.pop(dptr, None)  # noqa: E731
        if deps is None:
            graph.ops.append(work)
            node = graph.node(len(graph.ops) - 1)
        else:
            node = self._add(graph, deps, work)
        node.kind, node.mem = NODE_MEM_FREE, dptr
        graph.mem_frees.append(dptr)
        return node

    def graph_add_mem_alloc(self, graph, deps, size):
        node = self._mem_alloc_node(graph, size, deps)
        return node, node.mem[0]

    def graph_add_mem_free(self, graph, deps, dptr):
        return self._mem_free_node(graph, dptr, deps)

    def graph_node_type(self, node):
        if node.kind is not None:
            return node.kind
        return NODE_KERNEL if node.graph is not None and node.index in node.graph.kernels \
            else NODE_EMPTY  # captured work the double does not tell apart

    def graph_mem_alloc_params(self, node):
        if node.kind != NODE_MEM_ALLOC:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphMemAllocNodeGetParams: not an "
                                             "allocation node")
        return node.mem

    def graph_mem_free_params(self, node):
        if node.kind != NODE_MEM_FREE:
            raise CudaError(S.INVALID_VALUE, "fake cuGraphMemFreeNodeGetParams: not a free node")
        return node.mem

    def graph_mem_trim(self):
        self.graph_reserved = sum(-(-len(b) // GRANULARITY) * GRANULARITY
                                  for b in self.graph_live.values())
        self._publish()

    def graph_mem_attribute(self, attr):
        # USED and RESERVED alike here: the double's pool maps all it holds to allocations
        if attr in (0, 2):
            return self.graph_reserved
        if attr in (1, 3):
            return self.graph_high[attr // 2]
        raise CudaError(S.INVALID_VALUE, f"fake cuDeviceGetGraphMemAttribute: {attr}")

    def graph_mem_set_attribute(self, attr, value):
        if attr not in (1, 3) or value:
            raise CudaError(S.INVALID_VALUE, f"fake cuDeviceSetGraphMemAttribute: {attr}")
        self.graph_high[attr // 2] = self.graph_reserved

    def event_query(self, event):
        return True

    def event_synchronize(self, event):
        self._check()
        self._synchronized()

    def event_elapsed(self, start, end):
        # As cuEventElapsedTime documents: an event never recorded is an invalid handle
        # here (NOT_READY is for recorded work not done yet, which the double never has).
        # CU_EVENT_DISABLE_TIMING events keep no time: invalid handles here too.
        if start.t is None or end.t is None or not (start.timing and end.timing):
            raise CudaError(S.INVALID_HANDLE, "fake cuEventElapsedTime: an event was never "
                                              "recorded")
        return (end.t - start.t) * 1000.0

    # -- arrays, texture and surface objects, 3D copies --------------------------------

    def _take_array_memory(self, key, n):
        taken = self.footprint(n)
        if self._used() + taken > TOTAL:
            raise CudaError(S.OUT_OF_MEMORY, f"fake: an array of {n} bytes does not fit")
        self.array_taken[key] = taken
        self._publish()

    def array_create(self, width, height, depth, fmt, channels, flags):
        self._check()
        _array_extent(width, height, depth, fmt, channels, flags)
        array = FakeArray(width, height, depth, fmt, channels, flags)
        self._take_array_memory(id(array), len(array.data))
        self.arrays[id(array)] = array
        return array

    def array_destroy(self, array):
        if self.arrays.pop(id(array), None) is None or id(array) not in self.array_taken:
            raise CudaError(S.INVALID_HANDLE, "fake cuArrayDestroy: not an array")
        del self.array_taken[id(array)]
        self._publish()

    def array_descriptor(self, array):
        if id(array) not in self.arrays:
            raise CudaError(S.INVALID_HANDLE, "fake cuArray3DGetDescriptor: not an array")
        return array.desc

    def mipmap_create(self, width, height, depth, fmt, channels, flags, levels):
        self._check()
        _array_extent(width, height, depth, fmt, channels, flags)
        if levels > max(width, height, depth).bit_length():
            raise CudaError(S.INVALID_VALUE, f"fake cuMipmappedArrayCreate: {levels} levels")
        layered = flags & ARRAY_LAYERED
        mipmap = [FakeArray(max(1, width >> i), height and max(1, height >> i),
                            depth if layered else depth and max(1, depth >> i), fmt, channels,
                            flags) for i in range(levels)]
        self._take_array_memory(id(mipmap), sum(len(a.data) for a in mipmap))
        for level in mipmap:
            self.arrays[id(level)] = level
        return mipmap

    def mipmap_destroy(self, mipmap):
        if self.array_taken.pop(id(mipmap), None) is None:
            raise CudaError(S.INVALID_HANDLE, "fake cuMipmappedArrayDestroy: not one")
        for level in mipmap:
            self.arrays.pop(id(level), None)
        self._publish()

    def mipmap_level(self, mipmap, level):
        if id(mipmap) not in self.array_taken or not 0 <= level < len(mipmap):
            raise CudaError(S.INVALID_VALUE, f"fake cuMipmappedArrayGetLevel: level {level}")
        return mipmap[level]

    def _object_value(self):
        self.object_values += 1
        return self.object_values

    def tex_create(self, res_type, resource, fmt, channels, width, height, pitch, res_flags,
                   tex_desc, view_desc):
        self._check()
        if len(tex_desc) != 104 or len(view_desc) not in (0, 112):
            raise CudaError(S.INVALID_VALUE, "fake cuTexObjectCreate: descriptions")
        if res_type == 0:
            if id(resource) not in self.arrays:
                raise CudaError(S.INVALID_VALUE, "fake cuTexObjectCreate: not an array")
            data = resource.data
            read = lambda n: bytes(data[:n])  # noqa: E731
        elif res_type == 1:
            data = resource[0].data
            read = lambda n: bytes(data[:n])  # noqa: E731
        elif res_type == 2:
            self._copy_range(resource, width, "cuTexObjectCreate")
            read = lambda n: self._load(resource, min(n, width))  # noqa: E731
        else:
            row = width * ARRAY_FORMATS.get(fmt, 1) * channels
            if pitch < row:
                raise CudaError(S.INVALID_VALUE, "fake cuTexObjectCreate: pitch below a row")
            self._copy_range(resource, pitch * (height - 1) + row, "cuTexObjectCreate")
            read = lambda n: b"".join(  # noqa: E731
                self._load(resource + i * pitch, row) for i in range(height))[:n]
        value = self._object_value()
        self.textures[value] = read
        return value

    def texture_bytes(self, value, n):
        """What a kernel reads through texture object ``value``: its first n bytes."""
        read = self.textures.get(value)
        if read is None:
            self.sticky = CudaError(S.ILLEGAL_ADDRESS, f"fake: {value} is no texture object")
            return bytes(n)
        return read(n).ljust(n, b"\0")

    def tex_destroy(self, value):
        if self.textures.pop(value, None) is None:
            raise CudaError(S.INVALID_VALUE, f"fake cuTexObjectDestroy: {value}")

    def surf_create(self, array):
        if id(array) not in self.arrays or not array.desc[5] & ARRAY_SURFACE_LDST:
            raise CudaError(S.INVALID_VALUE, "fake cuSurfObjectCreate: not a surface array")
        value = self._object_value()
        self.surfaces[value] = array
        return value

    def surf_destroy(self, value):
        if self.surfaces.pop(value, None) is None:
            raise CudaError(S.INVALID_VALUE, f"fake cuSurfObjectDestroy: {value}")

    def _side_rows(self, side, width, height, depth, what):
        """(load(i), store(i, bytes)) of row i (slice-major) of a copy side, checked as the
        driver checks a cuMemcpy3D's side."""
        kind, where, x, y, z, pitch, rows_per_slice = side
        if kind == 3:
            array = where
            if id(array) not in self.arrays:
                raise CudaError(S.INVALID_VALUE, f"fake cuMemcpy3D {what}: not an array")
            if x + width > array.row or y + height > array.rows or z + depth > array.slices:
                raise CudaError(S.INVALID_VALUE, f"fake cuMemcpy3D {what}: past the array")
            data = array.data

            def at(i):
                return ((z + i // height) * array.rows + y + i % height) * array.row + x

            def load(i):
                return bytes(data[at(i):at(i) + width])

            def store(i, b):
                data[at(i):at(i) + width] = b
            return load, store
        if (height > 1 or depth > 1) and pitch < x + width:
            raise CudaError(S.INVALID_VALUE, f"fake cuMemcpy3D {what}: pitch below the width")

        def addr(i):
            return where + x + ((z + i // height) * rows_per_slice + y + i % height) * pitch
        if kind == 2:
            self._copy_range(addr(0), addr(height * depth - 1) - addr(0) + width,
                             f"cuMemcpy3D {what}")
            return (lambda i: self._load(addr(i), width)), (lambda i, b: self._store(addr(i), b))
        if kind == 1:
            return ((lambda i: ctypes.string_at(addr(i), width)),
                    (lambda i, b: ctypes.memmove(addr(i), b, width)))
        raise CudaError(S.INVALID_VALUE, f"fake cuMemcpy3D {what}: memory type {kind}")

    def memcpy_3d(self, src, dst, width, height, depth, stream):
        self._check()
        load, _ = self._side_rows(src, width, height, depth, "source")
        _, store = self._side_rows(dst, width, height, depth, "destination")
        rows = height * depth

        def work():
            for i in range(rows):
                store(i, load(i))
        if src[0] == 1 and stream not in self.captures:  # pageable: taken at the call
            taken = [load(i) for i in range(rows)]
            self._on(stream, lambda: [store(i, b) for i, b in enumerate(taken)])
        else:
            self._on(stream, work)

    def synchronize(self):
        self._check()
        self._wake()
        if self.waiting:  # the driver would wait for ever
            raise CudaError(S.ILLEGAL_STATE, "fake cuCtxSynchronize: a stream waits for a "
                                             "value nothing has written")
        self._synchronized()

    def close(self):
        report = os.environ.get("HVGPU_FAKE_REPORT")
        if report:
            os.makedirs(report, exist_ok=True)
            left = len(self.mem) + len(self.reservations) + len(self.physical) \
                + len(self.mapped) + len(self.pools) + len(self.array_taken) \
                + len(self.textures) + len(self.surfaces)
            what = {"allocated": self.allocated, "freed": self.freed, "left": left,
                    "launches": self.launches, "c_launches": self.c_launches}
            if os.environ.get("HVGPU_FAKE_REPORT_GRAPHS"):
                what.update(graphs_left=self.graphs_alive, graph_launches=self.graph_launches,
                            events_destroyed=self.events_destroyed,
                            modules_unloaded=self.modules_unloaded)
            if os.environ.get("HVGPU_FAKE_REPORT_PINNED"):
                what["pinned_peak"] = self.pinned_peak
            with open(os.path.join(report, f"{os.getpid()}.json"), "w") as f:
                json.dump(what, f)


class NoDriver:
    """A host whose GPU cannot be opened, as CudaDevice reports it."""

    def __init__(self, ordinal: int = 0, address_window: int = 0):
        raise CudaError(P.HV_NO_GPU, "no NVIDIA driver on the host: libcuda.so.1 not found")
