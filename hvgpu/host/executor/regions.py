"""Regions on the executor's side: mapped, registered, bounded.

A region is memory a guest and its executor both map (hvgpu/virtio/region.py):
a sealed memfd the guest passed with REGION_ATTACH, or the VM's ivshmem file, whose
descriptor only the agent opens. The executor maps it, registers it with the
driver so copies from and to it are DMA, and hands out page-aligned room in it
(REGION_ALLOC). What a guest names in a copy is (region, offset, size), checked
here against the region's bounds and, in the VM's device region (its processes share it), against
the room this connection was given: the other processes of the same VM keep
theirs.

Every region counts against one budget per executor (the slice's region
limit, set at attach; for host-local use, the agent's). Nothing is ever read
back from a region but a copy's bytes: the guest writes it at will.

Must not open files (the agent opens the VM's region; guests send memfds) or
import CUDA (the device does the registering).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import secrets
import stat
import threading

from hvgpu.errors import CudaError
from hvgpu.host.executor import host_maps
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R

MAX_REGIONS = 256  # per connection: its memfds (one per pinned allocation) and the VM's region
MAX_ROOMS = 4096  # REGION_ALLOCs one connection may hold at once
_SEALS_NEEDED = fcntl.F_SEAL_SHRINK  # without it the guest could cut the mapping under us


def _invalid(why: str) -> CudaError:
    return CudaError(P.CUDA_ERROR_INVALID_VALUE, why)


class Budget:
    """Bytes of regions an executor maps at once, against one limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.lock = threading.Lock()

    def take(self, n: int, what: str) -> None:
        with self.lock:
            if self.used + n > self.limit:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                                f"{what} of {n} bytes exceeds the region limit "
                                f"({self.used} of {self.limit} bytes in use; set with "
                                "hvgpu attach --region)" if self.limit else
                                f"{what}: this VM has no region (hvgpu attach --region)")
            self.used += n

    def give(self, n: int) -> None:
        with self.lock:
            self.used = max(0, self.used - n)


class Rooms:
    """First-fit, page-aligned room in [start, end)."""

    def __init__(self, start: int, end: int):
        self.free = [(start, end)] if end > start else []  # sorted, coalesced
        self.lock = threading.Lock()

    def take(self, size: int) -> int | None:
        size = R.align_up(max(size, 1))
        with self.lock:
            for i, (lo, hi) in enumerate(self.free):
                if hi - lo >= size:
                    if hi - lo == size:
                        del self.free[i]
                    else:
                        self.free[i] = (lo + size, hi)
                    return lo
        return None

    def give(self, at: int, size: int) -> None:
        size = R.align_up(max(size, 1))
        with self.lock:
            free = self.free
            i = 0
            while i < len(free) and free[i][0] < at:
                i += 1
            free.insert(i, (at, at + size))
            merged: list[tuple[int, int]] = []
            for lo, hi in free:
                if merged and merged[-1][1] == lo:
                    merged[-1] = (merged[-1][0], hi)
                else:
                    merged.append((lo, hi))
            self.free = merged


class Region:
    """One mapping, registered with the device for DMA. Owns the descriptor it is
    given: closed here, whether or not the region can be had."""

    def __init__(self, fd: int, size: int, device, *, kind: int, vgpu: int = 0):
        self.kind, self.size, self.device = kind, size, device
        self.token = secrets.token_bytes(R.TOKEN_SIZE)
        try:
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:  # sealed against writing, a huge-page memfd not so aligned, ...
            status = P.CUDA_ERROR_INVALID_VALUE if kind == R.KIND_MEMFD else P.HV_INTERNAL
            raise CudaError(status, f"the region cannot be mapped read-write: "
                                    f"{exc.strerror}") from None
        finally:
            os.close(fd)
        self._anchor = (ctypes.c_char * size).from_buffer(self.map)
        self.addr = ctypes.addressof(self._anchor)
        self.registered = False
        try:
            device.host_register(self.addr, size)
            self.registered = True
        except BaseException:
            self.close()
            raise
        start = R.DATA_OFFSET if kind == R.KIND_DEVICE else 0
        self.rooms = Rooms(start, size)
        if kind == R.KIND_DEVICE:
            self.write_header(vgpu)

    def write_header(self, vgpu: int) -> None:
        self.map[:R.HEADER.size] = R.pack_header(self.size, self.token, vgpu)

    def close(self) -> None:
        if self.registered:
            self.registered = False
            try:
                self.device.host_unregister(self.addr)
            except CudaError:
                pass
        self._anchor = None
        self.map.close()


