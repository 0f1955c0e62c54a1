"""A guest's virtual memory (VMM) and stream-ordered memory pools, as its session keeps them.

The session hands the VMM and pool ops to the two classes here. They check
that a guest maps, frees and copies only what it created itself (handle
numbers and address ranges are per connection), charge the slice's quota for
device memory before the driver takes it, and, when the guest leaves, release
everything in the order CUDA needs: mappings unmapped, physical memory
released, addresses freed; pool allocations freed on their streams, then the
pools destroyed.

Only device-located, non-exportable memory of the connection's own device is
served: exportable handles, host or NUMA locations, compression and RDMA
flags are CUDA_ERROR_NOT_SUPPORTED, with the reason.

Quota, for pools: the slice is charged what each pool holds of the driver's
memory (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not what is allocated from it.
A pool keeps freed memory up to its release threshold, so the memory it holds
is what the guest takes from other VMs; charging that makes every threshold
safe (PyTorch sets UINT64_MAX), where refusing thresholds would break the
programs that set them. A growth is charged ahead of the allocation that
causes it and settled against the driver's figure just after; memory a pool
gives back at a synchronisation point is uncharged at the next one the
guest makes.

Must not import CUDA (the device does every call) and must not touch other guests.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor.tables import Allocations, Ranges
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

# CUDA's numbers
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_ACCESS_FLAGS = (0, 1, 3)  # CU_MEM_ACCESS_FLAGS_PROT_NONE, _READ, _READWRITE
_READWRITE = 3
_ACCESS_DESC = struct.Struct("<iiI")  # CUmemAccessDesc: location (type, id), flags
_MAX_ACCESS_DESCS = 64
_PAGE = 4096  # what cuMemAddressReserve asks of a size and an address hint
# CUmemPool_attribute
REUSE_ATTRIBUTES = (1, 2, 3)  # int flags
RELEASE_THRESHOLD, RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH = 4, 5, 6, 7, 8
_READ_ONLY = (RESERVED_CURRENT, USED_CURRENT)
_RESETTABLE = (RESERVED_HIGH, USED_HIGH)  # may only be set to 0

# What one guest may make its session hold (host memory for the bookkeeping, driver objects).
MAX_OBJECTS = 1 << 18  # reservations, physical allocations and mappings at once
MAX_RESERVED = 1 << 45  # bytes of reserved addresses (32 TiB: far beyond any GPU's memory)
MAX_POOLS = 256
MAX_POOL_ALLOCATIONS = 1 << 20

_NOT_SUPPORTED = P.CUDA_ERROR_NOT_SUPPORTED
_INVALID = P.CUDA_ERROR_INVALID_VALUE


def _check_location(loc_type: int, loc_id: int, what: str) -> None:
    if loc_type != _ON_DEVICE:
        raise CudaError(_NOT_SUPPORTED, f"{what} at location type {loc_type} (host or NUMA "
                        "memory) is not served; only device memory is")
    if loc_id != 0:
        raise CudaError(101, f"{what} on device {loc_id}: this connection's device is 0")


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # releasing at exit: report, never stop releasing
        log.debug("release failed: %s", exc)


class _Physical:
    """One cuMemCreate: alive while the guest holds a reference or a mapping uses it."""

    __slots__ = ("obj", "size", "refs", "maps")

    def __init__(self, obj: Any, size: int):
        self.obj, self.size, self.refs, self.maps = obj, size, 1, 0


class VirtualMemory:
    """Reservations, physical allocations and mappings of one guest."""

    def __init__(self, device, charge: Callable[[int], None], uncharge: Callable[[int], None],
                 lock: threading.Lock):
        self.device, self.charge, self.uncharge, self.lock = device, charge, uncharge, lock
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

    def granularity(self, option: int) -> int:
        if option not in (0, 1):
            raise CudaError(_INVALID, f"granularity option {option} is not 0 or 1")
        return self.device.mem_granularity(option)

    def _aligned(self, value: int, what: str) -> None:
        g = self.device.mem_granularity(0)
        if value % g:
            raise CudaError(_INVALID, f"{what} 0x{value:x} is not a multiple of the allocation "
                                      f"granularity ({g} bytes)")

    def _room(self) -> None:
        if len(self) >= MAX_OBJECTS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest holds {MAX_OBJECTS} reservations, allocations and "
                            "mappings, as many as the agent allows")

    # -- addresses --------------------------------------------------------------

    def reserve(self, size: int, alignment: int, addr: int, flags: int) -> int:
        if flags:
            raise CudaError(_INVALID, f"cuMemAddressReserve flags must be 0, not {flags}")
        if not size or size % _PAGE or addr % _PAGE:
            raise CudaError(_INVALID, f"0x{addr:x}+{size}: a reservation's size is a non-zero "
                                      f"multiple of {_PAGE} bytes, its address hint a multiple")
        if alignment & (alignment - 1) or alignment > MAX_RESERVED:
            raise CudaError(_INVALID, f"alignment {alignment} is not a power of two")
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

    def create(self, size: int, type_: int, handle_types: int, loc_type: int, loc_id: int,
               alloc_flags: int) -> int:
        if type_ != _PINNED:
            raise CudaError(_NOT_SUPPORTED, f"allocation type {type_} is not served; only "
                                            "CU_MEM_ALLOCATION_TYPE_PINNED is")
        if handle_types:
            raise CudaError(_NOT_SUPPORTED, f"exportable memory (handle types 0x{handle_types:x}) "
                                            "is not served: it would be shared outside the "
                                            "executor")
        _check_location(loc_type, loc_id, "memory")
        if alloc_flags:
            raise CudaError(_NOT_SUPPORTED, "compressible, GPUDirect RDMA or usage-flagged "
                                            "memory is not served")
        if not size:
            raise CudaError(_INVALID, "cannot create 0 bytes")
        self._aligned(size, "size")
        self._room()
        self.charge(size)  # a multiple of the granularity: what the driver takes
        try:
            with self.lock:
                obj = self.device.mem_create(size)
        except CudaError:
            self.uncharge(size)
            raise
        handle = self.next_handle
        self.next_handle += 1
        self.physical[handle] = _Physical(obj, size)
        return handle

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
        with self.lock:
            self.device.mem_release(p.obj)
        self.uncharge(p.size)  # only once the driver gave it back; else at the session's end

    def retain(self, ptr: int) -> int:
        start = self._mapping_at(ptr)
        if start is None:
            raise CudaError(_INVALID, f"0x{ptr:x} is not inside a mapping of this guest")
        handle = self.mappings[start][1]
        self.physical[handle].refs += 1
        return handle

    def handle_size(self, handle: int) -> int:
        return self._handle(handle).size

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

    def map(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> None:
        if flags:
            raise CudaError(_INVALID, f"cuMemMap flags must be 0, not {flags}")
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

    def set_access(self, ptr: int, size: int, descs: bytes) -> None:
        if not descs or len(descs) % _ACCESS_DESC.size \
                or len(descs) > _MAX_ACCESS_DESCS * _ACCESS_DESC.size:
            raise CudaError(_INVALID, f"{len(descs)} bytes is not 1 to {_MAX_ACCESS_DESCS} "
                                      "access descriptors")
        flags = 0
        for loc_type, loc_id, flags in _ACCESS_DESC.iter_unpack(descs):
            _check_location(loc_type, loc_id, "access")
            if flags not in _ACCESS_FLAGS:
                raise CudaError(_INVALID, f"access flags {flags} are not 0, 1 or 3")
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

    def release_all(self) -> None:
        """Unmap, release, free the addresses (the session returns the charge)."""
        for start in self.map_starts:
            _quietly(self.device.mem_unmap, start, self.mappings[start][0])
        with self.lock:
            for p in self.physical.values():
                _quietly(self.device.mem_release, p.obj)
        for start in self.res_starts:
            _quietly(self.device.address_free, start, self.reserved[start])
        self.__init__(self.device, self.charge, self.uncharge, self.lock)


class _Pool:
    __slots__ = ("obj", "charged", "threshold", "live", "dirty", "is_default", "doomed")

    def __init__(self, obj: Any, is_default: bool):
        self.obj, self.is_default = obj, is_default
        self.charged = 0  # bytes of the quota charged for what the pool holds
        self.threshold = 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as the guest set it
        self.live = 0  # allocations not yet freed
        self.dirty = False  # frees since the pool was last settled: it may give memory back
        self.doomed = False  # destroyed by the guest while allocations were live


class Pools:
    """The memory pools of one guest, and what it allocated from them."""

    def __init__(self, device, charge: Callable[[int], None], uncharge: Callable[[int], None],
                 lock: threading.Lock, stream: Callable[[int], Any], accounted: bool = True):
        self.device, self.charge, self.uncharge, self.lock = device, charge, uncharge, lock
        self.stream = stream  # guest stream handle -> the device's stream
        self.accounted = accounted  # False: the guest has the whole GPU, nothing is charged
        self.pools: dict[int, _Pool] = {}  # handle number -> pool the guest may name
        self.doomed: list[_Pool] = []
        self.default_handle = 0
        self.next_handle = 16
        self.allocs = Allocations()
        self.owner: dict[int, tuple[_Pool, int]] = {}  # allocation -> (pool, stream handle)

    # -- pools ------------------------------------------------------------------------

    def _add(self, max_size: int, is_default: bool) -> int:
        if len(self.pools) + len(self.doomed) >= MAX_POOLS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {MAX_POOLS} memory pools, as many as the agent "
                            "allows")
        with self.lock:
            obj = self.device.pool_create(max_size)
        handle = self.next_handle
        self.next_handle += 1
        self.pools[handle] = _Pool(obj, is_default)
        return handle

    def default(self) -> int:
        """The connection's own default pool, made on first use: pools are per guest,
        never the executor's device default pool, which other connections share."""
        if not self.default_handle:
            self.default_handle = self._add(0, True)
        return self.default_handle

    def create(self, type_: int, handle_types: int, loc_type: int, loc_id: int, max_size: int,
               usage: int) -> int:
        if type_ != _PINNED:
            raise CudaError(_NOT_SUPPORTED, f"pools of allocation type {type_} are not served")
        if handle_types:
            raise CudaError(_NOT_SUPPORTED, f"pools of exportable memory (handle types "
                                            f"0x{handle_types:x}) are not served")
        _check_location(loc_type, loc_id, "a pool")
        if usage:
            raise CudaError(_NOT_SUPPORTED, f"pool usage flags 0x{usage:x} are not served")
        return self._add(max_size, False)

    def _pool(self, handle: int) -> _Pool:
        if handle == 0:
            handle = self.default()
        pool = self.pools.get(handle)
        if pool is None:
            raise CudaError(P.CUDA_ERROR_INVALID_HANDLE, f"unknown memory pool handle {handle}")
        return pool

    def destroy(self, handle: int) -> None:
        pool = self._pool(handle) if handle else None
        if pool is None or pool.is_default:
            raise CudaError(_INVALID, "the default memory pool cannot be destroyed")
        del self.pools[handle]
        if pool.live:  # as CUDA: it goes once its last allocation is freed
            pool.doomed = True
            self.doomed.append(pool)
        else:
            self._destroy(pool)

    def _destroy(self, pool: _Pool) -> None:
        if pool.dirty:  # frees still queued keep their memory until the GPU reaches them
            _quietly(self.device.synchronize)
        with self.lock:
            self.device.pool_destroy(pool.obj)
        self.uncharge(pool.charged)
        pool.charged = 0

    def set_attribute(self, handle: int, attrib: int, value: int) -> None:
        pool = self._pool(handle)
        self._check_attribute(attrib)
        if attrib in _READ_ONLY:
            raise CudaError(_INVALID, f"pool attribute {attrib} is read-only")
        if attrib in _RESETTABLE and value:
            raise CudaError(_INVALID, f"pool attribute {attrib} can only be reset to 0")
        if attrib in REUSE_ATTRIBUTES and value not in (0, 1):
            raise CudaError(_INVALID, f"pool attribute {attrib} is 0 or 1, not {value}")
        self.device.pool_set_attribute(pool.obj, attrib, value)
        if attrib == RELEASE_THRESHOLD:
            pool.threshold = value

    def get_attribute(self, handle: int, attrib: int) -> int:
        pool = self._pool(handle)
        self._check_attribute(attrib)
        return self.device.pool_attribute(pool.obj, attrib)

    @staticmethod
    def _check_attribute(attrib: int) -> None:
        if not 1 <= attrib <= USED_HIGH:
            raise CudaError(_INVALID, f"unknown memory pool attribute {attrib}")

    def trim(self, handle: int, keep: int) -> None:
        pool = self._pool(handle)
        with self.lock:
            self.device.pool_trim(pool.obj, keep)
        self._give_back(pool)

    # -- allocations ------------------------------------------------------------------

    def alloc(self, size: int, handle: int, stream: int) -> int:
        if not size:
            raise CudaError(_INVALID, "cannot allocate 0 bytes")
        if len(self.allocs) >= MAX_POOL_ALLOCATIONS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {MAX_POOL_ALLOCATIONS} pool allocations, as many "
                            "as the agent allows")
        pool = self._pool(handle)
        s = self.stream(stream)
        if not self.accounted:
            with self.lock:
                ptr = self.device.pool_alloc(size, pool.obj, s)
            return self._track(ptr, size, pool, stream)
        held = self.device.pool_attribute(pool.obj, RESERVED_CURRENT)
        if held - self.device.pool_attribute(pool.obj, USED_CURRENT) < size:
            # The pool may have to grow: charged before the driver takes the memory.
            g = self.device.mem_granularity(0)
            grow = -(-size // g) * g
            self.charge(grow)
            pool.charged += grow
        try:
            with self.lock:
                ptr = self.device.pool_alloc(size, pool.obj, s)
        except CudaError:
            self._give_back(pool)
            raise
        held = self.device.pool_attribute(pool.obj, RESERVED_CURRENT)
        if held > pool.charged:  # it grew by more than its share of the charge ahead
            try:
                self.charge(held - pool.charged)
            except CudaError:
                self._undo(pool, ptr, s)
                raise
            pool.charged = held
        elif held < pool.charged:
            self.uncharge(pool.charged - held)
            pool.charged = held
        return self._track(ptr, size, pool, stream)

    def _track(self, ptr: int, size: int, pool: _Pool, stream: int) -> int:
        self.allocs.add(ptr, size)
        self.owner[ptr] = (pool, stream)
        pool.live += 1
        return ptr

    def _undo(self, pool: _Pool, ptr: int, s: Any) -> None:
        """Give back an allocation that took the pool past the quota, before refusing it."""
        _quietly(self.device.pool_free, ptr, s)
        _quietly(self.device.stream_synchronize, s)
        with self.lock:
            _quietly(self.device.pool_trim, pool.obj, 0)
        self._give_back(pool)
        held = self.device.pool_attribute(pool.obj, RESERVED_CURRENT)
        if held > pool.charged:
            log.warning("a memory pool keeps %d bytes beyond what its guest's quota could be "
                        "charged", held - pool.charged)

    def free(self, ptr: int, stream: int) -> None:
        entry = self.owner.get(ptr)
        if entry is None:
            raise CudaError(_INVALID, f"0x{ptr:x} is not a pool allocation of this guest")
        self.device.pool_free(ptr, self.stream(stream))
        del self.owner[ptr]
        self.allocs.remove(ptr)
        pool = entry[0]
        pool.live -= 1
        pool.dirty = True
        if pool.doomed and not pool.live:
            self.doomed.remove(pool)
            self._destroy(pool)

    def check(self, ptr: int, n: int, what: str) -> None:
        self.allocs.check(ptr, n, what)

    # -- the charge -----------------------------------------------------------------------

    def _give_back(self, pool: _Pool) -> bool:
        """Uncharge what the pool no longer holds; True if anything was."""
        if not self.accounted:
            return False
        held = self.device.pool_attribute(pool.obj, RESERVED_CURRENT)
        gave = held < pool.charged
        if gave:
            self.uncharge(pool.charged - held)
            pool.charged = held
        # Frees not yet reached by their streams may still give memory back later.
        pool.dirty = held > max(pool.threshold,
                                self.device.pool_attribute(pool.obj, USED_CURRENT))
        return gave

    def settle(self) -> bool:
        """After a synchronisation point (where the driver trims pools to their release
        threshold): uncharge what pools gave back. True if anything was."""
        gave = False
        if not self.accounted:
            return gave
        for pool in (*self.pools.values(), *self.doomed):
            if pool.dirty and pool.charged > pool.threshold:
                gave |= self._give_back(pool)
        return gave

    def release_all(self) -> None:
        """Free every allocation on its stream (the legacy one where the guest destroyed
        it), then destroy the pools (the session returns the charge)."""
        for ptr, (_, stream) in self.owner.items():
            try:
                s = self.stream(stream)
            except CudaError:
                s = self.stream(1)
            _quietly(self.device.pool_free, ptr, s)
        with self.lock:
            for pool in (*self.pools.values(), *self.doomed):
                _quietly(self.device.pool_destroy, pool.obj)
        self.__init__(self.device, self.charge, self.uncharge, self.lock, self.stream,
                      self.accounted)
