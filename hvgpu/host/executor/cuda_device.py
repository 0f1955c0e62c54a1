"""``GpuDevice`` over the CUDA driver API (cuda-python's ``cuda.bindings``).

The one module in hvgpu that owns the CUDA driver library (cuda.bindings and
libcuda.so.1 through ctypes): nothing else imports or loads it. It holds one
context (the device's primary context, so every executor process has its own)
and turns every non-success ``CUresult`` into ``CudaError`` with CUDA's own
number. It must not validate guest input beyond what the driver does: the
session has already checked handles and address ranges.

Beside it, each with one job: ``address_window`` keeps the books of a vGPU
N >= 1's address window (this module maps memory into it); ``compiler`` owns
NVRTC, a separate library, and runs it in a confined child (``compile`` here
only hands the source over).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

from hvgpu.errors import CudaError
from hvgpu.host.executor import compiler
from hvgpu.host.executor.address_window import WINDOW_SIZE, AddressWindow, window_hint
from hvgpu.host.executor.device import STREAM_LEGACY, STREAM_PER_THREAD
from hvgpu.virtio import protocol as P

try:
    from cuda.bindings import driver as cu
except ImportError as exc:  # reported to the guest by the executor, not a crash
    cu = None
    _IMPORT_ERROR = str(exc)
else:
    _IMPORT_ERROR = ""

log = logging.getLogger(__name__)

_CU_STREAM_NON_BLOCKING = 1
_MPS_SERVER_NOT_READY = P.CUDA_ERROR_MPS_SERVER_NOT_READY
_MPS_NOT_READY_WAIT = 30.0


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
_C_LOOP_SYMBOLS = {
    "cuLaunchKernel": "cuLaunchKernel", "cuLaunchKernelEx": "cuLaunchKernelEx",
    "cuEventRecord": "cuEventRecord", "cuStreamWaitEvent": "cuStreamWaitEvent",
    "cuEventSynchronize": "cuEventSynchronize", "cuMemsetD8Async": "cuMemsetD8Async",
    "cuMemsetD16Async": "cuMemsetD16Async", "cuMemsetD32Async": "cuMemsetD32Async",
    "cuMemcpyDtoDAsync": "cuMemcpyDtoDAsync_v2", "cuMemcpyHtoDAsync": "cuMemcpyHtoDAsync_v2"}


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("kernel_params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _MemsetNodeParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t),
                ("height", ctypes.c_size_t)]


def _side(prefix: str) -> list:
    s = ctypes.c_size_t
    return [(prefix + "x", s), (prefix + "y", s), (prefix + "z", s), (prefix + "lod", s),
            (prefix + "memory_type", ctypes.c_int), (prefix + "host", ctypes.c_void_p),
            (prefix + "device", ctypes.c_uint64), (prefix + "array", ctypes.c_void_p),
            (prefix + "reserved", ctypes.c_void_p), (prefix + "pitch", s),
            (prefix + "height", s)]


class _Memcpy3D(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = _side("src_") + _side("dst_") + [
        ("width_bytes", ctypes.c_size_t), ("height", ctypes.c_size_t),
        ("depth", ctypes.c_size_t)]


class _UpdateResultInfo(ctypes.Structure):  # CUgraphExecUpdateResultInfo
    _fields_ = [("result", ctypes.c_int), ("error_node", ctypes.c_void_p),
                ("error_from_node", ctypes.c_void_p)]


_HOST, _DEVICE = 1, 2  # CUmemorytype
_libcuda = None


def _driver_library():
    """libcuda itself, for the calls whose arguments are raw C structures from the guest
    (launch attributes, tensor maps): passed through as bytes, not rebuilt field by field."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _libcuda.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                              ctypes.c_void_p, ctypes.c_void_p]
        for name in ("cuOccupancyMaxActiveClusters", "cuOccupancyMaxPotentialClusterSize"):
            getattr(_libcuda, name).argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                ctypes.POINTER(_LaunchConfig)]
        for name in ("cuMemPoolGetAttribute", "cuMemPoolSetAttribute"):
            getattr(_libcuda, name).argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        _libcuda.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_char_p,
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int]
    return _libcuda


def _status(err) -> int:
    return int(getattr(err, "value", err))


def _raise(err, what: str):
    status = _status(err)
    text = ""
    if cu is not None:
        try:
            e, desc = cu.cuGetErrorString(err)
            if _status(e) == 0 and desc:
                text = desc.decode()
        except Exception:
            pass
    raise CudaError(status, f"{what}: {text}" if text else what)


