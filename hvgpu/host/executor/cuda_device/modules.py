"""Module, function and launch calls of ``CudaDevice``, and the entry points of the C loop.

Launches go to libcuda directly, their parameters in CUDA's ``extra`` form from
a buffer of the calling thread's (``CudaDevice.bind_thread``); NVRTC runs in a
confined child (``compiler``). :class:`ModuleCalls` is a part of ``CudaDevice``
and uses what its ``__init__`` sets: ``_tls``, ``_launch`` and ``arch``.

Must not validate guest input beyond what the driver does: the session has.
"""

from __future__ import annotations

import ctypes
import logging
import struct

from hvgpu.errors import CudaError
from hvgpu.host.executor import compiler
from hvgpu.host.executor.cuda_device.driver import (MAX_PARAMS, LaunchConfig, cu,
                                                    driver_library, fail, ok, result_code)
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

_C_LOOP_SYMBOLS = {
    "cuLaunchKernel": "cuLaunchKernel", "cuLaunchKernelEx": "cuLaunchKernelEx",
    "cuEventRecord": "cuEventRecord", "cuStreamWaitEvent": "cuStreamWaitEvent",
    "cuEventSynchronize": "cuEventSynchronize", "cuMemsetD8Async": "cuMemsetD8Async",
    "cuMemsetD16Async": "cuMemsetD16Async", "cuMemsetD32Async": "cuMemsetD32Async",
    "cuMemcpyDtoDAsync": "cuMemcpyDtoDAsync_v2", "cuMemcpyHtoDAsync": "cuMemcpyHtoDAsync_v2"}


