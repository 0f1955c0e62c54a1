"""The address window of a VM's vGPU N >= 1: which addresses in it are taken.

A VM's vGPUs are separate executor processes, each with its own CUDA context,
yet CUDA's unified addressing promises a program that no two of its devices
hand out the same address. So vGPU 0 keeps the driver's own allocator and vGPU
N >= 1 allocates inside the range ``window_hint(N)`` names. This module is the
bookkeeping of that range: first-fit allocations and aligned reservations, in
whole granules so that every hole left stays aligned for a mapping.

Pure arithmetic: it must not call CUDA. ``cuda_device`` (the one package that
owns the driver) reserves the range and maps memory into what this hands out.
"""

from __future__ import annotations

import threading

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

WINDOW_BASE = 0x6000_0000_0000
WINDOW_SIZE = 1 << 40


def window_hint(index: int) -> int:
    """Where vGPU ``index`` (>= 1) of a VM asks the driver to put its window."""
    return WINDOW_BASE + (index - 1) * WINDOW_SIZE


class AddressWindow:
    """Free ranges (holes) and taken ones (sizes, by start) of one window."""

    def __init__(self, base: int, size: int, granularity: int):
        self.base = base
        self.granularity = granularity
        self.holes = [(base, size)]  # free ranges, by address
        self.sizes: dict[int, int] = {}
        self.lock = threading.Lock()

    def footprint(self, size: int) -> int:
        return -(-max(size, 1) // self.granularity) * self.granularity

    def take(self, size: int) -> tuple[int, int]:
        """Room for an allocation of ``size`` bytes: (its address, its footprint)."""
        n = self.footprint(size)
        with self.lock:
            i = next((i for i, (_, free) in enumerate(self.holes) if free >= n), None)
            if i is None:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, "the vGPU's address window is full")
            at, free = self.holes[i]
            self.holes[i:i + 1] = [(at + n, free - n)] if free > n else []
            self.sizes[at] = n
        return at, n

    def reserve(self, size: int, alignment: int) -> int:
        """Addresses only, aligned to ``alignment`` (at least the granularity); whole
        granules, so that every hole left stays aligned for take()'s mappings."""
        align = max(alignment, self.granularity)
        size = self.footprint(size)
        with self.lock:
            for i, (at, free) in enumerate(self.holes):
                start = -(-at // align) * align
                if start + size <= at + free:
                    self.holes[i:i + 1] = [(a, n) for a, n in ((at, start - at),
                                           (start + size, at + free - start - size)) if n]
                    self.sizes[start] = size
                    return start
        raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, "the vGPU's address window is full")

    def unreserve(self, at: int, size: int) -> None:
        if self.sizes.get(at) != self.footprint(size):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"0x{at:x}+{size} is not a reservation")
        self.give_back(at)

    def size_of(self, at: int) -> int:
        """The footprint of the allocation at ``at``; INVALID_VALUE where there is none."""
        n = self.sizes.get(at)
        if n is None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"0x{at:x} is not an allocation")
        return n

    def give_back(self, at: int) -> None:
        with self.lock:
            n = self.sizes.pop(at)
            self.holes.append((at, n))
            self.holes.sort()
            merged = [self.holes[0]]
            for start, size in self.holes[1:]:
                last, last_size = merged[-1]
                if last + last_size == start:
                    merged[-1] = (last, last_size + size)
                else:
                    merged.append((start, size))
            self.holes = merged
