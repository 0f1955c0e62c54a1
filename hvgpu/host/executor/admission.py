"""What one VM's guests may hold of the host at once, beyond its GPU quota.

Bounds that a hostile guest would otherwise multiply by its connections:

- :class:`UploadBudget`: payload bytes an executor holds whole before using them
  (module images, CUDA C++ sources with their headers). Each such frame reserves
  its announced size before a byte is read; a frame that does not fit is refused
  (CUDA_ERROR_OUT_OF_MEMORY) and its payload skipped without being held. With the
  reader's mid-frame silence timeout, a stalled upload costs at most this budget,
  and only until it is closed.
- :class:`CompileSlots`: NVRTC children a VM runs at once. Slots are lock files in
  the VM's compile-cache directory, which every executor of that VM (each vGPU's,
  a retiring one's) shares, so the bound is the VM's, not a connection's or a
  process's; a compilation that finds every slot taken waits for one (the guest's
  call waits, as a busy compiler makes it wait), and past ``max_waiting`` waiters
  in one executor it is refused.
- :class:`NodeBudget`: graph nodes (captured or added, in graphs and instantiated
  graphs) one executor holds; executor/graphs.py also bounds each connection's.

Must not decide what is compiled or loaded: the session and nvrtc_policy do.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

UPLOAD_BYTES = 512 << 20  # two of the largest module images at once
COMPILE_SLOTS = 1         # NVRTC children per VM at once (each limited in CPU and memory)
COMPILE_WAITING = 8       # compilations one executor lets wait for a slot
_POLL = 0.05              # how often a waiting compilation looks for a free slot
GRAPH_NODES = 1 << 20     # graph nodes one executor (a VM's vGPU) holds at once
GRAPH_NODES_PER_CONNECTION = 1 << 19


class UploadBudget:
    """Bytes of payload held whole, across the sessions of one executor."""

    def __init__(self, limit: int = UPLOAD_BYTES):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def holding(self, n: int, what: str):
        with self._lock:
            if self.held + n > self.limit:
                held = self.held
                refused = True
            else:
                self.held += n
                refused = False
        if refused:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"a {what} of {n >> 20} MiB does not fit: this VM's executor holds "
                            f"{held >> 20} MiB of uploads of its {self.limit >> 20} MiB; try "
                            "again when they are done")
        try:
            yield
        finally:
            with self._lock:
                self.held -= n


class CompileSlots:
    """At most ``slots`` compilations of one VM at once (lock files in ``directory``,
    shared by the VM's executors; without one, this process's own count)."""

    def __init__(self, directory: str | os.PathLike | None, slots: int = COMPILE_SLOTS,
                 max_waiting: int = COMPILE_WAITING):
        self.directory = Path(directory) if directory else None
        self.slots = max(1, slots)
        self.max_waiting = max_waiting
        self.waiting = 0
        self._lock = threading.Lock()
        self._local = threading.Semaphore(self.slots)

    @contextlib.contextmanager
    def slot(self, timeout: float):
        with self._lock:
            if self.waiting >= self.max_waiting:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                                f"{self.waiting} compilations of this VM are already waiting "
                                "for the compiler; try again when they are done")
            self.waiting += 1
        try:
            fd = self._take(time.monotonic() + timeout)
        finally:
            with self._lock:
                self.waiting -= 1
        try:
            yield
        finally:
            if fd is None:
                self._local.release()
            else:
                os.close(fd)  # and with it the lock

    def _take(self, deadline: float) -> int | None:
        fds: list[int] = []
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                for i in range(self.slots):
                    fds.append(os.open(self.directory / f".compile-slot-{i}", os.O_RDWR
                                       | os.O_CREAT | os.O_CLOEXEC, 0o600))
            except OSError as exc:  # as the cache: a bound of this process's, and compile
                for fd in fds:
                    os.close(fd)
                fds = []
                log.warning("compile slots in %s cannot be made (%s): this executor bounds "
                            "its own compilations only", self.directory, exc.strerror or exc)
        if not fds:
            if not self._local.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise self._busy()
            return None
        try:
            while True:
                for i, fd in enumerate(fds):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    fds[i] = -1  # kept: the caller's now
                    return fd
                if time.monotonic() >= deadline:
                    raise self._busy()
                time.sleep(_POLL)
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)

    def _busy(self) -> CudaError:
        return CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                         "the compiler stayed busy with this VM's other compilations; try again")


class NodeBudget:
    """Graph nodes held across the sessions of one executor: those of captures under
    way, of graphs and of instantiated graphs. The driver keeps each in the executor's
    host memory (about 500 bytes a captured memset, measured), which no GPU quota sees."""

    def __init__(self, limit: int = GRAPH_NODES):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int, what: str) -> None:
        with self._lock:
            if self.held + n > self.limit:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                                f"{what}: this VM's graphs hold {self.held} nodes, and may "
                                f"hold {self.limit} at once; destroy graphs it no longer uses")
            self.held += n

    def count(self, n: int) -> None:
        """Nodes that exist already (a capture's graph, whole): counted, never refused."""
        with self._lock:
            self.held += n

    def give(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)


PROCESS_UPLOADS = UploadBudget()
PROCESS_GRAPH_NODES = NodeBudget()  # an executor process is one VM's vGPU: its sessions share it
_slots: dict[str, CompileSlots] = {}
_slots_lock = threading.Lock()


def compile_slots(directory: str | os.PathLike | None) -> CompileSlots:
    """The one CompileSlots of this process for a VM's cache directory."""
    key = str(directory or "")
    with _slots_lock:
        if key not in _slots:
            _slots[key] = CompileSlots(directory)
        return _slots[key]
