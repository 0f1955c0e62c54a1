"""The device-memory lock: what keeps a measured charge from being raced.

A module load and a graph instantiation are charged what they took of the GPU's
free memory (cuMemGetInfo before and after): the driver says nothing else of a
module's ``__device__`` variables or an instantiation's own memory. That free
memory is the device's, not the process's. So every call that takes or gives
back device memory holds this lock *shared*, and a measurement holds it
*exclusive*: within the executor (threads of its sessions) by a re-entrant
lock, and across the executors of one GPU (other VMs' vGPUs, without MPS) by
flock(2) on one lock file per GPU in a directory the agent gives them. Another
tenant's release then waits while a load is measured, instead of making that
load look free.

Waiting is bounded (:data:`WAIT`): an executor that stops inside its measurement
(a stuck upload, a wedged process) must not stop every other VM on the GPU. Past
the bound the call goes on without the lock across executors and says so in the
log; the in-process lock is always taken. Memory the driver takes or gives back
by itself (a stream-ordered pool trimming, another process outside hvgpu) is not
under the lock: with MPS the driver enforces each client's limit anyway.

Must not charge or decide anything: the session and its tables do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

WAIT = 10.0  # seconds a call waits for the other executors' side of the lock
_FIRST_NAP = 50e-6
_LONGEST_NAP = 5e-3


class DeviceMemoryLock:
    """``with lock:`` takes it shared (a call that takes or gives back memory);
    ``with lock.measuring():`` exclusive. Re-entrant in one thread: the outermost
    hold decides, and a measurement inside a shared hold raises it to exclusive
    for its span."""

    def __init__(self, wait: float = WAIT):
        self.wait = wait
        self._local = threading.RLock()
        self._fd: int | None = None
        self._path = ""
        self._held: list[int] = []  # flock modes of the nested holds (under _local)
        self._warned = False

    def attach(self, directory: str | os.PathLike, gpu: str) -> bool:
        """Share the lock with every executor given the same ``directory`` for the
        GPU named ``gpu`` (its UUID). False (and this process's lock only) when the
        lock file cannot be opened."""
        path = Path(directory) / f"{_file_name(gpu)}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("device-memory lock %s cannot be opened (%s): module loads and graph "
                        "instantiations are measured under this executor's lock only, and "
                        "another VM's release on the GPU may skew them", path,
                        exc.strerror or exc)
            return False
        with self._local:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._path = fd, str(path)
        return True

    @property
    def shared_with(self) -> str:
        """The lock file shared with other executors ('' when none)."""
        return self._path if self._fd is not None else ""

    def acquire(self, blocking: bool = True) -> bool:
        """As threading.RLock's, shared: False when ``blocking`` is false and another
        thread of this process holds it."""
        if not self._local.acquire(blocking):
            return False
        try:
            self._enter(fcntl.LOCK_SH)
        finally:
            self._local.release()  # _enter holds it once more
        return True

    def release(self) -> None:
        self._exit()

    def __enter__(self):
        self._enter(fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc) -> None:
        self._exit()

    @contextlib.contextmanager
    def measuring(self):
        self._enter(fcntl.LOCK_EX)
        try:
            yield self
        finally:
            self._exit()

    def _enter(self, mode: int) -> None:
        self._local.acquire()
        try:
            now = self._held[-1] if self._held else fcntl.LOCK_UN
            want = fcntl.LOCK_EX if fcntl.LOCK_EX in (now, mode) else mode
            if want != now:
                self._flock(want)
            self._held.append(want)
        except BaseException:
            self._local.release()
            raise

    def _exit(self) -> None:
        try:
            mine = self._held.pop()
            outer = self._held[-1] if self._held else fcntl.LOCK_UN
            if outer != mine:
                self._flock(outer)  # back to the outer hold's mode, or let go
        finally:
            self._local.release()

    def _flock(self, mode: int) -> None:
        if self._fd is None:
            return
        if mode == fcntl.LOCK_UN:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            return
        deadline = time.monotonic() + self.wait
        nap = _FIRST_NAP
        while True:
            try:
                fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise
            if time.monotonic() >= deadline:
                break
            time.sleep(nap)
            nap = min(nap * 2, _LONGEST_NAP)
        if not self._warned:
            log.warning("another executor on this GPU held the device-memory lock (%s) past "
                        "%.0f s: going on without it, so a measured charge may be skewed "
                        "(said once)", self._path, self.wait)
            self._warned = True


def _file_name(gpu: str) -> str:
    """A GPU UUID as a file name: its letters, digits and dashes only."""
    name = "".join(c for c in gpu if c.isalnum() or c == "-")[:80]
    return f"gpu-{name or 'unnamed'}"
