"""A guest's virtual memory management (VMM), as its session keeps it.

The VMM ops (``ops/vmm.py``) check their arguments with the ``check_*``
functions here and hand the rest to :class:`VirtualMemory`. It checks that a
guest maps, frees and copies only what it created itself (handle numbers and
address ranges are per connection), charges the slice's quota for
``cuMemCreate`` before the driver takes the memory, and when the guest
leaves releases everything in the order CUDA needs: mappings unmapped,
physical memory released, addresses freed.

Only device-located memory of the connection's own device is served, compressible
or not, exportable as a POSIX file descriptor at most: other handle types, host or
NUMA locations, RDMA and usage flags are CUDA_ERROR_NOT_SUPPORTED, with the reason.
Compressible memory is charged its size as any other (whole granules of its own
granularity). An export (cuMemExportToShareableHandle) is a token of the executor's
table (``ipc.Exports``) that the guest's other processes import on this executor
(they share its context); the driver's memory goes once no connection holds it, and
its charge stays on the slice until then.

Must not import CUDA (the device does every call) and must not touch other guests.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor import ipc
from hvgpu.host.executor.tables import Ranges
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

# CUDA's numbers
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ACCESS_FLAGS = (0, 1, 3)  # CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ, _READWRITE
_READWRITE = 3
POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: exported among the VM's processes
_COMPRESSION = (0, 1)  # CU_MEM_ALLOCATION_COMP_NONE, CU_MEM_ALLOCATION_COMP_GENERIC
_ACCESS_DESC = struct.Struct("<iiI")  # CUmemAccessDesc: location (type, id), flags
assert _ACCESS_DESC.size == P.ACCESS_DESC_SIZE
_PAGE = 4096  # what cuMemAddressReserve asks of a size and an address hint

# What one guest may make its session hold (host memory for the bookkeeping, driver objects).
MAX_OBJECTS = 1 << 18  # reservations, physical allocations and mappings at once
MAX_RESERVED = 1 << 45  # bytes of reserved addresses (32 TiB: far beyond any GPU's memory)

_NOT_SUPPORTED = P.CUDA_ERROR_NOT_SUPPORTED
_INVALID = P.CUDA_ERROR_INVALID_VALUE


def check_location(loc_type: int, loc_id: int, what: str) -> None:
    """Only the connection's own device (0) is a location this guest may name."""
    if loc_type != _ON_DEVICE:
        raise CudaError(_NOT_SUPPORTED, f"{what} at location type {loc_type} (host or NUMA "
                        "memory) is not served; only device memory is")
    if loc_id != 0:
        raise CudaError(P.CUDA_ERROR_INVALID_DEVICE, f"{what} on device {loc_id}: this connection's device is 0")


def check_granularity(option: int) -> None:
    if option not in (0, 1):
        raise CudaError(_INVALID, f"granularity option {option} is not 0 or 1")


def aligned(device, value: int, what: str, compression: int = 0) -> None:
    g = device.mem_granularity(0, compression) if compression else device.mem_granularity(0)
    if value % g:
        raise CudaError(_INVALID, f"{what} 0x{value:x} is not a multiple of the allocation "
                                  f"granularity ({g} bytes)")


def check_reserve(size: int, alignment: int, addr: int, flags: int) -> None:
    """What cuMemAddressReserve refuses whatever the guest holds."""
    if flags:
        raise CudaError(_INVALID, f"cuMemAddressReserve flags must be 0, not {flags}")
    if not size or size % _PAGE or addr % _PAGE:
        raise CudaError(_INVALID, f"0x{addr:x}+{size}: a reservation's size is a non-zero "
                                  f"multiple of {_PAGE} bytes, its address hint a multiple")
    if alignment & (alignment - 1) or alignment > MAX_RESERVED:
        raise CudaError(_INVALID, f"alignment {alignment} is not a power of two")


def check_alloc_flags(alloc_flags: int) -> int:
    """CUmemAllocationProp's allocFlags as MEM_CREATE carries them (compressionType in the
    first byte, gpuDirectRDMACapable in the second, usage in the last two): the
    compression type, the only flag served."""
    compression, rest = alloc_flags & 0xFF, alloc_flags >> 8
    if rest:
        raise CudaError(_NOT_SUPPORTED, "GPUDirect RDMA or usage-flagged memory is not served")
    if compression not in _COMPRESSION:
        raise CudaError(_INVALID, f"compression type {compression} is not "
                                  "CU_MEM_ALLOCATION_COMP_NONE or _GENERIC")
    return compression


