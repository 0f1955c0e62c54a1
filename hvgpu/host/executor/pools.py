"""A guest's stream-ordered memory pools, as its session keeps them.

The pool ops (``ops/vmm.py``) check their arguments with the ``check_*``
functions here and hand the rest to :class:`Pools`. Pool and allocation numbers
are per connection, each connection gets a default pool of its own (never the
executor's device default pool, which other connections share), and when the
guest leaves every allocation is freed on its stream before the pools are
destroyed. Pools of device memory only, exportable as a POSIX file descriptor at
most.

Sharing among the VM's processes (cuMemPoolExportToShareableHandle and its kin):
every process of the VM works in this executor's one context, so the driver's pool
needs no export handle of its own. An exported pool and each allocation exported
from it are tokens of the executor's table (``ipc.Exports``): another connection
imports the pool (a handle of its own, from which nothing is allocated) and then
the allocations, which it copies to and frees. An allocation's export holds its
pool's export, and each holds what it names alive: the exporter's free withdraws
the allocation's token, and the driver frees the memory (on the stream of the
last free) only when the last importer freed it too; the pool is destroyed once
its exporter destroyed it and nothing holds it. Its charge stays on the slice
(handed over from the exporter's ledger when the exporter lets go) until then.

Quota: the slice is charged what each pool holds of the driver's memory
(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not what is allocated from it. A pool
keeps freed memory up to its release threshold, so the memory it holds is
what the guest takes from other VMs; charging that makes every threshold
safe (PyTorch sets UINT64_MAX), where refusing thresholds would break the
programs that set them. A growth is charged ahead of the allocation that
causes it and settled against the driver's figure just after.

Memory goes back to the driver only under the device-memory lock: a module
load in another session is charged the driver's free memory before and after
it, and would be charged less than it took if a pool gave memory back in
between. The driver would do so at any synchronisation of any connection, so
a charged pool's threshold in the driver stays at UINT64_MAX; the guest's
threshold is kept here, and at the guest's synchronisation points
(:meth:`Pools.settle`) each pool is trimmed to it, as the driver would have,
and what it gave back is uncharged.

Must not import CUDA (the device does every call) and must not touch other guests.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor import ipc
from hvgpu.host.executor.tables import Allocations
from hvgpu.host.executor.vmm import POSIX_FD, check_location, quietly
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_INVALID = P.CUDA_ERROR_INVALID_VALUE
_NOT_SUPPORTED = P.CUDA_ERROR_NOT_SUPPORTED
# CUmemPool_attribute
REUSE_ATTRIBUTES = (1, 2, 3)  # int flags
RELEASE_THRESHOLD, RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT, USED_HIGH = 4, 5, 6, 7, 8
_READ_ONLY = (RESERVED_CURRENT, USED_CURRENT)
_RESETTABLE = (RESERVED_HIGH, USED_HIGH)  # may only be set to 0
_KEEP_ALL = (1 << 64) - 1  # the driver's release threshold of a charged pool

# What one guest may make its session hold.
MAX_POOLS = 256
MAX_POOL_ALLOCATIONS = 1 << 20


def check_create(type_: int, handle_types: int, loc_type: int, loc_id: int,
                 usage: int) -> None:
    """Pools of pinned memory of this device only, exportable as a POSIX file
    descriptor at most."""
    if type_ != _PINNED:
        raise CudaError(_NOT_SUPPORTED, f"pools of allocation type {type_} are not served")
    if handle_types & ~POSIX_FD:
        raise CudaError(_NOT_SUPPORTED, f"pools of exportable memory (handle types "
                                        f"0x{handle_types:x}) are not served but as a POSIX "
                                        "file descriptor: they would be shared outside the "
                                        "VM's executor")
    check_location(loc_type, loc_id, "a pool")
    if usage:
        raise CudaError(_NOT_SUPPORTED, f"pool usage flags 0x{usage:x} are not served")


def check_size(size: int) -> None:
    if not size:
        raise CudaError(_INVALID, "cannot allocate 0 bytes")


class _Pool:
    __slots__ = ("obj", "charged", "threshold", "live", "dirty", "is_default", "doomed",
                 "handle_types", "export", "source")

    def __init__(self, obj: Any, is_default: bool, handle_types: int = 0, source=None):
        self.obj, self.is_default = obj, is_default
        self.handle_types = handle_types  # POSIX_FD: exportable
        self.export: ipc.Export | None = None  # its token, once exported
        self.source: ipc.Export | None = source  # imported: the export it was imported from
        self.charged = 0  # bytes of the quota charged for what the pool holds
        self.threshold = 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as the guest set it
        self.live = 0  # allocations not yet freed
        self.dirty = False  # frees since the pool was last settled: it may give memory back
        self.doomed = False  # destroyed by the guest while allocations were live


class Pools:
    """The memory pools of one guest, and what it allocated from them."""

    def __init__(self, device, charge: Callable[[int], None], uncharge: Callable[[int], None],
                 lock: threading.Lock, stream: Callable[[int], Any], accounted: bool = True,
                 exports: ipc.Exports | None = None,
                 hand_over: Callable[[int], Callable[[], None]] | None = None):
        self.device, self.charge, self.uncharge, self.lock = device, charge, uncharge, lock
        self.exports = exports if exports is not None else ipc.Exports()
        self.hand_over = hand_over or (lambda n: lambda: uncharge(n))  # Ledger.hand_over
        self.stream = stream  # guest stream handle -> the device's stream
        self.accounted = accounted  # False: the guest has the whole GPU, nothing is charged
        self.pools: dict[int, _Pool] = {}  # handle number -> pool the guest may name
        self.doomed: list[_Pool] = []
        self.default_handle = 0
        self.next_handle = 16
        self.allocs = Allocations()
        self.owner: dict[int, tuple[_Pool, int]] = {}  # allocation -> (pool, stream handle)
        self.exported: dict[int, ipc.Export] = {}  # allocation -> its export (its token)
        self.imported: dict[int, ipc.Export] = {}  # another's allocation -> its export

    # -- pools ------------------------------------------------------------------------

    def _room(self) -> None:
        if len(self.pools) + len(self.doomed) >= MAX_POOLS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {MAX_POOLS} memory pools, as many as the agent "
                            "allows")

    def _add(self, max_size: int, is_default: bool, handle_types: int = 0) -> int:
        self._room()
        with self.lock:
            obj = self.device.pool_create(max_size)
            if self.accounted:  # only settle() gives its memory back (module docstring)
                try:
                    self.device.pool_set_attribute(obj, RELEASE_THRESHOLD, _KEEP_ALL)
                except CudaError:
                    quietly(self.device.pool_destroy, obj)
                    raise
        return self._number(_Pool(obj, is_default, handle_types))

    def _number(self, pool: _Pool) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.pools[handle] = pool
        return handle

    def default(self) -> int:
        """The connection's own default pool, made on first use: pools are per guest,
        never the executor's device default pool, which other connections share."""
        if not self.default_handle:
            self.default_handle = self._add(0, True)
        return self.default_handle

    def create(self, max_size: int, handle_types: int = 0) -> int:
        """cuMemPoolCreate (``check_create`` checked the pool's properties)."""
        return self._add(max_size, False, handle_types)

    def _pool(self, handle: int) -> _Pool:
        if handle == 0:
            handle = self.default()
        pool = self.pools.get(handle)
        if pool is None:
            raise CudaError(P.CUDA_ERROR_INVALID_HANDLE, f"unknown memory pool handle {handle}")
        return pool

    def object_of(self, handle: int) -> Any:
        """The driver's pool a guest's pool number names (0: its default pool)."""
        return self._pool(handle).obj

    def destroy(self, handle: int) -> None:
        pool = self._pool(handle) if handle else None
        if pool is None or pool.is_default:
            raise CudaError(_INVALID, "the default memory pool cannot be destroyed")
        del self.pools[handle]
        if pool.source is not None:  # an imported pool: this connection lets go of it
            self.exports.let_go(pool.source)
            return
        if pool.export is not None:  # imported from now on by no one
            self.exports.withdraw(pool.export, pool.export.last)
        if pool.live:  # as CUDA: it goes once its last allocation is freed
            pool.doomed = True
            self.doomed.append(pool)
        else:
            self._destroy(pool)

    def _destroy(self, pool: _Pool) -> None:
        if pool.export is not None:  # shared: destroyed once nothing holds it
            pool.export.uncharge = self.hand_over(pool.charged) if self.accounted \
                else (lambda: None)
            pool.charged = 0
            self.exports.let_go(pool.export)
            return
        if pool.dirty:  # frees still queued keep their memory until the GPU reaches them
            quietly(self.device.synchronize)
        with self.lock:
            self.device.pool_destroy(pool.obj)
        self.uncharge(pool.charged)
        pool.charged = 0

    def set_attribute(self, handle: int, attrib: int, value: int) -> None:
        pool = self._own(handle, "setting attributes of")
        self._check_attribute(attrib)
        if attrib in _READ_ONLY:
            raise CudaError(_INVALID, f"pool attribute {attrib} is read-only")
        if attrib in _RESETTABLE and value:
            raise CudaError(_INVALID, f"pool attribute {attrib} can only be reset to 0")
        if attrib in REUSE_ATTRIBUTES and value not in (0, 1):
            raise CudaError(_INVALID, f"pool attribute {attrib} is 0 or 1, not {value}")
        if attrib == RELEASE_THRESHOLD:
            pool.threshold = value
            if self.accounted:  # the driver's stays at _KEEP_ALL; settle() applies this one
                return
        self.device.pool_set_attribute(pool.obj, attrib, value)

    def get_attribute(self, handle: int, attrib: int) -> int:
        pool = self._pool(handle)
        self._check_attribute(attrib)
        if attrib == RELEASE_THRESHOLD and self.accounted:
            return pool.threshold
        return self.device.pool_attribute(pool.obj, attrib)

    def _own(self, handle: int, what: str) -> _Pool:
        pool = self._pool(handle)
        if pool.source is not None:
            raise CudaError(_NOT_SUPPORTED, f"{what} an imported memory pool is not served "
                                            "(its exporting process owns it)")
        return pool

    @staticmethod
    def _check_attribute(attrib: int) -> None:
        if not 1 <= attrib <= USED_HIGH:
            raise CudaError(_INVALID, f"unknown memory pool attribute {attrib}")

    def trim(self, handle: int, keep: int) -> None:
        pool = self._own(handle, "trimming")
        with self.lock:
            self.device.pool_trim(pool.obj, keep)
        self._give_back(pool)

    # -- sharing among the VM's processes (ipc.Exports) ---------------------------------

    def export(self, handle: int, owner) -> bytes:
        """cuMemPoolExportToShareableHandle: the pool's token (the same each time)."""
        return self._export(self._pool(handle), owner).token

    def _export(self, pool: _Pool, owner) -> ipc.Export:
        if pool.source is not None:
            raise CudaError(_INVALID, "an imported memory pool is not exported again")
        if not pool.handle_types & POSIX_FD:
            raise CudaError(_INVALID, "the memory pool was not created exportable as a POSIX "
                                      "file descriptor (CUmemPoolProps.handleTypes)")
        if pool.doomed:  # destroyed, its allocations live: exported before or never
            raise CudaError(_INVALID, "the memory pool is destroyed: nothing of it is exported "
                                      "any more")
        if pool.export is None:
            made = self.exports.export(ipc.POOL, owner, obj=pool)
            device, lock, obj = self.device, self.lock, pool.obj

            def last() -> None:  # its exporter destroyed it and no one holds it
                quietly(device.synchronize)  # frees still queued keep their memory till done
                with lock:
                    quietly(device.pool_destroy, obj)
                made.uncharge()
            made.last = last
            pool.export = made
        return pool.export

    def import_(self, export: ipc.Export) -> int:
        """cuMemPoolImportFromShareableHandle: a pool handle of this guest, which reaches
        the allocations imported into it and allocates nothing."""
        self._room()
        if not self.exports.hold(export):
            raise CudaError(_INVALID, "the shareable handle's memory pool is gone")
        return self._number(_Pool(export.obj.obj, False, POSIX_FD, export))

    def export_pointer(self, ptr: int, owner) -> bytes:
        """cuMemPoolExportPointer of an allocation (its base) from an exportable pool: its
        token (the same each time), which holds the pool's until the last holder frees."""
        entry = self.owner.get(ptr)
        if entry is None:
            raise CudaError(_INVALID, f"0x{ptr:x} is not the start of a live pool allocation "
                                      "of this guest")
        made = self.exported.get(ptr)
        if made is not None:
            return made.token
        pool = entry[0]
        pool_export = self._export(pool, owner)
        if not self.exports.hold(pool_export):  # cannot be: it was live just now
            raise CudaError(_INVALID, f"the memory pool of 0x{ptr:x} is destroyed")
        made = self.exports.export(ipc.POINTER, owner, base=ptr, size=self.allocs.sizes[ptr],
                                   obj=pool_export)
        device, exports = self.device, self.exports

        def last(stream) -> None:  # freed by its exporter and by every importer
            quietly(device.pool_free, ptr, stream)
            pool.dirty = True
            exports.let_go(pool_export)
        made.last = last
        self.exported[ptr] = made
        return made.token

    def import_pointer(self, handle: int, export: ipc.Export) -> tuple[int, int]:
        """cuMemPoolImportPointer into a pool this guest imported: (base, size), copyable
        and freed here (``free``)."""
        pool = self._pool(handle)
        if pool.source is None:
            raise CudaError(_INVALID, f"memory pool {handle} was not imported "
                                      "(cuMemPoolImportFromShareableHandle)")
        if export.obj is not pool.source:
            raise CudaError(_INVALID, "the pointer was exported from another memory pool than "
                                      f"the one pool {handle} was imported from")
        if export.base in self.imported:
            raise CudaError(_INVALID, f"the allocation at 0x{export.base:x} is imported "
                                      "already; free it first")
        if len(self.allocs) >= MAX_POOL_ALLOCATIONS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {MAX_POOL_ALLOCATIONS} pool allocations, as many "
                            "as the agent allows")
        if not self.exports.hold(export):
            raise CudaError(_INVALID, f"the pool allocation at 0x{export.base:x} is freed")
        self.imported[export.base] = export
        self.allocs.add(export.base, export.size)
        return export.base, export.size

    # -- allocations ------------------------------------------------------------------

    def alloc(self, size: int, handle: int, stream: int) -> int:
        """cuMemAllocAsync of ``size`` bytes (``check_size`` refused 0)."""
        if len(self.allocs) >= MAX_POOL_ALLOCATIONS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"this guest has {MAX_POOL_ALLOCATIONS} pool allocations, as many "
                            "as the agent allows")
        pool = self._pool(handle)
        if pool.source is not None:
            raise CudaError(_INVALID, "an imported memory pool allocates nothing (CUDA: it "
                                      "is not used with cuMemAllocFromPoolAsync)")
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
        quietly(self.device.pool_free, ptr, s)
        quietly(self.device.stream_synchronize, s)
        with self.lock:
            quietly(self.device.pool_trim, pool.obj, 0)
        self._give_back(pool)
        held = self.device.pool_attribute(pool.obj, RESERVED_CURRENT)
        if held > pool.charged:
            log.warning("a memory pool keeps %d bytes beyond what its guest's quota could be "
                        "charged", held - pool.charged)

    def free(self, ptr: int, stream: int) -> None:
        entry = self.owner.get(ptr)
        if entry is None:
            if ptr in self.imported:  # another's: the driver frees it once no one holds it
                s = self.stream(stream)
                self.allocs.remove(ptr)
                self.exports.let_go(self.imported.pop(ptr), s)
                return
            raise CudaError(_INVALID, f"0x{ptr:x} is not a pool allocation of this guest")
        s = self.stream(stream)
        export = self.exported.pop(ptr, None)
        if export is None:
            self.device.pool_free(ptr, s)
        else:  # imported from now on by no one; freed once no importer holds it
            self.exports.withdraw(export, export.last)(s)
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
        """After a synchronisation point of the guest: trim each pool to its release
        threshold, as the driver would there, and uncharge what it gave back. True if
        anything was."""
        gave = False
        if not self.accounted:
            return gave
        for pool in (*self.pools.values(), *self.doomed):
            if pool.dirty and pool.charged > pool.threshold:
                with self.lock:
                    quietly(self.device.pool_trim, pool.obj, pool.threshold)
                gave |= self._give_back(pool)
        return gave

    def release_all(self) -> None:
        """Free every allocation on its stream (the legacy one where the guest destroyed
        it), wait for the GPU to reach those frees, then destroy the pools (the session
        returns the charge). A pool destroyed with frees pending would keep its memory
        until they are done, past the charge, for as long as the guest kept those
        streams busy."""
        for ptr, (_, stream) in self.owner.items():
            try:
                s = self.stream(stream)
            except CudaError:
                s = self.stream(1)
            export = self.exported.get(ptr)
            if export is None:
                quietly(self.device.pool_free, ptr, s)
            else:  # importers may hold it still: freed by the last of them
                quietly(self.exports.withdraw(export, export.last), s)
        if self.pools or self.doomed or self.imported:
            quietly(self.device.synchronize)
        for export in self.imported.values():  # after this guest's work on them is done
            quietly(self.exports.let_go, export, self.stream(1))
        for pool in (*self.pools.values(), *self.doomed):
            if pool.source is not None:
                quietly(self.exports.let_go, pool.source)
            elif pool.export is not None:
                if not pool.doomed:
                    self.exports.withdraw(pool.export, pool.export.last)
                quietly(self._destroy, pool)
            else:
                with self.lock:
                    quietly(self.device.pool_destroy, pool.obj)
        self.__init__(self.device, self.charge, self.uncharge, self.lock, self.stream,
                      self.accounted, self.exports, self.hand_over)