def _ok(result, what: str):
    err = result[0]
    if _status(err) != 0:
        _raise(err, what)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _device_memory(ordinal: int):
    """CUmemAllocationProp of device memory on ``ordinal``, exportable by no handle."""
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    return prop


def _access(prop, flags: int):
    desc = cu.CUmemAccessDesc()
    desc.location = prop.location
    desc.flags = cu.CUmemAccess_flags(flags)
    return desc


class _MappedWindow:
    """Device memory mapped (cuMemCreate + cuMemMap) into a vGPU's address window,
    whose bookkeeping is ``address_window.AddressWindow``'s.

    Each allocation is rounded up to the allocation granularity (2 MiB on
    current GPUs), so many small allocations cost more memory than cuMemAlloc's.
    A guest's own reservations (cuMemAddressReserve) are carved from it too.
    """

    def __init__(self, ordinal: int, index: int):
        self.prop = _device_memory(ordinal)
        self.access = _access(self.prop, 3)
        granularity = int(_ok(cu.cuMemGetAllocationGranularity(
            self.prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))
        hint = window_hint(index)
        base = int(_ok(cu.cuMemAddressReserve(WINDOW_SIZE, 0, hint, 0), "cuMemAddressReserve"))
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
            handle = _ok(cu.cuMemCreate(n, self.prop, 0), f"cuMemCreate({n})")
            try:
                _ok(cu.cuMemMap(at, n, 0, handle, 0), "cuMemMap")
                _ok(cu.cuMemSetAccess(at, n, [self.access], 1), "cuMemSetAccess")
            finally:
                cu.cuMemRelease(handle)  # the mapping holds the memory from here on
        except CudaError:
            cu.cuMemUnmap(at, n)
            self.ranges.give_back(at)
            raise
        return at

    def free(self, dptr: int) -> None:
        _ok(cu.cuMemUnmap(dptr, self.ranges.size_of(dptr)), "cuMemUnmap")
        self.ranges.give_back(dptr)


class CudaDevice:
    """One GPU, one context, in this executor process."""

    caps = P.CAP_NVRTC | P.CAP_PARAM_INFO

    def __init__(self, ordinal: int = 0, address_window: int = 0):
        if cu is None:
            raise CudaError(P.HV_NO_GPU, "cuda-python (cuda-bindings) is not installed on "
                            f"the host ({_IMPORT_ERROR}); install hvgpu[host]")
        # After a kernel fault, MPS takes no new client until the faulted one has
        # exited (seen on the H200: 807 meanwhile); that executor is on its way out.
        deadline = time.monotonic() + _MPS_NOT_READY_WAIT
        while True:
            try:
                err, = cu.cuInit(0)
            except RuntimeError as exc:  # libcuda.so.1 could not be loaded
                raise CudaError(P.HV_NO_GPU, f"no NVIDIA driver on the host: {exc}") from None
            if _status(err) != _MPS_SERVER_NOT_READY or time.monotonic() > deadline:
                break
            log.info("MPS server not ready for a new client yet (a faulted one is ending); "
                     "trying again")
            time.sleep(0.25)
        if _status(err) != 0:
            _raise(err, "cuInit: no usable NVIDIA driver/GPU on the host")
        self.ordinal = ordinal
        self.dev = _ok(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.ctx = _ok(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self._tls = threading.local()
        self.bind_thread()
        self._specials = {0: cu.CUstream(0), STREAM_LEGACY: cu.CUstream(STREAM_LEGACY),
                          STREAM_PER_THREAD: cu.CUstream(STREAM_PER_THREAD)}
        # Launches go to libcuda directly: cuda-bindings' argument conversion was the
        # largest part of a launch's cost in the executor (bench/data_lane.py).
        self._launch = _driver_library().cuLaunchKernel
        major = self.attribute(75)
        minor = self.attribute(76)
        self.arch = f"sm_{major}{minor}"
        self._window = _MappedWindow(ordinal, address_window) if address_window else None
        self._memory = _device_memory(ordinal)
        self._granularity: dict[int, int] = {}

    def bind_thread(self) -> None:
        """Make this context current on the calling thread, with its own launch buffer.

        The launch parameter buffer travels by CUDA's `extra` form, so a launch
        costs one copy and no per-parameter pointer array; each thread (one per
        guest connection) has its own, so launches never race.
        """
        _ok(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        # Guest threads share this one: the driver's per-thread capture rules cannot tell
        # them apart, so none of their calls is refused for another's capture (graphs.py).
        _ok(cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode(2)),
            "cuThreadExchangeStreamCaptureMode")
        tls = self._tls
        if not hasattr(tls, "extra_addr"):
            tls.params = ctypes.create_string_buffer(P.MAX_PARAMS)
            tls.view = memoryview(tls.params).cast("B")
            tls.size = ctypes.c_size_t(0)
            tls.extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(tls.params), 2,
                                              ctypes.addressof(tls.size), 0)
            tls.extra_addr = ctypes.addressof(tls.extra)

    # -- device --------------------------------------------------------------

    def driver_version(self) -> int:
        return _ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")

    def attribute(self, attrib: int) -> int:
        try:
            which = cu.CUdevice_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown device attribute {attrib}") from None
        return _ok(cu.cuDeviceGetAttribute(which, self.dev), "cuDeviceGetAttribute")

    def name(self) -> str:
        raw = _ok(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    def uuid(self) -> bytes:
        return bytes(_ok(cu.cuDeviceGetUuid(self.dev), "cuDeviceGetUuid").bytes)[:P.UUID_SIZE]

    def total_mem(self) -> int:
        return _ok(cu.cuDeviceTotalMem(self.dev), "cuDeviceTotalMem")

    def mem_info(self) -> tuple[int, int]:
        free, total = _ok(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def ctx_limit(self, limit: int) -> int:
        try:
            which = cu.CUlimit(limit)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown context limit {limit}") from None
        return int(_ok(cu.cuCtxGetLimit(which), "cuCtxGetLimit"))

    def synchronize(self) -> None:
        _ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # -- memory -------------------------------------------------------------

    def footprint(self, size: int) -> int:
        if self._window is not None:
            return self._window.footprint(size)
        return driver_footprint(size)

    def mem_alloc(self, size: int) -> int:
        if self._window is not None:
            return self._window.alloc(size)
        return int(_ok(cu.cuMemAlloc(size), f"cuMemAlloc({size})"))

    def mem_free(self, dptr: int) -> None:
        if self._window is not None:
            return self._window.free(dptr)
        _ok(cu.cuMemFree(dptr), "cuMemFree")

    # -- virtual memory management -----------------------------------------------

    def mem_granularity(self, option: int) -> int:
        g = self._granularity.get(option)
        if g is None:
            g = self._granularity[option] = int(_ok(cu.cuMemGetAllocationGranularity(
                self._memory, cu.CUmemAllocationGranularity_flags(option)),
                "cuMemGetAllocationGranularity"))
        return g

    def address_reserve(self, size: int, alignment: int, hint: int) -> int:
        if self._window is not None:  # this vGPU's addresses stay inside its window
            return self._window.reserve(size, alignment)
        return int(_ok(cu.cuMemAddressReserve(size, alignment, hint, 0), "cuMemAddressReserve"))

    def address_free(self, ptr: int, size: int) -> None:
        if self._window is not None:
            return self._window.unreserve(ptr, size)
        _ok(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")

    def mem_create(self, size: int):
        return _ok(cu.cuMemCreate(size, self._memory, 0), f"cuMemCreate({size})")

    def mem_release(self, handle) -> None:
        _ok(cu.cuMemRelease(handle), "cuMemRelease")

    def mem_map(self, ptr: int, size: int, offset: int, handle) -> None:
        _ok(cu.cuMemMap(ptr, size, offset, handle, 0), "cuMemMap")

    def mem_unmap(self, ptr: int, size: int) -> None:
        _ok(cu.cuMemUnmap(ptr, size), "cuMemUnmap")

    def mem_set_access(self, ptr: int, size: int, flags: int) -> None:
        _ok(cu.cuMemSetAccess(ptr, size, [_access(self._memory, flags)], 1), "cuMemSetAccess")

    def mem_get_access(self, ptr: int) -> int:
        return int(_ok(cu.cuMemGetAccess(self._memory.location, ptr), "cuMemGetAccess"))

    # -- stream-ordered allocation -------------------------------------------------

    def pool_create(self, max_size: int):
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = self.ordinal
        if max_size:
            props.maxSize = max_size
        return _ok(cu.cuMemPoolCreate(props), "cuMemPoolCreate")

    def pool_destroy(self, pool) -> None:
        _ok(cu.cuMemPoolDestroy(pool), "cuMemPoolDestroy")

    def pool_alloc(self, size: int, pool, stream) -> int:
        return int(_ok(cu.cuMemAllocFromPoolAsync(size, pool, stream),
                       f"cuMemAllocFromPoolAsync({size})"))

    def pool_free(self, ptr: int, stream) -> None:
        _ok(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")

    # Attribute values go through libcuda directly: their C type depends on the attribute
    # (int for the reuse flags 1..3, cuuint64_t for the sizes 4..8).
    def pool_attribute(self, pool, attrib: int) -> int:
        value = ctypes.c_int(0) if attrib <= 3 else ctypes.c_uint64(0)
        err = _driver_library().cuMemPoolGetAttribute(ctypes.c_void_p(int(pool)), attrib,
                                                      ctypes.byref(value))
        if err:
            _raise(err, "cuMemPoolGetAttribute")
        return int(value.value)

    def pool_set_attribute(self, pool, attrib: int, value: int) -> None:
        raw = ctypes.c_int(value) if attrib <= 3 else ctypes.c_uint64(value)
        err = _driver_library().cuMemPoolSetAttribute(ctypes.c_void_p(int(pool)), attrib,
                                                      ctypes.byref(raw))
        if err:
            _raise(err, "cuMemPoolSetAttribute")

    def pool_trim(self, pool, keep: int) -> None:
        _ok(cu.cuMemPoolTrimTo(pool, keep), "cuMemPoolTrimTo")

    def host_alloc(self, size: int) -> tuple[int, memoryview]:
        addr = int(_ok(cu.cuMemHostAlloc(size, 0), f"cuMemHostAlloc({size})"))
        return addr, memoryview((ctypes.c_char * size).from_address(addr)).cast("B")

    def host_free(self, addr: int) -> None:
        _ok(cu.cuMemFreeHost(addr), "cuMemFreeHost")

    def host_register(self, addr: int, size: int) -> None:
        # portable: every context of this process may copy from and to it
        _ok(cu.cuMemHostRegister(addr, size, 1),  # CU_MEMHOSTREGISTER_PORTABLE
            f"cuMemHostRegister({size})")

    def host_unregister(self, addr: int) -> None:
        _ok(cu.cuMemHostUnregister(addr), "cuMemHostUnregister")

    def stream(self, special: int):
        return self._specials[special]

    def memcpy_htod_async(self, dst, src_addr, n, stream) -> None:
        _ok(cu.cuMemcpyHtoDAsync(dst, src_addr, n, stream), "cuMemcpyHtoDAsync")

    def memcpy_dtoh_async(self, dst_addr, src, n, stream) -> None:
        _ok(cu.cuMemcpyDtoHAsync(dst_addr, src, n, stream), "cuMemcpyDtoHAsync")

    def memcpy_dtod_async(self, dst, src, n, stream) -> None:
        _ok(cu.cuMemcpyDtoDAsync(dst, src, n, stream), "cuMemcpyDtoDAsync")

    def memset_async(self, dst, value, width, count, stream) -> None:
        fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[width]
        _ok(fn(dst, value & ((1 << (8 * width)) - 1), count, stream), "cuMemsetAsync")

    # -- modules and launches --------------------------------------------------

    def module_load(self, image: bytes):
        if not (image.startswith(b"\x7fELF") or image[:4] == b"\x50\xed\x55\xba"):
            if not image.endswith(b"\0"):  # PTX text must be NUL-terminated
                image += b"\0"
        return _ok(cu.cuModuleLoadData(image), "cuModuleLoadData")

    def module_unload(self, module) -> None:
        _ok(cu.cuModuleUnload(module), "cuModuleUnload")

    def module_function(self, module, name: str):
        return _ok(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name!r})")

    def module_global(self, module, name: str) -> tuple[int, int]:
        dptr, size = _ok(cu.cuModuleGetGlobal(module, name.encode()),
                         f"cuModuleGetGlobal({name!r})")
        return int(dptr), int(size)

    def func_attribute(self, function, attrib: int) -> int:
        try:
            which = cu.CUfunction_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}") from None
        return int(_ok(cu.cuFuncGetAttribute(which, function), "cuFuncGetAttribute"))

    def func_set_attribute(self, function, attrib: int, value: int) -> None:
        try:
            which = cu.CUfunction_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}") from None
        _ok(cu.cuFuncSetAttribute(function, which, value), "cuFuncSetAttribute")

    def func_set_cache_config(self, function, config: int) -> None:
        try:
            which = cu.CUfunc_cache(config)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown cache configuration {config}") from None
        _ok(cu.cuFuncSetCacheConfig(function, which), "cuFuncSetCacheConfig")

    def occupancy_max_blocks(self, function, block_size: int, shared_mem: int, flags: int) -> int:
        return int(_ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            function, block_size, shared_mem, flags), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def param_layout(self, function) -> list[tuple[int, int]]:
        layout = []
        for index in range(P.MAX_PARAMS // 4):
            err, offset, size = cu.cuFuncGetParamInfo(function, index)
            if _status(err) == P.CUDA_ERROR_INVALID_VALUE:
                break  # past the last parameter
            if _status(err) != 0:
                _raise(err, "cuFuncGetParamInfo")
            layout.append((int(offset), int(size)))
        return layout

    def _extra(self, params):
        """CUDA's `extra` array for this thread's launch buffer, holding ``params``
        (None when the kernel takes none)."""
        n = len(params)
        if not n:
            return None
        if n > P.MAX_PARAMS:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{n} bytes of kernel parameters")
        tls = self._tls
        tls.view[:n] = params
        tls.size.value = n
        return tls.extra_addr

    def launch(self, function, grid, block, shared_mem, stream, params) -> None:
        err = self._launch(int(function), grid[0], grid[1], grid[2], block[0], block[1],
                           block[2], shared_mem, int(stream), None, self._extra(params))
        if err:
            _raise(err, "cuLaunchKernel")

    def driver_entries(self) -> dict[str, int]:
        """libcuda's entry points for the session's C loop (launch_burst), by the names
        in launch_burst.ENTRIES: the symbols cuda.h maps those names to, with the
        legacy default stream, as cuda-bindings and the calls above use."""
        lib = _driver_library()
        entries = {}
        for name, symbol in _C_LOOP_SYMBOLS.items():
            try:
                entries[name] = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
            except AttributeError:  # an older driver: that op goes through Python
                log.info("libcuda has no %s; its frames go through the Python path", symbol)
        return entries

    def handle_value(self, handle) -> int:
        """The CUfunction, CUstream or CUevent pointer behind a handle this device
        returned."""
        return int(handle)

    def launch_ex(self, function, grid, block, shared_mem, stream, params, attrs) -> None:
        extra = self._extra(params)
        raw = ctypes.create_string_buffer(bytes(attrs), max(len(attrs), 1))
        cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                            int(stream), ctypes.addressof(raw),
                            len(attrs) // P.LAUNCH_ATTR_SIZE)
        err = _driver_library().cuLaunchKernelEx(ctypes.byref(cfg), int(function), None, extra)
        if err:
            _raise(err, "cuLaunchKernelEx")

    def occupancy_clusters(self, which, function, grid, block, shared_mem, attrs) -> int:
        raw = ctypes.create_string_buffer(bytes(attrs), max(len(attrs), 1))
        cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                            None, ctypes.addressof(raw), len(attrs) // P.LAUNCH_ATTR_SIZE)
        name = ("cuOccupancyMaxActiveClusters", "cuOccupancyMaxPotentialClusterSize")[which]
        value = ctypes.c_int()
        err = getattr(_driver_library(), name)(ctypes.byref(value), int(function),
                                               ctypes.byref(cfg))
        if err:
            _raise(err, name)
        return value.value

    def occupancy_available_smem(self, function, blocks: int, block_size: int) -> int:
        return int(_ok(cu.cuOccupancyAvailableDynamicSMemPerBlock(function, blocks, block_size),
                       "cuOccupancyAvailableDynamicSMemPerBlock"))

    def tensor_map_encode_tiled(self, dtype, rank, address, dims, strides, box, element_strides,
                                interleave, swizzle, l2, oob) -> bytes:
        # CUtensorMap is 64-byte aligned
        buf = ctypes.create_string_buffer(P.TENSOR_MAP_SIZE + 64)
        at = (ctypes.addressof(buf) + 63) & ~63
        err = _driver_library().cuTensorMapEncodeTiled(
            at, dtype, rank, address, bytes(dims), bytes(strides) or None, bytes(box),
            bytes(element_strides), interleave, swizzle, l2, oob)
        if err:
            _raise(err, "cuTensorMapEncodeTiled")
        return ctypes.string_at(at, P.TENSOR_MAP_SIZE)

    def compiler_id(self) -> str:
        return f"nvrtc-{compiler.nvrtc_version() or 'none'}-{self.arch}"

    def compile(self, source: bytes, name: str, options: list[str],
                headers: dict[str, bytes]) -> tuple[bytes, str]:
        # In a confined child process, never in this one (compiler's docstring says why).
        return compiler.compile_confined(source, name, options, headers, self.arch)

    # -- streams and events ---------------------------------------------------

    def stream_create(self, flags: int, priority: int = 0):
        if priority:
            return _ok(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority")
        return _ok(cu.cuStreamCreate(flags), "cuStreamCreate")

    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = _ok(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def stream_destroy(self, stream) -> None:
        _ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")

    def stream_synchronize(self, stream) -> None:
        _ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def stream_query(self, stream) -> bool:
        err, = cu.cuStreamQuery(stream)
        if _status(err) == P.CUDA_ERROR_NOT_READY:
            return False
        if _status(err) != 0:
            _raise(err, "cuStreamQuery")
        return True

    def stream_wait_event(self, stream, event, flags) -> None:
        _ok(cu.cuStreamWaitEvent(stream, event, flags), "cuStreamWaitEvent")

    def event_create(self, flags: int):
        return _ok(cu.cuEventCreate(flags), "cuEventCreate")

    def event_destroy(self, event) -> None:
        _ok(cu.cuEventDestroy(event), "cuEventDestroy")

    def event_record(self, event, stream) -> None:
        _ok(cu.cuEventRecord(event, stream), "cuEventRecord")

    def event_query(self, event) -> bool:
        err, = cu.cuEventQuery(event)
        if _status(err) == P.CUDA_ERROR_NOT_READY:
            return False
        if _status(err) != 0:
            _raise(err, "cuEventQuery")
        return True

    def event_synchronize(self, event) -> None:
        _ok(cu.cuEventSynchronize(event), "cuEventSynchronize")

    def event_elapsed(self, start, end) -> float:
        fn = getattr(cu, "cuEventElapsedTime", None) or cu.cuEventElapsedTime_v2
        return float(_ok(fn(start, end), "cuEventElapsedTime"))

    # -- stream capture and graphs ---------------------------------------------------

    def stream_begin_capture(self, stream, mode: int) -> None:
        _ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode(mode)),
            "cuStreamBeginCapture")

    def stream_end_capture(self, stream):
        return _ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")

    def stream_capture_info(self, stream) -> tuple[int, int, object, list]:
        # cuda-bindings 12 answers (err, status, id, graph, deps, n); 13 adds edge data
        # before n. Only the first four outputs are read.
        result = cu.cuStreamGetCaptureInfo(stream)
        if _status(result[0]) != 0:
            _raise(result[0], "cuStreamGetCaptureInfo")
        status, cid, graph, deps = result[1], result[2], result[3], result[4]
        n = int(result[-1])
        return int(status), int(cid), graph, list(deps or [])[:n]

    def graph_node_count(self, graph) -> int:
        return int(_ok(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])

    def graph_nodes(self, graph) -> list:
        _, count = _ok(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
        if not count:
            return []
        nodes, count = _ok(cu.cuGraphGetNodes(graph, int(count)), "cuGraphGetNodes")
        return list(nodes)[:int(count)]

    def _nodes(self, nodes: list):
        return (ctypes.c_void_p * max(len(nodes), 1))(*[int(n) for n in nodes])

    def _add(self, what: str, fn, graph, deps: list, *rest) -> int:
        node = ctypes.c_void_p()
        err = fn(ctypes.byref(node), ctypes.c_void_p(int(graph)), self._nodes(deps),
                 ctypes.c_size_t(len(deps)), *rest)
        if err:
            _raise(err, what)
        return node.value or 0

    def _kernel_params(self, function, grid, block, shared_mem, params: bytes):
        buf = ctypes.create_string_buffer(bytes(params), max(len(params), 1))
        size = ctypes.c_size_t(len(params))
        extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
        p = _KernelNodeParams(int(function), (ctypes.c_uint * 3)(*grid),
                              (ctypes.c_uint * 3)(*block), shared_mem, None,
                              ctypes.addressof(extra), None, None)
        return p, (buf, size, extra)  # the driver copies them; kept alive over the call

    def graph_create(self):
        graph = ctypes.c_void_p()
        err = _driver_library().cuGraphCreate(ctypes.byref(graph), 0)
        if err:
            _raise(err, "cuGraphCreate")
        return cu.CUgraph(graph.value)

    def graph_add_kernel(self, graph, deps, function, grid, block, shared_mem, params):
        p, keep = self._kernel_params(function, grid, block, shared_mem, params)
        return cu.CUgraphNode(self._add("cuGraphAddKernelNode", _driver_library().cuGraphAddKernelNode_v2,
                                        graph, deps, ctypes.byref(p)))

    def graph_add_memset(self, graph, deps, dst, pitch, value, element_size, width, height):
        p = _MemsetNodeParams(dst, pitch if height > 1 else width * element_size, value,
                              element_size, width, height)
        return cu.CUgraphNode(self._add("cuGraphAddMemsetNode", _driver_library().cuGraphAddMemsetNode,
                                        graph, deps, ctypes.byref(p),
                                        ctypes.c_void_p(int(self.ctx))))

    def graph_add_memcpy(self, graph, deps, kind, dst, src, size):
        p = _Memcpy3D()
        p.src_memory_type = _HOST if kind == 1 else _DEVICE
        p.dst_memory_type = _HOST if kind == 2 else _DEVICE
        if kind == 1:
            p.src_host = src
        else:
            p.src_device = src
        if kind == 2:
            p.dst_host = dst
        else:
            p.dst_device = dst
        p.width_bytes, p.height, p.depth = size, 1, 1
        return cu.CUgraphNode(self._add("cuGraphAddMemcpyNode", _driver_library().cuGraphAddMemcpyNode,
                                        graph, deps, ctypes.byref(p),
                                        ctypes.c_void_p(int(self.ctx))))

    def graph_add_empty(self, graph, deps):
        return cu.CUgraphNode(self._add("cuGraphAddEmptyNode", _driver_library().cuGraphAddEmptyNode,
                                        graph, deps))

    def graph_add_event(self, graph, deps, wait, event):
        lib = _driver_library()
        fn, what = ((lib.cuGraphAddEventWaitNode, "cuGraphAddEventWaitNode") if wait else
                    (lib.cuGraphAddEventRecordNode, "cuGraphAddEventRecordNode"))
        return cu.CUgraphNode(self._add(what, fn, graph, deps, ctypes.c_void_p(int(event))))

    def graph_add_dependencies(self, graph, sources, targets) -> None:
        err = _driver_library().cuGraphAddDependencies_v2(
            ctypes.c_void_p(int(graph)), self._nodes(sources), self._nodes(targets), None,
            ctypes.c_size_t(len(sources)))
        if err:
            _raise(err, "cuGraphAddDependencies")

    def graph_exec_kernel_set(self, exec_, node, function, grid, block, shared_mem, params):
        p, keep = self._kernel_params(function, grid, block, shared_mem, params)
        err = _driver_library().cuGraphExecKernelNodeSetParams_v2(
            ctypes.c_void_p(int(exec_)), ctypes.c_void_p(int(node)), ctypes.byref(p))
        if err:
            _raise(err, "cuGraphExecKernelNodeSetParams")

    def graph_exec_update(self, exec_, graph):
        info = _UpdateResultInfo()
        err = _driver_library().cuGraphExecUpdate_v2(ctypes.c_void_p(int(exec_)),
                                                     ctypes.c_void_p(int(graph)),
                                                     ctypes.byref(info))
        node = cu.CUgraphNode(info.error_node) if info.error_node else None
        if err and not info.result:
            _raise(err, "cuGraphExecUpdate")
        return int(info.result), node

    def graph_instantiate(self, graph, flags: int):
        return _ok(cu.cuGraphInstantiate(graph, flags), "cuGraphInstantiate")

    def graph_launch(self, exec_, stream) -> None:
        err = _driver_library().cuGraphLaunch(ctypes.c_void_p(int(exec_)),
                                              ctypes.c_void_p(int(stream)))
        if err:
            _raise(err, "cuGraphLaunch")

    def graph_upload(self, exec_, stream) -> None:
        _ok(cu.cuGraphUpload(exec_, stream), "cuGraphUpload")

    def graph_destroy(self, graph) -> None:
        _ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")

    def graph_exec_destroy(self, exec_) -> None:
        _ok(cu.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")

    def close(self) -> None:
        if self.ctx is not None:
            cu.cuDevicePrimaryCtxRelease(self.dev)
            self.ctx = None
