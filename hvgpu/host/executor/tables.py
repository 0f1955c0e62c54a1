"""What a session keeps about one guest's objects: address ranges and handle numbers.

Pure bookkeeping for the session's checks (is this address range the guest's?
is this handle the guest's?); it must not import CUDA or do I/O.
"""

from __future__ import annotations

import bisect
from typing import Any, Protocol

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P



class Mirror(Protocol):
    """Another holder of the same ranges (the session's C loop), told of every change so
    that it never vouches for a range the table no longer holds."""

    def add_range(self, start: int, size: int) -> None: ...

    def drop_range(self, start: int) -> None: ...


class Allocations:
    """The device ranges this guest allocated, for bounds checks."""

    def __init__(self, mirror: Mirror | None = None):
        self.starts: list[int] = []
        self.sizes: dict[int, int] = {}
        self.mirror = mirror

    def add(self, ptr: int, size: int) -> None:
        bisect.insort(self.starts, ptr)
        self.sizes[ptr] = size
        if self.mirror is not None:
            self.mirror.add_range(ptr, size)

    def remove(self, ptr: int) -> None:
        if ptr not in self.sizes:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"0x{ptr:x} is not an allocation of this guest")
        del self.sizes[ptr]
        self.starts.pop(bisect.bisect_left(self.starts, ptr))
        if self.mirror is not None:
            self.mirror.drop_range(ptr)

    def clear(self) -> None:
        for ptr in list(self.starts):
            self.remove(ptr)

    def base_of(self, ptr: int) -> int | None:
        """The start of the allocation ``ptr`` falls in, or None."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0 and ptr < self.starts[i] + self.sizes[self.starts[i]]:
            return self.starts[i]
        return None

    def holds(self, ptr: int, n: int) -> bool:
        i = bisect.bisect_right(self.starts, ptr) - 1
        return i >= 0 and ptr + n <= self.starts[i] + self.sizes[self.starts[i]]

    def check(self, ptr: int, n: int, what: str) -> None:
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            start = self.starts[i]
            if ptr + n <= start + self.sizes[start]:
                return
            if ptr < start + self.sizes[start]:
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                f"{what} 0x{ptr:x}+{n} runs past the end of the "
                                f"{self.sizes[start]}-byte allocation at 0x{start:x}")
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{what} 0x{ptr:x} is not inside any allocation of this guest")

    def __contains__(self, ptr: int) -> bool:
        return ptr in self.sizes

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


class Ranges:
    """Disjoint address intervals [start, end), merged where they touch.

    Mapped memory is registered here by range, not by mapping: a tensor may
    span two neighbouring mappings (expandable segments map chunk by chunk),
    and a copy of it must pass.
    """

    def __init__(self, mirror: Mirror | None = None):
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}
        self.mirror = mirror

    def _insert(self, i: int, start: int, end: int) -> None:
        self.starts.insert(i, start)
        self.ends[start] = end
        if self.mirror is not None:
            self.mirror.add_range(start, end - start)

    def _pop(self, i: int) -> tuple[int, int]:
        start = self.starts.pop(i)
        end = self.ends.pop(start)
        if self.mirror is not None:
            self.mirror.drop_range(start)
        return start, end

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.remove(start, end)
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.ends[self.starts[i - 1]] == start:  # touches the one before
            i -= 1
            start = self._pop(i)[0]
        if i < len(self.starts) and self.starts[i] == end:  # and the one after
            end = self._pop(i)[1]
        self._insert(i, start, end)

    def remove(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.starts) and self.starts[i] < end:
            s, e = self.starts[i], self.ends[self.starts[i]]
            if e <= start:
                i += 1
                continue
            self._pop(i)
            for a, b in ((s, start), (end, e)):  # what is left either side
                if a < b:
                    self._insert(i, a, b)
                    i += 1

    def clear(self) -> None:
        while self.starts:
            self._pop(len(self.starts) - 1)

    def covers(self, ptr: int, n: int) -> bool:
        i = bisect.bisect_right(self.starts, ptr) - 1
        return i >= 0 and ptr + max(n, 1) <= self.ends[self.starts[i]]

    def __len__(self) -> int:
        return len(self.starts)


class Handles:
    """Guest-visible numbers for host objects of one kind."""

    def __init__(self, kind: str):
        self.kind = kind
        self.objects: dict[int, Any] = {}
        self.next = P.FIRST_HANDLE  # below: CUDA's special stream values

    def add(self, obj: Any) -> int:
        handle = self.next
        self.next += 1
        self.objects[handle] = obj
        return handle

    def get(self, handle: int) -> Any:
        try:
            return self.objects[handle]
        except KeyError:
            raise CudaError(P.CUDA_ERROR_INVALID_HANDLE,
                            f"unknown {self.kind} handle {handle}") from None

    def pop(self, handle: int) -> Any:
        obj = self.get(handle)
        del self.objects[handle]
        return obj