def check_create(device, size: int, type_: int, handle_types: int, loc_type: int,
                 loc_id: int, alloc_flags: int) -> int:
    """Only pinned memory of this device, in whole granules, exportable as a POSIX file
    descriptor at most; its compression type."""
    if type_ != _PINNED:
        raise CudaError(_NOT_SUPPORTED, f"allocation type {type_} is not served; only "
                                        "CU_MEM_ALLOCATION_TYPE_PINNED is")
    if handle_types & ~POSIX_FD:
        raise CudaError(_NOT_SUPPORTED, f"exportable memory (handle types 0x{handle_types:x}) "
                                        "is not served but as a POSIX file descriptor: it "
                                        "would be shared outside the VM's executor")
    check_location(loc_type, loc_id, "memory")
    compression = check_alloc_flags(alloc_flags)
    if not size:
        raise CudaError(_INVALID, "cannot create 0 bytes")
    aligned(device, size, "size", compression)
    return compression


def check_map(flags: int) -> None:
    if flags:
        raise CudaError(_INVALID, f"cuMemMap flags must be 0, not {flags}")


def check_access(descs: bytes) -> int:
    """The access flags of 1 to 64 CUmemAccessDesc, each for this device (the last
    descriptor's flags are the ones set)."""
    if not descs or len(descs) % _ACCESS_DESC.size \
            or len(descs) > P.MAX_ACCESS_DESCS * _ACCESS_DESC.size:
        raise CudaError(_INVALID, f"{len(descs)} bytes is not 1 to {P.MAX_ACCESS_DESCS} "
                                  "access descriptors")
    flags = 0
    for loc_type, loc_id, flags in _ACCESS_DESC.iter_unpack(descs):
        check_location(loc_type, loc_id, "access")
        if flags not in _ACCESS_FLAGS:
            raise CudaError(_INVALID, f"access flags {flags} are not 0, 1 or 3")
    return flags


def quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # releasing at exit: report, never stop releasing
        log.debug("release failed: %s", exc)


class _Physical:
    """One cuMemCreate (or import): alive while the guest holds a reference or a mapping
    uses it; shared with other connections once exported (``export``)."""

    __slots__ = ("obj", "size", "refs", "maps", "handle_types", "charged", "export",
                 "compression")

    def __init__(self, obj: Any, size: int, handle_types: int = 0, charged: bool = True,
                 export=None, compression: int = 0):
        self.obj, self.size, self.refs, self.maps = obj, size, 1, 0
        self.handle_types, self.charged, self.export = handle_types, charged, export
        self.compression = compression  # what the driver granted, not what was asked


