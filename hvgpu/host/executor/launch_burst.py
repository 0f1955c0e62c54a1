"""Runs of pipelined LAUNCH_KERNEL frames, launched by C (``launch_burst.c``).

A session hands the unread bytes of its receive buffer to :meth:`LaunchBurst.run`,
which launches every leading well-formed one-way launch whose function and
stream it knows, and returns how far it got. The session keeps the tables in
step: a function once its parameter size is known, a stream when it is
created, removed when they go away. Anything the C loop does not serve is left
for the session's Python path, which applies the same checks with full error
messages.

This module loads a C library and calls a function pointer given to it; it
must not import CUDA, open sockets or decide what a guest may do.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).with_name("liblaunch_burst.so")


class _Result(ctypes.Structure):
    _fields_ = [("consumed", ctypes.c_uint64), ("launched", ctypes.c_uint64),
                ("status", ctypes.c_int32), ("seq", ctypes.c_uint32)]


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
        lib.hv_burst_new.restype = ctypes.c_void_p
        lib.hv_burst_new.argtypes = [ctypes.c_void_p]
        lib.hv_burst_free.argtypes = [ctypes.c_void_p]
        lib.hv_burst_set_function.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                              ctypes.c_uint64, ctypes.c_uint32]
        lib.hv_burst_set_stream.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
        lib.hv_burst_drop_function.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.hv_burst_drop_stream.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.hv_burst_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                                     ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_Result)]
        lib.hv_burst_run.restype = None
        _lib = lib
    return _lib


def unavailable_reason() -> str:
    """Why the C loop cannot be used here ("" when it can)."""
    _library()
    return _load_error


class LaunchBurst:
    """The C loop's state for one session: its launch entry point and handle tables."""

    def __init__(self, entry: int):
        lib = _library()
        if lib is None:
            raise OSError(_load_error)
        self._lib = lib
        self._state = lib.hv_burst_new(entry)
        if not self._state:
            raise MemoryError("hv_burst_new")
        self._result = _Result()
        self._result_ref = ctypes.byref(self._result)
        self._buffer = None  # (the bytearray, its address)

    def set_function(self, handle: int, function: int, params_size: int) -> None:
        if self._lib.hv_burst_set_function(self._state, handle, function, params_size):
            raise MemoryError("hv_burst_set_function")

    def drop_function(self, handle: int) -> None:
        self._lib.hv_burst_drop_function(self._state, handle)

    def set_stream(self, handle: int, stream: int) -> None:
        if self._lib.hv_burst_set_stream(self._state, handle, stream):
            raise MemoryError("hv_burst_set_stream")

    def drop_stream(self, handle: int) -> None:
        self._lib.hv_burst_drop_stream(self._state, handle)

    def run(self, buf: bytearray, start: int, end: int, version: int,
            max_body: int) -> tuple[int, int, int, int]:
        """Launch from ``buf[start:end]``: (bytes consumed, launched, failed status, its seq)."""
        if self._buffer is None or self._buffer[0] is not buf:
            # The reader's buffer never moves or resizes (its memoryview pins it).
            self._buffer = (buf, ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)))
        r = self._result
        self._lib.hv_burst_run(self._state, self._buffer[1] + start, end - start, version,
                               max_body, self._result_ref)
        return r.consumed, r.launched, r.status, r.seq

    def close(self) -> None:
        if self._state:
            self._lib.hv_burst_free(self._state)
            self._state = None