class ModuleCalls:
    """``GpuDevice``'s module, function and launch methods over the driver."""

    # -- modules and launches --------------------------------------------------

    def module_load(self, image: bytes):
        if not (image.startswith(b"\x7fELF") or image[:4] == b"\x50\xed\x55\xba"):
            if not image.endswith(b"\0"):  # PTX text must be NUL-terminated
                image += b"\0"
        return ok(cu.cuModuleLoadData(image), "cuModuleLoadData")

    def module_unload(self, module) -> None:
        ok(cu.cuModuleUnload(module), "cuModuleUnload")

    def module_function(self, module, name: str):
        return ok(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name!r})")

    def module_function_names(self, module) -> list[str]:
        count = int(ok(cu.cuModuleGetFunctionCount(module), "cuModuleGetFunctionCount"))
        functions = ok(cu.cuModuleEnumerateFunctions(count, module), "cuModuleEnumerateFunctions")
        return [ok(cu.cuFuncGetName(f), "cuFuncGetName").decode() for f in functions]

    def module_global(self, module, name: str) -> tuple[int, int]:
        dptr, size = ok(cu.cuModuleGetGlobal(module, name.encode()),
                         f"cuModuleGetGlobal({name!r})")
        return int(dptr), int(size)

    def func_attribute(self, function, attrib: int) -> int:
        try:
            which = cu.CUfunction_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}") from None
        return int(ok(cu.cuFuncGetAttribute(which, function), "cuFuncGetAttribute"))

    def func_set_attribute(self, function, attrib: int, value: int) -> None:
        try:
            which = cu.CUfunction_attribute(attrib)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown function attribute {attrib}") from None
        ok(cu.cuFuncSetAttribute(function, which, value), "cuFuncSetAttribute")

    def func_set_cache_config(self, function, config: int) -> None:
        try:
            which = cu.CUfunc_cache(config)
        except ValueError:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"unknown cache configuration {config}") from None
        ok(cu.cuFuncSetCacheConfig(function, which), "cuFuncSetCacheConfig")

    def occupancy_max_blocks(self, function, block_size: int, shared_mem: int, flags: int) -> int:
        return int(ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            function, block_size, shared_mem, flags), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def param_layout(self, function) -> list[tuple[int, int]]:
        layout = []
        for index in range(MAX_PARAMS // 4):
            err, offset, size = cu.cuFuncGetParamInfo(function, index)
            if result_code(err) == P.CUDA_ERROR_INVALID_VALUE:
                break  # past the last parameter
            if result_code(err) != 0:
                fail(err, "cuFuncGetParamInfo")
            layout.append((int(offset), int(size)))
        return layout

    def _extra(self, params):
        """CUDA's `extra` array for this thread's launch buffer, holding ``params``
        (None when the kernel takes none)."""
        n = len(params)
        if not n:
            return None
        if n > MAX_PARAMS:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{n} bytes of kernel parameters")
        tls = self._tls
        tls.view[:n] = params
        tls.size.value = n
        return tls.extra_addr

    def launch(self, function, grid, block, shared_mem, stream, params) -> None:
        err = self._launch(int(function), grid[0], grid[1], grid[2], block[0], block[1],
                           block[2], shared_mem, int(stream), None, self._extra(params))
        if err:
            fail(err, "cuLaunchKernel")

    def driver_entries(self) -> dict[str, int]:
        """libcuda's entry points for the session's C loop (launch_burst), by the names
        in launch_burst.ENTRIES: the symbols cuda.h maps those names to, with the
        legacy default stream, as cuda-bindings and the calls above use."""
        lib = driver_library()
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
        cfg = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                            int(stream), ctypes.addressof(raw), len(attrs) // P.LAUNCH_ATTR_SIZE)
        err = driver_library().cuLaunchKernelEx(ctypes.byref(cfg), int(function), None, extra)
        if err:
            fail(err, "cuLaunchKernelEx")

    def occupancy_clusters(self, which, function, grid, block, shared_mem, attrs) -> int:
        raw = ctypes.create_string_buffer(bytes(attrs), max(len(attrs), 1))
        cfg = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                            None, ctypes.addressof(raw), len(attrs) // P.LAUNCH_ATTR_SIZE)
        name = ("cuOccupancyMaxActiveClusters", "cuOccupancyMaxPotentialClusterSize")[which]
        value = ctypes.c_int()
        err = getattr(driver_library(), name)(ctypes.byref(value), int(function),
                                               ctypes.byref(cfg))
        if err:
            fail(err, name)
        return value.value

    def occupancy_available_smem(self, function, blocks: int, block_size: int) -> int:
        return int(ok(cu.cuOccupancyAvailableDynamicSMemPerBlock(function, blocks, block_size),
                       "cuOccupancyAvailableDynamicSMemPerBlock"))

    def tensor_map_encode_tiled(self, dtype, rank, address, dims, strides, box, element_strides,
                                interleave, swizzle, l2, oob) -> bytes:
        buf = ctypes.create_string_buffer(P.TENSOR_MAP_SIZE + 64)  # CUtensorMap is 64-byte aligned
        at = (ctypes.addressof(buf) + 63) & ~63
        err = driver_library().cuTensorMapEncodeTiled(
            at, dtype, rank, address, bytes(dims), bytes(strides) or None, bytes(box),
            bytes(element_strides), interleave, swizzle, l2, oob)
        if err:
            fail(err, "cuTensorMapEncodeTiled")
        return ctypes.string_at(at, P.TENSOR_MAP_SIZE)

    def tensor_map_encode_im2col(self, dtype, rank, address, dims, strides, lower, upper,
                                 channels, pixels, element_strides, interleave, swizzle, l2,
                                 oob, wide, mode) -> bytes:
        buf = ctypes.create_string_buffer(P.TENSOR_MAP_SIZE + 64)  # 64-byte aligned
        at = (ctypes.addressof(buf) + 63) & ~63
        u32, i32, ptr = ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
        head = (ptr(at), i32(dtype), u32(rank), ptr(address), bytes(dims), bytes(strides))
        tail = (u32(channels), u32(pixels), bytes(element_strides), i32(interleave))
        if wide:
            lo, hi = struct.unpack("<ii", bytes(lower) + bytes(upper))
            err = driver_library().cuTensorMapEncodeIm2colWide(
                *head, i32(lo), i32(hi), *tail, i32(mode), i32(swizzle), i32(l2), i32(oob))
            what = "cuTensorMapEncodeIm2colWide"
        else:
            err = driver_library().cuTensorMapEncodeIm2col(
                *head, bytes(lower), bytes(upper), *tail, i32(swizzle), i32(l2), i32(oob))
            what = "cuTensorMapEncodeIm2col"
        if err:
            fail(err, what)
        return ctypes.string_at(at, P.TENSOR_MAP_SIZE)

    def tensor_map_replace_address(self, tensor_map: bytes, address: int) -> bytes:
        buf = ctypes.create_string_buffer(P.TENSOR_MAP_SIZE + 64)
        at = (ctypes.addressof(buf) + 63) & ~63
        ctypes.memmove(at, bytes(tensor_map), P.TENSOR_MAP_SIZE)
        err = driver_library().cuTensorMapReplaceAddress(ctypes.c_void_p(at),
                                                         ctypes.c_void_p(address))
        if err:
            fail(err, "cuTensorMapReplaceAddress")
        return ctypes.string_at(at, P.TENSOR_MAP_SIZE)

    def link(self, options: list, inputs: list, log_size: int) -> tuple:
        """The driver's JIT linker in this context, with log buffers of the executor's own
        (the guest's are filled by the shim from the reply)."""
        lib = driver_library()
        info = ctypes.create_string_buffer(log_size)
        error = ctypes.create_string_buffer(log_size)
        opts = [2, 3, 4, 5, 6] + [o for o, _ in options]
        vals = [0, ctypes.addressof(info), log_size, ctypes.addressof(error), log_size] + [
            v for _, v in options]
        n = len(opts)
        c_opts = (ctypes.c_int * n)(*opts)
        c_vals = (ctypes.c_void_p * n)(*vals)
        state = ctypes.c_void_p()
        status = lib.cuLinkCreate_v2(ctypes.c_uint(n), c_opts, c_vals, ctypes.byref(state))
        if status:
            return status, b"", "", "", 0.0
        try:
            for kind, name, data in inputs:
                buf = ctypes.create_string_buffer(bytes(data), len(data))
                status = lib.cuLinkAddData_v2(state, ctypes.c_int(kind), buf,
                                              ctypes.c_size_t(len(data)),
                                              name.encode(errors="replace"), ctypes.c_uint(0),
                                              None, None)
                if status:
                    break
            image = b""
            if not status:
                out, size = ctypes.c_void_p(), ctypes.c_size_t()
                status = lib.cuLinkComplete(state, ctypes.byref(out), ctypes.byref(size))
                if not status:
                    image = ctypes.string_at(out, size.value)
            wall = ctypes.cast(c_vals, ctypes.POINTER(ctypes.c_float))[0]  # slot 0's float
            return (status, image, info.value.decode(errors="replace"),
                    error.value.decode(errors="replace"), float(wall))
        finally:
            lib.cuLinkDestroy(state)

    def compiler_id(self) -> str:
        return f"nvrtc-{compiler.nvrtc_version() or 'none'}-{self.arch}"

    def compile(self, source: bytes, name: str, options: list[str],
                headers: dict[str, bytes]) -> tuple[bytes, str]:
        # In a confined child process, never in this one (compiler's docstring says why).
        return compiler.compile_confined(source, name, options, headers, self.arch)
