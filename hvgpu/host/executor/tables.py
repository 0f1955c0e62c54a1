"""What a session keeps about one guest's objects: address ranges and handle numbers.

Pure bookkeeping for the session's checks (is this address range the guest's?
is this handle the guest's?); it must not import CUDA or do I/O.
"""

from __future__ import annotations

import bisect
from typing import Any

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

_FIRST_HANDLE = 16  # below: CUDA's special stream values (0, 1, 2)


class Allocations:
    """The device ranges this guest allocated, for bounds checks."""

    def __init__(self):
        self.starts: list[int] = []
        self.sizes: dict[int, int] = {}

    def add(self, ptr: int, size: int) -> None:
        bisect.insort(self.starts, ptr)
        self.sizes[ptr] = size

    def remove(self, ptr: int) -> None:
        if ptr not in self.sizes:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"0x{ptr:x} is not an allocation of this guest")
        del self.sizes[ptr]
        self.starts.pop(bisect.bisect_left(self.starts, ptr))

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

    def __init__(self):
        self.starts: list[int] = []
        self.ends: dict[int, int] = {}

    def add(self, start: int, end: int) -> None:
        if start >= end:
            return
        self.remove(start, end)
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.ends[self.starts[i - 1]] == start:  # touches the one before
            i -= 1
            start = self.starts[i]
            del self.ends[start]
            self.starts.pop(i)
        if i < len(self.starts) and self.starts[i] == end:  # and the one after
            end = self.ends.pop(end)
            self.starts.pop(i)
        self.starts.insert(i, start)
        self.ends[start] = end

    def remove(self, start: int, end: int) -> None:
        if start >= end:
            return
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.starts) and self.starts[i] < end:
            s = self.starts[i]
            e = self.ends[s]
            if e <= start:
                i += 1
                continue
            del self.ends[s]
            self.starts.pop(i)
            for a, b in ((s, start), (end, e)):  # what is left either side
                if a < b:
                    self.starts.insert(i, a)
                    self.ends[a] = b
                    i += 1

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
        self.next = _FIRST_HANDLE

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
