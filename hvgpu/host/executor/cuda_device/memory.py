"""Device memory calls of ``CudaDevice``: allocations, copies, VMM, pools, pinned host memory.

A vGPU N >= 1 allocates in its own address window (``address_window`` keeps its
books; :class:`MappedWindow` maps memory into it). :class:`MemoryCalls` is a part
of ``CudaDevice`` and uses what its ``__init__`` sets: ``_window``, ``_memory``,
``_granularity`` and ``ordinal``.

Must not validate guest input beyond what the driver does: the session has.
"""

from __future__ import annotations

import ctypes
import logging

from hvgpu.errors import CudaError
from hvgpu.host.executor.address_window import WINDOW_SIZE, AddressWindow, window_hint
from hvgpu.host.executor.cuda_device.driver import (access, cu, device_memory,
                                                    driver_library, fail, ok)

log = logging.getLogger(__name__)

# cuMemAlloc's footprint, measured on the H200 (driver 580) with cuMemGetInfo:
# up to 1 MiB, allocations share the driver's 2 MiB pages, each taking a power of two
# of at least 512 bytes (2000 one-byte ones took one page; 8192 of 700 bytes took
# 19.2 MB, 2 KiB each and the pages' slack: a 512-byte step undercharged them 2.3
# times); above, each is rounded up to whole 2 MiB pages (1 MiB + 1 took 2 MiB,
# 2 MiB + 1 took 4 MiB).
_SMALL_LIMIT = 1 << 20
_SMALL_MIN = 512
_PAGE = 2 << 20