def check_memfd(fd: int, size: int) -> None:
    """A memfd the guest passed: a regular file, sealed against shrinking, at least
    ``size`` bytes. Raises (the caller closes fd)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _invalid("the descriptor passed with REGION_ATTACH is not a memfd")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        raise _invalid("the descriptor passed with REGION_ATTACH is not a memfd "
                       "(it takes no seals)") from None
    if not seals & _SEALS_NEEDED:
        raise _invalid("the memfd passed with REGION_ATTACH must be sealed against shrinking "
                       "(F_SEAL_SHRINK)")
    if size <= 0 or st.st_size < size:
        raise _invalid(f"the memfd holds {st.st_size} bytes, REGION_ATTACH said {size}")
    if size % mmap.PAGESIZE:
        raise _invalid(f"a region's size must be a multiple of {mmap.PAGESIZE} bytes")


class Attached:
    """A region as one connection sees it: its own memfd (all of it is the
    connection's) or the VM's device region (only the rooms it took are)."""

    def __init__(self, region: Region, owned: bool):
        self.region = region
        self.owned = owned
        self.rooms: dict[int, int] = {}  # offset -> size, in the VM's device region
        # room start (0: an owned region whole) -> its mapping at the guest's address
        self.maps: dict[int, host_maps.HostMap] = {}

    def mappable(self, offset: int, size: int) -> None:
        """What HOST_MAP may map: an owned region whole, or one of this connection's
        rooms whole (its size rounded up to pages, as Rooms hands them out), once."""
        if self.owned:
            whole = offset == 0 and size == self.region.size
        else:
            whole = offset in self.rooms and size == R.align_up(max(self.rooms[offset], 1))
        if not whole:
            raise _invalid(f"HOST_MAP: offset {offset} + {size} bytes is not a whole "
                           "allocation of this connection in the region")
        if offset in self.maps:
            raise _invalid(f"HOST_MAP: offset {offset} of the region is mapped already")

    def unmap(self, at: int, books=None) -> None:
        """Undoes the mapping of room ``at`` (after the device is done with it)."""
        mapped = self.maps.pop(at, None)
        if mapped is not None:
            if books is not None:
                books.remove(mapped.addr)
            mapped.close()

    def take(self, size: int) -> int:
        if len(self.rooms) >= MAX_ROOMS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"a connection holds at most {MAX_ROOMS} allocations in a region")
        if size <= 0 or size > self.region.size:
            raise _invalid(f"no room of {size} bytes in a region of {self.region.size}")
        at = self.region.rooms.take(size)
        if at is None:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"the region has no free room of {size} bytes")
        self.rooms[at] = size
        return at

    def give(self, at: int, books=None) -> None:
        size = self.rooms.pop(at, None)
        if size is None:
            raise _invalid(f"offset {at} is not an allocation of this connection")
        self.unmap(at, books)
        self.region.rooms.give(at, size)

    def give_all(self, books=None) -> None:
        for at in list(self.rooms):
            self.give(at, books)
        for at in list(self.maps):  # an owned region's, mapped whole
            self.unmap(at, books)

    def address(self, offset: int, size: int, what: str) -> int:
        """The executor's address of [offset, offset+size) once it is the guest's."""
        region = self.region
        if offset < 0 or size < 0 or offset + size > region.size:
            raise _invalid(f"{what}: offset {offset} + {size} bytes lies outside the "
                           f"{region.size}-byte region")
        if not self.owned:
            if not any(at <= offset and offset + size <= at + n for at, n in self.rooms.items()):
                raise _invalid(f"{what}: offset {offset} + {size} bytes is not inside an "
                               "allocation of this connection")
        return region.addr + offset


class ExecutorRegions:
    """What an executor's sessions share: the budget, and the VM's device region,
    mapped on the first REGION_ATTACH that asks for it and kept until the executor
    ends (QEMU keeps the file as long as the VM runs)."""

    def __init__(self, limit: int, open_device=None, vgpu: int = 0):
        self.budget = Budget(limit)
        self.open_device = open_device  # () -> (fd, size); None: no device region
        self.vgpu = vgpu
        self.device_region: Region | None = None
        self.lock = threading.Lock()

    @property
    def caps(self) -> int:
        caps = P.CAP_REGION_MEMFD if self.budget.limit else 0
        return caps | (P.CAP_REGION_DEVICE if self.open_device and self.budget.limit else 0)

    def attach_device(self, device) -> Region:
        with self.lock:
            if self.device_region is None:
                if self.open_device is None or not self.budget.limit:
                    raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                                    "this VM has no region device (hvgpu attach --region)")
                fd, size = self.open_device()
                try:
                    if size > self.budget.limit or size % mmap.PAGESIZE:
                        raise CudaError(P.HV_INTERNAL, f"the VM's region is {size} bytes, its "
                                        f"limit {self.budget.limit}")
                    self.budget.take(size, "the VM's region device")
                except BaseException:
                    os.close(fd)
                    raise
                try:
                    self.device_region = Region(fd, size, device, kind=R.KIND_DEVICE,
                                                vgpu=self.vgpu)
                except BaseException:
                    self.budget.give(size)
                    raise
            else:
                self.device_region.write_header(self.vgpu)  # the guest may have clobbered it
            return self.device_region

    def close(self) -> None:
        with self.lock:
            if self.device_region is not None:
                self.budget.give(self.device_region.size)
                self.device_region.close()
                self.device_region = None