class VirtualMemory:
    """Reservations, physical allocations and mappings of one guest."""

    def __init__(self, device, charge: Callable[[int], None], uncharge: Callable[[int], None],
                 lock: threading.Lock, exports=None,
                 hand_over: Callable[[int], Callable[[], None]] | None = None):
        self.device, self.charge, self.uncharge, self.lock = device, charge, uncharge, lock
        self.exports, self.hand_over = exports, hand_over  # ipc.Exports; Ledger.hand_over
        self.res_starts: list[int] = []
        self.reserved: dict[int, int] = {}  # start -> size
        self.reserved_bytes = 0
        self.physical: dict[int, _Physical] = {}  # handle number -> allocation
        self.next_handle = 16
        self.map_starts: list[int] = []
        self.mappings: dict[int, tuple[int, int]] = {}  # start -> (size, handle number)
        self.accessible = Ranges()  # mapped and readable-writable: copies may use it

    def __len__(self) -> int:
        return len(self.reserved) + len(self.physical) + len(self.mappings)

    def granularity(self, option: int, compression: int = 0) -> int:
        """cuMemGetAllocationGranularity (``check_granularity`` checked the option)."""
        if compression:
            return self.device.mem_granularity(option, compression)
        return self.device.mem_granularity(option)

    def _aligned(self, value: int, what: str) -> None:
        aligned(self.device, value, what)

    def _room(self) -> None:
        if len(self) >= MAX_OBJECTS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest holds {MAX_OBJECTS} reservations, allocations and "
                            "mappings, as many as the agent allows")

    # -- addresses --------------------------------------------------------------

    def reserve(self, size: int, alignment: int, addr: int) -> int:
        """cuMemAddressReserve (``check_reserve`` checked the arguments)."""
        if self.reserved_bytes + size > MAX_RESERVED:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {self.reserved_bytes} bytes of addresses reserved; "
                            f"{size} more would pass the agent's limit of {MAX_RESERVED}")
        self._room()
        ptr = self.device.address_reserve(size, alignment, addr)
        bisect.insort(self.res_starts, ptr)
        self.reserved[ptr] = size
        self.reserved_bytes += size
        return ptr

    def free_addresses(self, ptr: int, size: int) -> None:
        if self.reserved.get(ptr) != size:
            raise CudaError(_INVALID, f"0x{ptr:x}+{size} is not a reservation of this guest")
        i = bisect.bisect_left(self.map_starts, ptr)
        if i < len(self.map_starts) and self.map_starts[i] < ptr + size:
            raise CudaError(_INVALID, f"the reservation at 0x{ptr:x} still has memory mapped "
                                      "in it; unmap it first")
        self.device.address_free(ptr, size)
        del self.reserved[ptr]
        self.res_starts.pop(bisect.bisect_left(self.res_starts, ptr))
        self.reserved_bytes -= size

    def _in_reservation(self, ptr: int, size: int) -> bool:
        i = bisect.bisect_right(self.res_starts, ptr) - 1
        return i >= 0 and ptr + size <= self.res_starts[i] + self.reserved[self.res_starts[i]]

    # -- physical memory ------------------------------------------------------------

    def create(self, size: int, handle_types: int = 0, compression: int = 0) -> int:
        """cuMemCreate of device memory (``check_create`` checked the arguments)."""
        self._room()
        self.charge(size)  # a multiple of the granularity: what the driver takes
        try:
            with self.lock:
                if compression:  # the driver may make it uncompressed: it says which
                    obj = self.device.mem_create(size, compression)
                    try:
                        granted = self.device.mem_compression(obj)
                    except CudaError:
                        quietly(self.device.mem_release, obj)
                        raise
                else:
                    obj, granted = self.device.mem_create(size), 0
        except CudaError:
            self.uncharge(size)
            raise
        return self._add(_Physical(obj, size, handle_types, compression=granted))

    def _add(self, p: _Physical) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.physical[handle] = p
        return handle

    def export(self, handle: int, owner) -> bytes:
        """cuMemExportToShareableHandle: the token the VM's other processes import it by
        (the same each time)."""
        p = self._handle(handle)
        if not p.handle_types & POSIX_FD:
            raise CudaError(_INVALID, f"memory allocation handle {handle} was not created "
                                      "exportable as a POSIX file descriptor")
        if p.export is None:
            device, lock, obj = self.device, self.lock, p.obj
            made = self.exports.export(ipc.VMM, owner, size=p.size, obj=obj)
            made.uncharge = lambda: None

            def last() -> None:  # no connection holds it any more
                with lock:
                    quietly(device.mem_release, obj)
                made.uncharge()
            made.last = last
            p.export = made
        return p.export.token

    def import_(self, export) -> int:
        """cuMemImportFromShareableHandle: a handle of this guest for the memory."""
        self._room()
        if not self.exports.hold(export):
            raise CudaError(_INVALID, "the shareable handle's memory is gone")
        return self._add(_Physical(export.obj, export.size, POSIX_FD, False, export))

    def _handle(self, handle: int) -> _Physical:
        p = self.physical.get(handle)
        if p is None or not p.refs:
            raise CudaError(P.CUDA_ERROR_INVALID_HANDLE,
                            f"unknown memory allocation handle {handle}")
        return p

    def release(self, handle: int) -> None:
        p = self._handle(handle)
        p.refs -= 1
        self._maybe_free(handle, p)

    def _maybe_free(self, handle: int, p: _Physical) -> None:
        if p.refs or p.maps:
            return
        del self.physical[handle]
        if p.export is not None:  # shared: the driver has it back once no one holds it
            self._let_go(p)
            return
        with self.lock:
            self.device.mem_release(p.obj)
        self.uncharge(p.size)  # only once the driver gave it back; else at the session's end

    def _let_go(self, p: _Physical) -> None:
        if p.charged:  # stays charged to the slice until the last holder lets go
            p.export.uncharge = self.hand_over(p.size)
        self.exports.let_go(p.export)

    def retain(self, ptr: int) -> int:
        start = self._mapping_at(ptr)
        if start is None:
            raise CudaError(_INVALID, f"0x{ptr:x} is not inside a mapping of this guest")
        handle = self.mappings[start][1]
        self.physical[handle].refs += 1
        return handle

    def handle_size(self, handle: int) -> int:
        return self._handle(handle).size

    def handle_props(self, handle: int) -> tuple[int, int]:
        """(size, allocation flags as MEM_CREATE carries them) of a handle of this guest."""
        p = self._handle(handle)
        return p.size, p.compression

    # -- mappings ---------------------------------------------------------------------

    def _mapping_at(self, ptr: int) -> int | None:
        i = bisect.bisect_right(self.map_starts, ptr) - 1
        if i >= 0:
            start = self.map_starts[i]
            if ptr < start + self.mappings[start][0]:
                return start
        return None

    def _whole_mappings(self, ptr: int, size: int, what: str) -> list[int]:
        """The mappings that make up [ptr, ptr + size) exactly, in address order."""
        if not size:
            raise CudaError(_INVALID, f"{what} 0 bytes")
        starts, at, end = [], ptr, ptr + size
        i = bisect.bisect_left(self.map_starts, ptr)
        while at < end:
            if i >= len(self.map_starts) or self.map_starts[i] != at:
                raise CudaError(_INVALID, f"{what} 0x{ptr:x}+{size}: 0x{at:x} is not the start "
                                          "of a mapping of this guest")
            starts.append(at)
            at += self.mappings[at][0]
            i += 1
        if at != end:
            raise CudaError(_INVALID, f"{what} 0x{ptr:x}+{size}: the range ends inside a mapping")
        return starts

    def map(self, ptr: int, size: int, offset: int, handle: int) -> None:
        """cuMemMap (``check_map`` checked its flags)."""
        p = self._handle(handle)
        if not size:
            raise CudaError(_INVALID, "cannot map 0 bytes")
        for value, what in ((ptr, "address"), (size, "size"), (offset, "offset")):
            self._aligned(value, what)
        if offset + size > p.size:
            raise CudaError(_INVALID, f"{size} bytes from offset {offset} run past the end of "
                                      f"the {p.size}-byte allocation")
        if not self._in_reservation(ptr, size):
            raise CudaError(_INVALID, f"0x{ptr:x}+{size} is not inside a reservation of this "
                                      "guest")
        i = bisect.bisect_left(self.map_starts, ptr)
        if self._mapping_at(ptr) is not None or (i < len(self.map_starts)
                                                 and self.map_starts[i] < ptr + size):
            raise CudaError(_INVALID, f"0x{ptr:x}+{size} overlaps memory already mapped")
        self._room()
        self.device.mem_map(ptr, size, offset, p.obj)
        bisect.insort(self.map_starts, ptr)
        self.mappings[ptr] = (size, handle)
        p.maps += 1

    def unmap(self, ptr: int, size: int) -> None:
        starts = self._whole_mappings(ptr, size, "unmapping")
        self.device.mem_unmap(ptr, size)
        self.accessible.remove(ptr, ptr + size)
        for start in starts:
            _, handle = self.mappings.pop(start)
            self.map_starts.pop(bisect.bisect_left(self.map_starts, start))
            p = self.physical[handle]
            p.maps -= 1
            self._maybe_free(handle, p)

    def set_access(self, ptr: int, size: int, flags: int) -> None:
        """cuMemSetAccess for this device (``check_access`` read the flags from the
        guest's descriptors)."""
        self._whole_mappings(ptr, size, "setting access to")
        self.device.mem_set_access(ptr, size, flags)
        if flags == _READWRITE:
            self.accessible.add(ptr, ptr + size)
        else:  # read-only or no access: copies through the agent are refused there
            self.accessible.remove(ptr, ptr + size)

    def get_access(self, ptr: int) -> int:
        if self._mapping_at(ptr) is None:
            raise CudaError(_INVALID, f"0x{ptr:x} is not inside a mapping of this guest")
        return self.device.mem_get_access(ptr)

    def covers(self, ptr: int, n: int) -> bool:
        return self.accessible.covers(ptr, n)

    def why_not(self, ptr: int) -> str | None:
        """Why an address in this guest's reserved space cannot be copied to or set, for
        the refusal's message; None when ptr is not in a reservation of this guest."""
        if self._mapping_at(ptr) is not None:
            return (f"0x{ptr:x} is mapped memory of this guest without read-write access "
                    "(cuMemSetAccess) or the range runs past its access")
        if self._in_reservation(ptr, 1):
            return f"0x{ptr:x} is reserved by this guest (cuMemAddressReserve) but not mapped"
        return None

    def release_all(self) -> None:
        """Unmap, release, free the addresses (the session returns the charge)."""
        for start in self.map_starts:
            quietly(self.device.mem_unmap, start, self.mappings[start][0])
        with self.lock:
            for p in self.physical.values():
                if p.export is not None:
                    quietly(self._let_go, p)
                else:
                    quietly(self.device.mem_release, p.obj)
        for start in self.res_starts:
            quietly(self.device.address_free, start, self.reserved[start])
        self.__init__(self.device, self.charge, self.uncharge, self.lock, self.exports,
                      self.hand_over)