def driver_footprint(size: int) -> int:
    if size <= _SMALL_LIMIT:
        return max(_SMALL_MIN, 1 << (max(size, 1) - 1).bit_length())
    return -(-size // _PAGE) * _PAGE


# launch_burst.ENTRIES name -> libcuda symbol (cuda.h's _v2 where it has one).


class MappedWindow:
    """Device memory mapped (cuMemCreate + cuMemMap) into a vGPU's address window,
    whose bookkeeping is ``address_window.AddressWindow``'s.

    Each allocation is rounded up to the allocation granularity (2 MiB on
    current GPUs), so many small allocations cost more memory than cuMemAlloc's.
    A guest's own reservations (cuMemAddressReserve) are carved from it too.
    """

    def __init__(self, ordinal: int, index: int):
        self.prop = device_memory(ordinal)
        self.access = access(self.prop, 3)
        granularity = int(ok(cu.cuMemGetAllocationGranularity(
            self.prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))
        hint = window_hint(index)
        base = int(ok(cu.cuMemAddressReserve(WINDOW_SIZE, 0, hint, 0), "cuMemAddressReserve"))
        if base != hint:
            log.warning(
                "vGPU %d: the driver put its address window at 0x%x, not 0x%x; its addresses "
                "may coincide with another vGPU's of the same VM", index, base, hint)
        self.ranges = AddressWindow(base, WINDOW_SIZE, granularity)
        self.footprint = self.ranges.footprint
        self.reserve = self.ranges.reserve
        self.unreserve = self.ranges.unreserve

    def alloc(self, size: int) -> int:
        at, n = self.ranges.take(size)
        try:
            handle = ok(cu.cuMemCreate(n, self.prop, 0), f"cuMemCreate({n})")
            try:
                ok(cu.cuMemMap(at, n, 0, handle, 0), "cuMemMap")
                ok(cu.cuMemSetAccess(at, n, [self.access], 1), "cuMemSetAccess")
            finally:
                cu.cuMemRelease(handle)  # the mapping holds the memory from here on
        except CudaError:
            cu.cuMemUnmap(at, n)
            self.ranges.give_back(at)
            raise
        return at

    def free(self, dptr: int) -> None:
        ok(cu.cuMemUnmap(dptr, self.ranges.size_of(dptr)), "cuMemUnmap")
        self.ranges.give_back(dptr)


class MemoryCalls:
    """``GpuDevice``'s memory methods over the driver."""

    # -- memory -------------------------------------------------------------

    def footprint(self, size: int) -> int:
        if self._window is not None:
            return self._window.footprint(size)
        return driver_footprint(size)

    def mem_alloc(self, size: int) -> int:
        if self._window is not None:
            return self._window.alloc(size)
        return int(ok(cu.cuMemAlloc(size), f"cuMemAlloc({size})"))

    def mem_free(self, dptr: int) -> None:
        if self._window is not None:
            return self._window.free(dptr)
        ok(cu.cuMemFree(dptr), "cuMemFree")

    # -- virtual memory management -----------------------------------------------

    def mem_granularity(self, option: int, compression: int = 0) -> int:
        g = self._granularity.get((option, compression))
        if g is None:
            g = self._granularity[(option, compression)] = int(ok(
                cu.cuMemGetAllocationGranularity(self._compressed(compression),
                                                 cu.CUmemAllocationGranularity_flags(option)),
                "cuMemGetAllocationGranularity"))
        return g

    def _compressed(self, compression: int):
        """CUmemAllocationProp of this device's memory with ``compression``."""
        if not compression:
            return self._memory
        prop = device_memory(self.ordinal)
        prop.allocFlags.compressionType = compression
        return prop

    def address_reserve(self, size: int, alignment: int, hint: int) -> int:
        if self._window is not None:  # this vGPU's addresses stay inside its window
            return self._window.reserve(size, alignment)
        return int(ok(cu.cuMemAddressReserve(size, alignment, hint, 0), "cuMemAddressReserve"))

    def address_free(self, ptr: int, size: int) -> None:
        if self._window is not None:
            return self._window.unreserve(ptr, size)
        ok(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")

    def mem_create(self, size: int, compression: int = 0):
        return ok(cu.cuMemCreate(size, self._compressed(compression), 0), f"cuMemCreate({size})")

    def mem_compression(self, handle) -> int:
        prop = ok(cu.cuMemGetAllocationPropertiesFromHandle(handle),
                  "cuMemGetAllocationPropertiesFromHandle")
        return int(prop.allocFlags.compressionType)

    def mem_release(self, handle) -> None:
        ok(cu.cuMemRelease(handle), "cuMemRelease")

    def mem_map(self, ptr: int, size: int, offset: int, handle) -> None:
        ok(cu.cuMemMap(ptr, size, offset, handle, 0), "cuMemMap")

    def mem_unmap(self, ptr: int, size: int) -> None:
        ok(cu.cuMemUnmap(ptr, size), "cuMemUnmap")

    def mem_set_access(self, ptr: int, size: int, flags: int) -> None:
        ok(cu.cuMemSetAccess(ptr, size, [access(self._memory, flags)], 1), "cuMemSetAccess")

    def mem_get_access(self, ptr: int) -> int:
        return int(ok(cu.cuMemGetAccess(self._memory.location, ptr), "cuMemGetAccess"))

    # -- stream-ordered allocation -------------------------------------------------

    def pool_create(self, max_size: int):
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = self.ordinal
        if max_size:
            props.maxSize = max_size
        return ok(cu.cuMemPoolCreate(props), "cuMemPoolCreate")

    def pool_destroy(self, pool) -> None:
        ok(cu.cuMemPoolDestroy(pool), "cuMemPoolDestroy")

    def pool_alloc(self, size: int, pool, stream) -> int:
        return int(ok(cu.cuMemAllocFromPoolAsync(size, pool, stream),
                       f"cuMemAllocFromPoolAsync({size})"))

    def pool_free(self, ptr: int, stream) -> None:
        ok(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")

    # Attribute values go through libcuda directly: their C type depends on the attribute
    # (int for the reuse flags 1..3, cuuint64_t for the sizes 4..8).
    def pool_attribute(self, pool, attrib: int) -> int:
        value = ctypes.c_int(0) if attrib <= 3 else ctypes.c_uint64(0)
        err = driver_library().cuMemPoolGetAttribute(ctypes.c_void_p(int(pool)), attrib,
                                                      ctypes.byref(value))
        if err:
            fail(err, "cuMemPoolGetAttribute")
        return int(value.value)

    def pool_set_attribute(self, pool, attrib: int, value: int) -> None:
        raw = ctypes.c_int(value) if attrib <= 3 else ctypes.c_uint64(value)
        err = driver_library().cuMemPoolSetAttribute(ctypes.c_void_p(int(pool)), attrib,
                                                      ctypes.byref(raw))
        if err:
            fail(err, "cuMemPoolSetAttribute")

    def pool_trim(self, pool, keep: int) -> None:
        ok(cu.cuMemPoolTrimTo(pool, keep), "cuMemPoolTrimTo")

    def host_alloc(self, size: int) -> tuple[int, memoryview]:
        addr = int(ok(cu.cuMemHostAlloc(size, 0), f"cuMemHostAlloc({size})"))
        return addr, memoryview((ctypes.c_char * size).from_address(addr)).cast("B")

    def host_free(self, addr: int) -> None:
        ok(cu.cuMemFreeHost(addr), "cuMemFreeHost")

    def host_register(self, addr: int, size: int, flags: int = 1) -> None:
        # portable (1): every context of this process may copy from and to it
        ok(cu.cuMemHostRegister(addr, size, flags), f"cuMemHostRegister({size}, {flags:#x})")

    def host_device_pointer(self, addr: int) -> int:
        return int(ok(cu.cuMemHostGetDevicePointer(addr, 0), "cuMemHostGetDevicePointer"))

    def host_unregister(self, addr: int) -> None:
        ok(cu.cuMemHostUnregister(addr), "cuMemHostUnregister")

    def memcpy_htod_async(self, dst, src_addr, n, stream) -> None:
        ok(cu.cuMemcpyHtoDAsync(dst, src_addr, n, stream), "cuMemcpyHtoDAsync")

    def memcpy_dtoh_async(self, dst_addr, src, n, stream) -> None:
        ok(cu.cuMemcpyDtoHAsync(dst_addr, src, n, stream), "cuMemcpyDtoHAsync")

    def memcpy_dtod_async(self, dst, src, n, stream) -> None:
        ok(cu.cuMemcpyDtoDAsync(dst, src, n, stream), "cuMemcpyDtoDAsync")

    def memset_async(self, dst, value, width, count, stream) -> None:
        fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[width]
        ok(fn(dst, value & ((1 << (8 * width)) - 1), count, stream), "cuMemsetAsync")
