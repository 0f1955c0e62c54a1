"""``GpuDevice`` over the CUDA driver API (cuda-python's ``cuda.bindings``).

The one package in hvgpu that owns the CUDA driver library (cuda.bindings and
libcuda.so.1 through ctypes, loaded by ``driver``): nothing else imports or
loads it. :class:`CudaDevice` holds one context (the device's primary context,
so every executor process has its own) and turns every non-success
``CUresult`` into ``CudaError`` with CUDA's own number. Its methods come in
families, one module each, as the session's ops do: ``memory`` (allocations,
copies, VMM, pools), ``modules`` (modules, functions, launches, the C loop's
entry points), ``streams`` (streams and events), ``graphs`` (capture and
graphs), ``arrays`` (arrays, texture and surface objects, 3D copies); the
context and device queries are here. It must not validate guest
input beyond what the driver does: the session has already checked handles
and address ranges.

Beside it, each with one job: ``address_window`` keeps the books of a vGPU
N >= 1's address window (``memory`` maps memory into it); ``compiler`` owns
NVRTC, a separate library, and runs it in a confined child (``compile`` here
only hands the source over).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

from hvgpu.errors import CudaError
from hvgpu.host.executor.cuda_device.driver import (IMPORT_ERROR, MAX_PARAMS, cu,
                                                    device_memory, driver_library, fail, ok,
                                                    result_code)
from hvgpu.host.executor.cuda_device.arrays import ArrayCalls
from hvgpu.host.executor.cuda_device.graphs import GraphCalls
from hvgpu.host.executor.cuda_device.memory import MappedWindow, MemoryCalls, driver_footprint
from hvgpu.host.executor.cuda_device.modules import ModuleCalls
from hvgpu.host.executor.cuda_device.streams import StreamCalls
from hvgpu.host.executor.device import STREAM_LEGACY, STREAM_PER_THREAD
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

_MPS_SERVER_NOT_READY = P.CUDA_ERROR_MPS_SERVER_NOT_READY
_MPS_NOT_READY_WAIT = 30.0

__all__ = ["CudaDevice", "driver_footprint"]


def _raw(name: str, *args) -> None:
    err = getattr(driver_library(), name)(*args)
    if err:
        fail(err, name)


class CudaDevice(MemoryCalls, ModuleCalls, StreamCalls, GraphCalls, ArrayCalls):
    """One GPU, one context, in this executor process."""

    caps = P.CAP_NVRTC | P.CAP_PARAM_INFO

    def __init__(self, ordinal: int = 0, address_window: int = 0):
        if cu is None:
            raise CudaError(P.HV_NO_GPU, "cuda-python (cuda-bindings) is not installed on "
                            f"the host ({IMPORT_ERROR}); install hvgpu[host]")
        # After a kernel fault, MPS takes no new client until the faulted one has
        # exited (seen on the H200: 807 meanwhile); that executor is on its way out.
        deadline = time.monotonic() + _MPS_NOT_READY_WAIT
        while True:
            try:
                err, = cu.cuInit(0)
            except RuntimeError as exc:  # libcuda.so.1 could not be loaded
                raise CudaError(P.HV_NO_GPU, f"no NVIDIA driver on the host: {exc}") from None
            if result_code(err) != _MPS_SERVER_NOT_READY or time.monotonic() > deadline:
                break
            log.info("MPS server not ready for a new client yet (a faulted one is ending); "
                     "trying again")
            time.sleep(0.25)
        if result_code(err) != 0:
            fail(err, "cuInit: no usable NVIDIA driver/GPU on the host")
        self.ordinal = ordinal
        self.dev = ok(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.ctx = ok(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self._tls = threading.local()
        self.bind_thread()
        self._specials = {0: cu.CUstream(0), STREAM_LEGACY: cu.CUstream(STREAM_LEGACY),
                          STREAM_PER_THREAD: cu.CUstream(STREAM_PER_THREAD)}
        # Launches go to libcuda directly: cuda-bindings' argument conversion was the
        # largest part of a launch's cost in the executor (bench/data_lane.py).
        self._launch = driver_library().cuLaunchKernel
        major = self.attribute(75)
        minor = self.attribute(76)
        self.arch = f"sm_{major}{minor}"
        self._window = MappedWindow(ordinal, address_window) if address_window else None
        self._memory = device_memory(ordinal)
        self._granularity: dict[tuple[int, int], int] = {}  # (option, compression) -> bytes

    def bind_thread(self) -> None:
        """Make this context current on the calling thread, with its own launch buffer.

        The launch parameter buffer travels by CUDA's `extra` form, so a launch
        costs one copy and no per-parameter pointer array; each thread (one per
        guest connection) has its own, so launches never race.
        """
        ok(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        # Guest threads share this one: the driver's per-thread capture rules cannot tell
        # them apart, so none of their calls is refused for another's capture (graphs.py).
        ok(cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode(2)),
            "cuThreadExchangeStreamCaptureMode")
        tls = self._tls
        if not hasattr(tls, "extra_addr"):
            tls.params = ctypes.create_string_buffer(MAX_PARAMS)
            tls.view = memoryview(tls.params).cast("B")
            tls.size = ctypes.c_size_t(0)
            tls.extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(tls.params), 2,
                                              ctypes.addressof(tls.size), 0)
            tls.extra_addr = ctypes.addressof(tls.extra)

    # -- device --------------------------------------------------------------

    def driver_version(self) -> int:
        return ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")

    def attribute(self, attrib: int) -> int:
        try:
            which = cu.CUdevice_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown device attribute {attrib}") from None
        return ok(cu.cuDeviceGetAttribute(which, self.dev), "cuDeviceGetAttribute")

    def name(self) -> str:
        raw = ok(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    def uuid(self) -> bytes:
        return bytes(ok(cu.cuDeviceGetUuid(self.dev), "cuDeviceGetUuid").bytes)[:P.UUID_SIZE]

    def total_mem(self) -> int:
        return ok(cu.cuDeviceTotalMem(self.dev), "cuDeviceTotalMem")

    def mem_info(self) -> tuple[int, int]:
        free, total = ok(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def ctx_limit(self, limit: int) -> int:
        try:
            which = cu.CUlimit(limit)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown context limit {limit}") from None
        return int(ok(cu.cuCtxGetLimit(which), "cuCtxGetLimit"))

    def ctx_set_limit(self, limit: int, value: int) -> None:
        try:
            which = cu.CUlimit(limit)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown context limit {limit}") from None
        ok(cu.cuCtxSetLimit(which, value), "cuCtxSetLimit")

    def synchronize(self) -> None:
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # Through libcuda itself, every argument a C value (the bindings of an older
    # cuda-python may lack the newer calls).
    def ctx_record_event(self, event) -> None:
        _raw("cuCtxRecordEvent", ctypes.c_void_p(int(self.ctx)), ctypes.c_void_p(int(event)))

    def ctx_wait_event(self, event) -> None:
        _raw("cuCtxWaitEvent", ctypes.c_void_p(int(self.ctx)), ctypes.c_void_p(int(event)))

    def ctx_reset_persisting_l2(self) -> None:
        _raw("cuCtxResetPersistingL2Cache")

    def texture_1d_linear_max_width(self, fmt: int, channels: int) -> int:
        width = ctypes.c_size_t()
        _raw("cuDeviceGetTexture1DLinearMaxWidth", ctypes.byref(width), ctypes.c_int(fmt),
             ctypes.c_uint(channels), ctypes.c_int(int(self.dev)))
        return width.value

    def host_atomic_caps(self, operations: bytes) -> bytes:
        count = len(operations) // 4
        ops = ctypes.create_string_buffer(bytes(operations), max(len(operations), 4))
        caps = (ctypes.c_uint * max(count, 1))()
        _raw("cuDeviceGetHostAtomicCapabilities", caps, ops, ctypes.c_uint(count),
             ctypes.c_int(int(self.dev)))
        return bytes(caps)[:4 * count]

    def close(self) -> None:
        if self.ctx is not None:
            cu.cuDevicePrimaryCtxRelease(self.dev)
            self.ctx = None
