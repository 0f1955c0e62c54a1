"""Stream and event calls of ``CudaDevice``.

:class:`StreamCalls` is a part of ``CudaDevice`` and uses what its ``__init__``
sets: ``_specials``, the handles of CUDA's special streams.

Must not validate guest input beyond what the driver does: the session has.
"""

from __future__ import annotations

import ctypes
import struct

from hvgpu.errors import CudaError
from hvgpu.host.executor.cuda_device.driver import cu, driver_library, fail, ok, result_code
from hvgpu.virtio import protocol as P

# CUstreamBatchMemOpType of the single calls -> their names (_v2 appended for the v2 API)
_ONE_MEMOP = {1: "cuStreamWaitValue32", 2: "cuStreamWriteValue32", 4: "cuStreamWaitValue64",
              5: "cuStreamWriteValue64"}
_MEMOP_PARAMS = 48  # sizeof(CUstreamBatchMemOpParams)


class StreamCalls:
    """``GpuDevice``'s stream and event methods over the driver."""

    def stream(self, special: int):
        return self._specials[special]

    # -- streams and events ---------------------------------------------------

    def stream_create(self, flags: int, priority: int = 0):
        if priority:
            return ok(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority")
        return ok(cu.cuStreamCreate(flags), "cuStreamCreate")

    def stream_priority_range(self) -> tuple[int, int]:
        least, greatest = ok(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        return int(least), int(greatest)

    def stream_destroy(self, stream) -> None:
        ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")

    def stream_synchronize(self, stream) -> None:
        ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def stream_query(self, stream) -> bool:
        err, = cu.cuStreamQuery(stream)
        if result_code(err) == P.CUDA_ERROR_NOT_READY:
            return False
        if result_code(err) != 0:
            fail(err, "cuStreamQuery")
        return True

    def stream_wait_event(self, stream, event, flags) -> None:
        ok(cu.cuStreamWaitEvent(stream, event, flags), "cuStreamWaitEvent")

    # Through libcuda itself: the value is the guest's CUlaunchAttributeValue, passed as
    # the bytes it is (the session checked the attribute and what the value names).
    def stream_set_attribute(self, stream, attr: int, value: bytes) -> None:
        buf = ctypes.create_string_buffer(bytes(value), P.LAUNCH_ATTR_VALUE_SIZE)
        err = driver_library().cuStreamSetAttribute(ctypes.c_void_p(int(stream)),
                                                    ctypes.c_int(attr), buf)
        if err:
            fail(err, "cuStreamSetAttribute")

    def stream_get_attribute(self, stream, attr: int) -> bytes:
        buf = ctypes.create_string_buffer(P.LAUNCH_ATTR_VALUE_SIZE)
        err = driver_library().cuStreamGetAttribute(ctypes.c_void_p(int(stream)),
                                                    ctypes.c_int(attr), buf)
        if err:
            fail(err, "cuStreamGetAttribute")
        return buf.raw

    def stream_copy_attributes(self, dst, src) -> None:
        err = driver_library().cuStreamCopyAttributes(ctypes.c_void_p(int(dst)),
                                                      ctypes.c_void_p(int(src)))
        if err:
            fail(err, "cuStreamCopyAttributes")

    # Through libcuda itself: the v1 entry points are not in cuda.bindings, and a batch
    # is passed as the CUstreamBatchMemOpParams array it is.
    def stream_memops(self, stream, call: int, ops: list, flags: int) -> None:
        lib = driver_library()
        suffix = "_v2" if call in (P.MEMOP_BATCH, P.MEMOP_ONE) else ""
        handle = ctypes.c_void_p(int(stream))
        if call in (P.MEMOP_ONE, P.MEMOP_ONE_V1):
            operation, op_flags, address, value = ops[0]
            name = _ONE_MEMOP[operation] + suffix
            value_type = ctypes.c_uint32 if operation in (1, 2) else ctypes.c_uint64
            args = (handle, ctypes.c_uint64(address), value_type(value), ctypes.c_uint(op_flags))
        else:
            name = "cuStreamBatchMemOp" + suffix
            params = ctypes.create_string_buffer(_MEMOP_PARAMS * len(ops))
            for i, (operation, op_flags, address, value) in enumerate(ops):
                if operation in (1, 2, 4, 5):  # waitValue / writeValue
                    struct.pack_into("<I4xQQI4x", params, i * _MEMOP_PARAMS, operation, address,
                                     value, op_flags)
                else:  # flushRemoteWrites, memoryBarrier: the flags follow the operation
                    struct.pack_into("<II", params, i * _MEMOP_PARAMS, operation, op_flags)
            args = (handle, ctypes.c_uint(len(ops)), params, ctypes.c_uint(flags))
        try:
            fn = getattr(lib, name)
        except AttributeError:  # a driver without the v1 entry points
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, f"this driver has no {name}") from None
        err = fn(*args)
        if err:
            fail(err, name)

    def event_create(self, flags: int):
        return ok(cu.cuEventCreate(flags), "cuEventCreate")

    def event_destroy(self, event) -> None:
        ok(cu.cuEventDestroy(event), "cuEventDestroy")

    def event_record(self, event, stream) -> None:
        ok(cu.cuEventRecord(event, stream), "cuEventRecord")

    def event_query(self, event) -> bool:
        err, = cu.cuEventQuery(event)
        if result_code(err) == P.CUDA_ERROR_NOT_READY:
            return False
        if result_code(err) != 0:
            fail(err, "cuEventQuery")
        return True

    def event_synchronize(self, event) -> None:
        ok(cu.cuEventSynchronize(event), "cuEventSynchronize")

    def event_elapsed(self, start, end) -> float:
        fn = getattr(cu, "cuEventElapsedTime", None) or cu.cuEventElapsedTime_v2
        return float(ok(fn(start, end), "cuEventElapsedTime"))
