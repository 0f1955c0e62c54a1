"""Memory accounting of one slice, across every executor that serves it.

The agent keeps one ledger per slice; executors reserve before they allocate
and release after they free, so a slice's guests can never hold more than its
quota together, whatever the number of their connections or executor
processes. A refusal is CUDA's own out-of-memory status, raised before the
driver is asked. Must not talk to CUDA or sockets.
"""

from __future__ import annotations

import threading
from typing import Callable

from hvgpu.errors import CudaError
from hvgpu.units import format_size
from hvgpu.virtio import protocol as P


class QuotaLedger:
    """``limit``: the slice's memory quota, read where it is kept (a callable), or a
    fixed number of bytes."""

    def __init__(self, limit: int | Callable[[], int]):
        self._limit = limit if callable(limit) else (lambda: limit)
        self._held: dict[object, int] = {}
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        return self._limit()

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def reserve(self, holder: object, n: int) -> None:
        with self._lock:
            used = sum(self._held.values())
            limit = self.limit
            if used + n > limit:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                                f"the slice's quota is {format_size(limit)}; "
                                f"{format_size(used)} in use, {format_size(n)} asked for")
            self._held[holder] = self._held.get(holder, 0) + n

    def release(self, holder: object, n: int) -> None:
        with self._lock:
            left = self._held.get(holder, 0) - n
            if left > 0:
                self._held[holder] = left
            else:
                self._held.pop(holder, None)

    def drop(self, holder: object) -> int:
        """Forget everything ``holder`` held (its process is gone)."""
        with self._lock:
            return self._held.pop(holder, 0)


class LocalQuota:
    """The session's view of a ledger in the same process (tests, one-process use)."""

    def __init__(self, ledger: QuotaLedger, holder: object = "local"):
        self.ledger, self.holder = ledger, holder

    def reserve(self, n: int) -> None:
        self.ledger.reserve(self.holder, n)

    def release(self, n: int) -> None:
        self.ledger.release(self.holder, n)

    def usage(self) -> tuple[int, int]:
        return self.ledger.used, self.ledger.limit
