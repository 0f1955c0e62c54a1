"""Pinned memory at the guest's own address: what a kernel reaches through its pointer.

On a device with unified addressing, CUDA maps page-locked host memory into the
device's address space at the host's own address: a kernel dereferences the
program's pointer (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP, or any pinned
memory under UVA), and cuMemHostGetDevicePointer answers that pointer. A guest's
pinned memory lies in a region (``regions.py``) the executor maps already, at an
address of its own. A :class:`HostMap` maps the same pages a second time, at the
address the guest mapped them at (``MAP_FIXED_NOREPLACE``: never over anything the
executor has mapped there, the driver's own reservations included), and registers
that mapping with the driver device-mapped, so the device address of each byte is the
guest's pointer to it and a kernel reads and writes the very bytes the guest sees.

A guest names any address it likes: only page-aligned ranges inside user space
(``LOWEST``..``HIGHEST``) are taken, never one that overlaps device memory or address
reservations of the executor's sessions (:func:`overlaps_device`), and the driver must
answer the mapping's own address as its device pointer, or it is undone. The
mapping shares the region's pages (already counted against the region budget) and
lives exactly as long as the room or region it maps: ``regions.Attached`` closes it
when the room is given back or the region detached.

:class:`HostMaps` is one connection's book of them, for the checks of the ops that
take device addresses (stream memory operations).

Must not open files (it maps again what the region maps) or import CUDA (the device
registers).
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import os

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

LOWEST = 1 << 20  # below: the program's image, mmap_min_addr, NULL's neighbourhood
HIGHEST = 1 << 47  # x86-64's and aarch64's 4-level user space; the driver's UVA is below
_MAP_FIXED_NOREPLACE = 0x100000  # Linux 4.17+; older kernels take it as a hint
_REGISTER = 0x1 | 0x2  # CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_mremap = _libc.mremap
_mremap.restype = ctypes.c_void_p
_mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                    ctypes.c_void_p]
_munmap = _libc.munmap
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2


def _not_supported(why: str) -> CudaError:
    return CudaError(P.CUDA_ERROR_NOT_SUPPORTED, why)


def check_address(addr: int, size: int) -> None:
    """A range a guest asks to be mapped at: page-aligned, inside user space."""
    if addr % mmap.PAGESIZE or size <= 0 or size % mmap.PAGESIZE:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"HOST_MAP: 0x{addr:x}+{size} is not whole pages")
    if addr < LOWEST or addr > HIGHEST - size:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"HOST_MAP: 0x{addr:x}+{size} lies outside user space "
                        f"(0x{LOWEST:x}..0x{HIGHEST:x})")


def _overlap(starts: list[int], sizes, addr: int, size: int) -> bool:
    i = bisect.bisect_right(starts, addr + size - 1) - 1  # the last range starting inside
    return i >= 0 and starts[i] + sizes[starts[i]] > addr


def overlaps_device(sessions, addr: int, size: int) -> bool:
    """Whether [addr, addr + size) meets device memory or an address reservation of any
    of the executor's sessions: where the driver's addresses are no mapping of this
    process (the test double's), MAP_FIXED_NOREPLACE alone would not see them."""
    for s in sessions:
        for book in (s.allocs, s.pools.allocs):
            if _overlap(book.starts, book.sizes, addr, size):
                return True
        if _overlap(s.vmm.res_starts, s.vmm.reserved, addr, size):
            return True
        if s.host_maps.meets(addr, size):
            return True
    return False


class HostMap:
    """[addr, addr + size): the pages the executor maps at ``source`` (in a region's
    shared mapping) mapped once more at addr, registered device-mapped: the device
    address of each byte is its address here."""

    def __init__(self, source: int, size: int, addr: int, device):
        self.addr, self.size, self.device = addr, size, device
        # First the place, taken only where nothing is (an anonymous reservation), then
        # the region's pages moved onto that reservation alone: mremap of a shared
        # mapping with old size 0 maps the same pages again, and MREMAP_FIXED replaces
        # what is at the target, which is by then nothing but the reservation.
        got = _mmap(addr, size, 0,  # PROT_NONE
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED_NOREPLACE, -1, 0)
        if got in (None, _FAILED):
            err = ctypes.get_errno()
            raise _not_supported(f"0x{addr:x}+{size} cannot be mapped in the executor: "
                                 + ("something is mapped there already" if err == errno.EEXIST
                                    else os.strerror(err)))
        if got != addr:  # a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
            _munmap(got, size)
            raise _not_supported(f"the host's kernel would not map at 0x{addr:x} "
                                 "(MAP_FIXED_NOREPLACE needs Linux 4.17)")
        moved = _mremap(source, 0, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, addr)
        if moved != addr:
            err = ctypes.get_errno()
            _munmap(addr, size)
            raise _not_supported(f"the region's pages cannot be mapped again at 0x{addr:x}: "
                                 f"{os.strerror(err)}")
        try:
            device.host_register(addr, size, _REGISTER)
        except BaseException:
            _munmap(addr, size)
            raise
        try:
            dptr = device.host_device_pointer(addr)
        except BaseException:
            self._undo()
            raise
        if dptr != addr:
            self._undo()
            raise _not_supported(f"the device maps 0x{addr:x} at 0x{dptr:x}, not at the "
                                 "same address (no unified addressing)")

    def _undo(self) -> None:
        try:
            self.device.host_unregister(self.addr)
        finally:
            _munmap(self.addr, self.size)

    def close(self) -> None:
        """Once the device is done with it (the caller has synchronised)."""
        if self.size:
            try:
                self._undo()
            except CudaError:
                pass
            self.size = 0


class HostMaps:
    """One connection's device-mapped pinned memory: address -> (region, room start)."""

    def __init__(self):
        self.starts: list[int] = []
        self.entries: dict[int, tuple[int, int, int]] = {}  # addr -> (size, region, room)

    def add(self, addr: int, size: int, region: int, room: int) -> None:
        bisect.insort(self.starts, addr)
        self.entries[addr] = (size, region, room)

    def remove(self, addr: int) -> None:
        if self.entries.pop(addr, None) is not None:
            self.starts.pop(bisect.bisect_left(self.starts, addr))

    def find(self, ptr: int, n: int) -> tuple[int, int] | None:
        """(region, room start) of the mapping holding [ptr, ptr + n), or None."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i < 0:
            return None
        size, region, room = self.entries[self.starts[i]]
        return (region, room) if ptr + n <= self.starts[i] + size else None

    def meets(self, addr: int, size: int) -> bool:
        i = bisect.bisect_right(self.starts, addr + size - 1) - 1
        return i >= 0 and self.starts[i] + self.entries[self.starts[i]][0] > addr

    def __len__(self) -> int:
        return len(self.starts)
