"""Large memory copies on several threads, for the shared-memory lane's staged copies.

One thread's copy moves 8-10 GB/s on the GPU machine: less than the driver's own
pageable device-to-host copies (up to 15 GB/s), and far less than the region's DMA.
``copy(dst, src, n)`` splits a copy of 2 MiB or more among a few threads; ctypes'
memmove lets go of the GIL while it copies, so they run at once. The pool is made on
the first large copy and dropped in a fork's child. HVGPU_COPY_THREADS sets how many
threads share a copy (default: the CPUs, at most 4; 1: the caller alone), as for
the libcuda shim.

Must not touch anything but the two address ranges it is given: callers hand it
addresses of buffers they hold for the duration of the call.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

# Its numbers are the libcuda shim's pcopy.c's: one definition for both.
from hvgpu.virtio import tuning as T

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_busy = threading.Lock()  # one copy on the pool at a time; another copies alone


def threads() -> int:
    """Threads that share one large copy, the caller included."""
    raw = os.environ.get(T.ENV_COPY_THREADS, "")
    if raw.strip():
        try:
            return max(1, min(T.PARALLEL_COPY_MAX_THREADS, int(raw)))
        except ValueError:
            pass
    return max(1, min(T.PARALLEL_COPY_THREADS, os.cpu_count() or 1))


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="hvgpu-copy")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock, _busy
    _pool, _pool_lock, _busy = None, threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def copy(dst: int, src: int, n: int) -> None:
    """memcpy(dst, src, n) between two addresses, on several threads when n is large."""
    k = threads()
    if n < T.PARALLEL_COPY_MIN or k == 1 or not _busy.acquire(blocking=False):
        ctypes.memmove(dst, src, n)
        return
    try:
        each = -(-n // k)
        each = -(-each // T.PARALLEL_COPY_ALIGN) * T.PARALLEL_COPY_ALIGN
        pool = _get_pool(k - 1)
        futures = [pool.submit(ctypes.memmove, dst + off, src + off, min(each, n - off))
                   for off in range(each, n, each)]
        ctypes.memmove(dst, src, min(each, n))
        for f in futures:
            f.result()
    finally:
        _busy.release()
