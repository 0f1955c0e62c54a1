"""Runs of pipelined one-way frames, served by C (``launch_burst.c``).

A session hands the unread bytes of its receive buffer to :meth:`LaunchBurst.run`,
which serves every leading well-formed one-way frame of the ops in
:data:`SERVED` whose handles and device ranges it knows (launches with and
without attributes, event records, stream waits, memsets, device-to-device
copies, and host-to-device copies small enough for a :class:`CopyRing`
segment), and returns how far it got. The session keeps the tables in step:
a function once its parameter size is known, a stream or event when it is
created, a device range when it is allocated or looked up, each removed when
it goes away. Anything the C loop does not serve is left for the session's
Python path, which applies the same checks with full error messages.

Which ops the loop serves, with which driver entry points and which field checks,
is the executor's op table's to say (``ops``: each op declared with ``burst=`` and
``fields=``); this module hands that to the C loop, through the header cgen
generates. It loads a C library and calls function pointers given to it; it must
not import CUDA, open sockets or decide what a guest may do.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import NamedTuple

from hvgpu.host.executor.ops import TABLE
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).with_name("liblaunch_burst.so")

# The interface with the C loop is defined here and in the executor's op table alone:
# launch_burst.h, which the loop includes, is generated from them
# (python -m hvgpu.virtio.cgen).
#
# The ops it serves: those the table declares with the driver entry points the C loop
# calls for them (``burst=``), by op code, in the order of its per-op counts (its S_
# indexes); the C loop applies each one's declared field checks (``fields=``).
SERVED_OPS = tuple(op.name for code, op in sorted(TABLE.items()) if op.burst)
SERVED = tuple(P.OP[name] for name in SERVED_OPS)
# The driver entry points it calls, in the order of its E_ indexes: the served ops',
# then those its copy ring needs besides. A device gives the addresses of those it has
# (GpuDevice.driver_entries); an op whose entry point is missing goes through Python.
RING_ENTRIES = ("cuEventRecord", "cuEventSynchronize")
ENTRIES = tuple(dict.fromkeys(
    [entry for name in SERVED_OPS for entry in TABLE[P.OP[name]].burst] + list(RING_ENTRIES)))
_LAUNCHES = (P.OP["LAUNCH_KERNEL"], P.OP["LAUNCH_KERNEL_EX"])
MAX_SEGMENTS = 1024  # segments of a copy ring at most
# What one run reports (struct hv_burst_result, naturally aligned): (field, type, count).
RESULT_FIELDS = (
    ("consumed", "u64", 1),  # bytes of the buffer taken: whole frames only
    ("served", "u64", len(SERVED)),  # frames taken per served op, a failed one included
    ("h2d_bytes", "u64", 1),  # bytes queued by host-to-device copies
    ("status", "i32", 1),  # 0, or the failed call's CUresult
    ("seq", "u32", 1),  # the failed frame's seq
    ("op", "u32", 1),  # and its op
    ("need", "u32", 1),  # the frame it stopped at is served once this many bytes of it
                         # are buffered (0: not for want of bytes)
    ("want_ring", "u32", 1),  # it stopped at a small copy: there is no copy ring yet
    ("reserved", "u32", 1))
_CTYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "i32": ctypes.c_int32}


class Result(ctypes.Structure):
    _fields_ = [(name, _CTYPES[typ] * count if count > 1 else _CTYPES[typ])
                for name, typ, count in RESULT_FIELDS]


class Outcome(NamedTuple):
    """What one :meth:`LaunchBurst.run` did."""

    consumed: int  # bytes of the buffer taken: whole frames only
    counts: dict[int, int]  # op -> frames of it taken (a failed one included); no zeros
    launched: int  # launches (with or without attributes) that succeeded
    h2d_bytes: int  # bytes queued by host-to-device copies
    status: int  # 0, or the CUresult of the call that stopped the run
    seq: int  # that frame's seq
    op: int  # and its op
    need: int  # >0: the frame it stopped at is served once this many bytes of it arrived
    want_ring: bool  # it stopped at a small copy: give it a CopyRing (or None) first

    @property
    def frames(self) -> int:
        return sum(self.counts.values())


_lib = None
_load_error = ""


def _library():
    global _lib, _load_error
    if _lib is None and not _load_error:
        try:
            lib = ctypes.CDLL(str(LIBRARY))
        except OSError as exc:
            _load_error = f"{LIBRARY.name} is not built ({exc})"
            return None
        state, u64, u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32
        lib.hv_burst_new.restype = state
        lib.hv_burst_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), u32]
        lib.hv_burst_free.argtypes = [state]
        lib.hv_burst_set_function.argtypes = [state, u64, u64, u32]
        for name in ("set_stream", "set_event", "add_range"):
            getattr(lib, "hv_burst_" + name).argtypes = [state, u64, u64]
        for name in ("drop_function", "drop_stream", "drop_event", "drop_range"):
            getattr(lib, "hv_burst_" + name).argtypes = [state, u64]
        lib.hv_burst_set_ring.argtypes = [state, state]
        lib.hv_burst_run.argtypes = [state, ctypes.c_void_p, u64, u32, u32,
                                     ctypes.POINTER(Result)]
        lib.hv_burst_run.restype = None
        lib.hv_ring_new.restype = state
        lib.hv_ring_new.argtypes = [ctypes.c_void_p, u32, u32, ctypes.POINTER(u64)]
        lib.hv_ring_close.restype = u32
        lib.hv_ring_close.argtypes = [state]
        _lib = lib
    return _lib


def unavailable_reason() -> str:
    """Why the C loop cannot be used here ("" when it can)."""
    _library()
    return _load_error


class CopyRing:
    """Pinned memory in segments, where C loops stage small host-to-device copies.

    One per executor, shared by its sessions' loops (C keeps it alive while any
    loop has it). ``events`` are the C values of one CUDA event per segment.
    The caller owns the memory and the events: it may free them once
    :meth:`close` says no loop holds a segment.
    """

    def __init__(self, addr: int, size: int, segment: int, events: list[int]):
        lib = _library()
        if lib is None:
            raise OSError(_load_error)
        count = size // segment
        if not 0 < count <= MAX_SEGMENTS or len(events) != count:
            raise ValueError(f"{len(events)} events for {size} bytes in {segment}-byte "
                             "segments")
        self.segment = segment
        self._lib = lib
        self._state = lib.hv_ring_new(addr, segment, count, (ctypes.c_uint64 * count)(*events))
        if not self._state:
            raise MemoryError("hv_ring_new")

    def close(self) -> bool:
        """Hand out no more segments; True when none is held (the memory may go)."""
        state, self._state = self._state, None
        return state is None or self._lib.hv_ring_close(state) == 0


class LaunchBurst:
    """The C loop's state for one session: its entry points and handle tables."""

    def __init__(self, entries: dict[str, int]):
        lib = _library()
        if lib is None:
            raise OSError(_load_error)
        self._lib = lib
        table = (ctypes.c_void_p * len(ENTRIES))(*(entries.get(name) for name in ENTRIES))
        self._state = lib.hv_burst_new(table, len(ENTRIES))
        if not self._state:
            raise MemoryError("hv_burst_new")
        self._result = Result()
        self._result_ref = ctypes.byref(self._result)
        self._buffer = None  # (the bytearray, its address)

    def _check(self, failed: int, what: str) -> None:
        if failed:
            raise MemoryError(what)

    def set_function(self, handle: int, function: int, params_size: int) -> None:
        self._check(self._lib.hv_burst_set_function(self._state, handle, function, params_size),
                    "hv_burst_set_function")

    def drop_function(self, handle: int) -> None:
        self._lib.hv_burst_drop_function(self._state, handle)

    def set_stream(self, handle: int, stream: int) -> None:
        self._check(self._lib.hv_burst_set_stream(self._state, handle, stream),
                    "hv_burst_set_stream")

    def drop_stream(self, handle: int) -> None:
        self._lib.hv_burst_drop_stream(self._state, handle)

    def set_event(self, handle: int, event: int) -> None:
        self._check(self._lib.hv_burst_set_event(self._state, handle, event),
                    "hv_burst_set_event")

    def drop_event(self, handle: int) -> None:
        self._lib.hv_burst_drop_event(self._state, handle)

    def add_range(self, start: int, size: int) -> None:
        """A device range the guest may touch (an allocation, a module variable)."""
        self._check(self._lib.hv_burst_add_range(self._state, start, size),
                    "hv_burst_add_range")

    def drop_range(self, start: int) -> None:
        self._lib.hv_burst_drop_range(self._state, start)

    def set_ring(self, ring: CopyRing | None) -> None:
        """Where small copies are staged; None: they go through the Python path."""
        self._lib.hv_burst_set_ring(self._state, ring._state if ring is not None else None)

    def run(self, buf: bytearray, start: int, end: int, version: int,
            max_body: int) -> Outcome:
        """Serve frames from ``buf[start:end]``."""
        if self._buffer is None or self._buffer[0] is not buf:
            # The reader's buffer never moves or resizes (its memoryview pins it).
            self._buffer = (buf, ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)))
        r = self._result
        self._lib.hv_burst_run(self._state, self._buffer[1] + start, end - start, version,
                               max_body, self._result_ref)
        counts = {op: n for op, n in zip(SERVED, r.served) if n}
        launched = counts.get(_LAUNCHES[0], 0) + counts.get(_LAUNCHES[1], 0)
        if r.status and r.op in _LAUNCHES:
            launched -= 1
        return Outcome(r.consumed, counts, launched, r.h2d_bytes, r.status, r.seq, r.op,
                       r.need, bool(r.want_ring))

    def close(self) -> None:
        if self._state:
            self._lib.hv_burst_free(self._state)
            self._state = None
