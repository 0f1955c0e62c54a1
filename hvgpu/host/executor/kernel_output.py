"""What kernels print (device-side ``printf``), caught for the guest that ran them.

The driver writes a context's printf buffer to its process's standard output when
it synchronises (and at some launches). In an executor that would be the agent's
log, not the program's terminal. :meth:`KernelOutput.install` points the
executor's fd 1 at a pipe (C stdio's ``stdout`` unbuffered, so nothing lingers in
the process), a thread keeps the pipe drained so the driver never blocks on it,
and a session takes what has gathered before each reply it sends (``take``): the
guest writes it to its own stdout before the call returns, where the program's
output would have had it natively.

All sessions of an executor share one context (a VM's vGPU), so what a
synchronisation flushes may include a kernel of another process of the same VM:
it goes to the process whose call flushed it. Never another VM's: each VM has its
executors. At most ``LIMIT`` bytes wait; beyond that the oldest are dropped and
the guest is told how many.

Must not write to fd 1 itself, nor hold the lock while blocking.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import threading

log = logging.getLogger(__name__)

LIMIT = 16 << 20  # bytes held for the guests at most
_READ = 1 << 16


class KernelOutput:
    def __init__(self, read_fd: int):
        self._fd = read_fd
        self._lock = threading.Lock()
        self._held = bytearray()
        self._dropped = 0
        os.set_blocking(read_fd, False)
        threading.Thread(target=self._drain, name="kernel-output", daemon=True).start()

    @classmethod
    def install(cls) -> "KernelOutput | None":
        """fd 1 becomes the pipe's write end; None (and stdout left alone) on failure."""
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
            libc = ctypes.CDLL(None)
            stdout = ctypes.c_void_p.in_dll(libc, "stdout")
            libc.fflush(stdout)
            os.dup2(w, 1)  # without O_CLOEXEC: the driver's helper processes write here too
            os.close(w)
            libc.setvbuf(stdout, None, 2, 0)  # _IONBF
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("kernel printf output stays in the executor's log: %s", exc)
            return None
        return cls(r)

    def _read_available(self) -> bool:
        """Take what the pipe holds now (lock held); never waits. False once the pipe
        has no writer left."""
        while True:
            try:
                chunk = os.read(self._fd, _READ)
            except BlockingIOError:
                return True
            except OSError as exc:
                log.warning("kernel output pipe: %s", exc)
                return False
            if not chunk:
                return False
            self._held += chunk
            excess = len(self._held) - LIMIT
            if excess > 0:
                del self._held[:excess]
                self._dropped += excess

    def _drain(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        open_ = True
        while open_:
            poller.poll()
            with self._lock:
                open_ = self._read_available()

    def take(self) -> bytes:
        """What kernels printed since the last take (a note first if some was dropped)."""
        with self._lock:
            self._read_available()
            if not self._held:
                return b""
            out = bytes(self._held)
            self._held.clear()
            dropped, self._dropped = self._dropped, 0
        if dropped:
            out = (f"[hvgpu: {dropped} bytes of kernel printf output were dropped: more than "
                   f"{LIMIT >> 20} MiB waited for a synchronisation]\n").encode() + out
        return out
