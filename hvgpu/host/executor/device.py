"""The interface between a session and the GPU it drives.

``cuda_device.CudaDevice`` implements it over the CUDA driver API; the test
double in ``tests/`` implements it over host memory. Handles (modules,
functions, streams, events) are whatever objects the implementation returns;
the session never looks inside them. Every method raises
``hvgpu.errors.CudaError`` with CUDA's status number on failure.

This module only describes; it must not import CUDA or do work.
"""

from __future__ import annotations

from typing import Any, Protocol

# Special stream handles the guest may use, as in CUDA's headers.
STREAM_DEFAULT = 0
STREAM_LEGACY = 1
STREAM_PER_THREAD = 2


class GpuDevice(Protocol):
    caps: int  # hvgpu.virtio.protocol CAP_* bits this device supports

    def bind_thread(self) -> None:
        """Called by each thread that serves a guest, before its first use."""
    def driver_version(self) -> int: ...
    def attribute(self, attrib: int) -> int: ...
    def name(self) -> str: ...
    def uuid(self) -> bytes: ...
    def total_mem(self) -> int: ...
    def mem_info(self) -> tuple[int, int]: ...
    def ctx_limit(self, limit: int) -> int:
        """cuCtxGetLimit; ``limit`` is CUlimit's number."""
    def footprint(self, size: int) -> int:
        """The device memory an allocation of ``size`` bytes takes (the driver's
        granularity): what the slice's quota is charged."""
    def mem_alloc(self, size: int) -> int: ...
    def mem_free(self, dptr: int) -> None: ...
    # Virtual memory management: device-located, non-exportable memory of this device only
    # (the session has refused everything else).
    def mem_granularity(self, option: int, compression: int = 0) -> int:
        """cuMemGetAllocationGranularity (0: minimum, 1: recommended) of memory made
        with ``compression`` (CUmemAllocationCompType)."""
    def address_reserve(self, size: int, alignment: int, hint: int) -> int: ...
    def address_free(self, ptr: int, size: int) -> None: ...
    def mem_create(self, size: int, compression: int = 0) -> Any:
        """cuMemCreate; ``size`` is a multiple of the granularity (of ``compression``)."""
    def mem_compression(self, handle: Any) -> int:
        """The compression type the driver made ``handle`` with
        (cuMemGetAllocationPropertiesFromHandle): it may refuse to compress."""
    def mem_release(self, handle: Any) -> None: ...
    def mem_map(self, ptr: int, size: int, offset: int, handle: Any) -> None: ...
    def mem_unmap(self, ptr: int, size: int) -> None: ...
    def mem_set_access(self, ptr: int, size: int, flags: int) -> None:
        """cuMemSetAccess for this device (flags: CUmemAccess_flags)."""
    def mem_get_access(self, ptr: int) -> int: ...
    # Stream-ordered allocation.
    def pool_create(self, max_size: int) -> Any:
        """A pool of this device's memory (max_size 0: the driver's default)."""
    def pool_destroy(self, pool: Any) -> None: ...
    def pool_alloc(self, size: int, pool: Any, stream: Any) -> int: ...
    def pool_free(self, ptr: int, stream: Any) -> None: ...
    def pool_attribute(self, pool: Any, attrib: int) -> int:
        """cuMemPoolGetAttribute; attrib is CUmemPool_attribute's number (1..8)."""
    def pool_set_attribute(self, pool: Any, attrib: int, value: int) -> None: ...
    def pool_trim(self, pool: Any, keep: int) -> None: ...
    def host_alloc(self, size: int) -> tuple[int, memoryview]:
        """Page-locked host memory: (address, writable view)."""
    def host_free(self, addr: int) -> None: ...

    def host_register(self, addr: int, size: int, flags: int = 1) -> None:
        """Page-lock memory the executor mapped (a region) for DMA; ``flags`` are
        CU_MEMHOSTREGISTER_* (PORTABLE; DEVICEMAP for a mapping at the guest's address)."""

    def host_device_pointer(self, addr: int) -> int:
        """cuMemHostGetDevicePointer of device-mapped registered memory."""

    def host_unregister(self, addr: int) -> None: ...
    def stream(self, special: int) -> Any:
        """The handle of STREAM_DEFAULT, STREAM_LEGACY or STREAM_PER_THREAD."""
    def memcpy_htod_async(self, dst: int, src_addr: int, n: int, stream: Any) -> None: ...
    def memcpy_dtoh_async(self, dst_addr: int, src: int, n: int, stream: Any) -> None: ...
    def memcpy_dtod_async(self, dst: int, src: int, n: int, stream: Any) -> None: ...
    def memset_async(self, dst: int, value: int, width: int, count: int, stream: Any) -> None: ...
    def module_load(self, image: bytes) -> Any: ...
    def module_unload(self, module: Any) -> None: ...
    def link(self, options: list, inputs: list, log_size: int) -> tuple:
        """The JIT linker (cuLinkCreate .. cuLinkComplete): options (option, value) pairs,
        inputs (CUjitInputType, name, bytes); (status, image, info log, error log, wall
        time in ms), a failed link's status not raised, so its logs reach the guest."""
    def module_function(self, module: Any, name: str) -> Any: ...
    def module_function_names(self, module: Any) -> list[str]:
        """The names of the module's functions, in the driver's order."""
    def module_global(self, module: Any, name: str) -> tuple[int, int]:
        """A module variable's (device address, size)."""
    def param_layout(self, function: Any) -> list[tuple[int, int]]: ...
    def func_attribute(self, function: Any, attrib: int) -> int: ...
    def func_set_attribute(self, function: Any, attrib: int, value: int) -> None: ...
    def func_set_cache_config(self, function: Any, config: int) -> None:
        """cuFuncSetCacheConfig; ``config`` is CUfunc_cache's number."""
    def occupancy_max_blocks(self, function: Any, block_size: int, shared_mem: int,
                             flags: int) -> int: ...
    def launch(self, function: Any, grid: tuple, block: tuple, shared_mem: int,
               stream: Any, params: memoryview) -> None:
        """``params`` is a view of the packed parameter buffer, valid during the call."""
    def driver_entries(self) -> dict[str, int]:
        """Addresses of C functions with the signatures of the driver calls named in
        ``launch_burst.ENTRIES`` (cuLaunchKernel, cuMemsetD8Async, ...) that act on
        this device for the calling thread, for the session's C loop of one-way
        frames; an op whose entry is missing (all of them: an empty dict) goes
        through the methods here only."""
    def handle_value(self, handle: Any) -> int:
        """The C value (CUfunction, CUstream, CUevent) that :meth:`driver_entries`'
        functions take for a function, stream or event handle of this device."""
    def launch_ex(self, function: Any, grid: tuple, block: tuple, shared_mem: int, stream: Any,
                  params: bytes, attrs: bytes) -> None:
        """cuLaunchKernelEx; ``attrs`` is a raw CUlaunchAttribute array."""
    def occupancy_available_smem(self, function: Any, blocks: int, block_size: int) -> int: ...
    def occupancy_clusters(self, which: int, function: Any, grid: tuple, block: tuple,
                           shared_mem: int, attrs: bytes) -> int:
        """0: cuOccupancyMaxActiveClusters, 1: cuOccupancyMaxPotentialClusterSize."""
    def tensor_map_encode_tiled(self, dtype: int, rank: int, address: int, dims: bytes,
                                strides: bytes, box: bytes, element_strides: bytes,
                                interleave: int, swizzle: int, l2: int, oob: int) -> bytes:
        """The 128-byte CUtensorMap cuTensorMapEncodeTiled writes."""
    def tensor_map_encode_im2col(self, dtype: int, rank: int, address: int, dims: bytes,
                                 strides: bytes, lower: bytes, upper: bytes, channels: int,
                                 pixels: int, element_strides: bytes, interleave: int,
                                 swizzle: int, l2: int, oob: int, wide: int,
                                 mode: int) -> bytes:
        """cuTensorMapEncodeIm2col (wide 0) or cuTensorMapEncodeIm2colWide (wide 1: lower
        and upper one i32 each, mode its CUtensorMapIm2ColWideMode): the 128 bytes."""
    def tensor_map_replace_address(self, tensor_map: bytes, address: int) -> bytes:
        """cuTensorMapReplaceAddress of a copy of ``tensor_map``: the 128 bytes."""
    def ctx_record_event(self, event: Any) -> None:
        """cuCtxRecordEvent of the device's context."""
    def ctx_wait_event(self, event: Any) -> None:
        """cuCtxWaitEvent of the device's context."""
    def ctx_reset_persisting_l2(self) -> None: ...
    def texture_1d_linear_max_width(self, fmt: int, channels: int) -> int:
        """cuDeviceGetTexture1DLinearMaxWidth (``fmt``: CUarray_format)."""
    def host_atomic_caps(self, operations: bytes) -> bytes:
        """cuDeviceGetHostAtomicCapabilities: a u32 of capability bits per u32 operation."""
    def array_memory_requirements(self, array: Any, mipmapped: int) -> tuple[int, int]:
        """(size, alignment) of cuArrayGetMemoryRequirements, or of
        cuMipmappedArrayGetMemoryRequirements where ``mipmapped``."""
    def compiler_id(self) -> str:
        """Identifies compiler and target, for the compile cache's key."""
    def compile(self, source: bytes, name: str, options: list[str],
                headers: dict[str, bytes]) -> tuple[bytes, str]:
        """CUDA C++ to a loadable image: (image, log); CompileError on failure. The
        session has already checked options, names and includes (nvrtc_policy)."""
    def stream_create(self, flags: int, priority: int = 0) -> Any: ...
    def stream_priority_range(self) -> tuple[int, int]:
        """(least, greatest) stream priority."""
    def stream_destroy(self, stream: Any) -> None: ...
    def stream_synchronize(self, stream: Any) -> None: ...
    def stream_query(self, stream: Any) -> bool: ...
    def stream_wait_event(self, stream: Any, event: Any, flags: int) -> None: ...
    def stream_set_attribute(self, stream: Any, attr: int, value: bytes) -> None:
        """cuStreamSetAttribute; value is CUlaunchAttributeValue as cuda.h lays it out."""
    def stream_get_attribute(self, stream: Any, attr: int) -> bytes: ...
    def stream_copy_attributes(self, dst: Any, src: Any) -> None: ...
    def stream_memops(self, stream: Any, call: int, ops: list, flags: int) -> None:
        """Stream memory operations: ``ops`` are (CUstreamBatchMemOpType, flags, address,
        value); ``call`` (protocol.MEMOP_*) says which entry point: cuStreamBatchMemOp
        (``flags`` its own) or the one cuStreamWaitValue/WriteValue of ops[0], _v2 or v1."""
    def event_create(self, flags: int) -> Any: ...
    def event_destroy(self, event: Any) -> None: ...
    def event_record(self, event: Any, stream: Any) -> None: ...
    def event_query(self, event: Any) -> bool: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_elapsed(self, start: Any, end: Any) -> float: ...
    # Stream capture and graphs (executor/graphs.py keeps the books).
    def stream_begin_capture(self, stream: Any, mode: int) -> None:
        """cuStreamBeginCapture; mode is CUstreamCaptureMode's number."""
    def stream_end_capture(self, stream: Any) -> Any:
        """cuStreamEndCapture: the graph."""
    def stream_capture_info(self, stream: Any) -> tuple[int, int, Any, list]:
        """cuStreamGetCaptureInfo: (status, id, graph, dependency nodes)."""
    def graph_nodes(self, graph: Any) -> list: ...
    def graph_node_count(self, graph: Any) -> int:
        """How many nodes the graph has (cuGraphGetNodes with no array)."""
    # Nodes added by hand; deps are node objects of the same graph (graphs.py checked).
    def graph_create(self) -> Any: ...
    def graph_add_kernel(self, graph: Any, deps: list, function: Any, grid: tuple,
                         block: tuple, shared_mem: int, params: bytes) -> Any: ...
    def graph_add_memset(self, graph: Any, deps: list, dst: int, pitch: int, value: int,
                         element_size: int, width: int, height: int) -> Any: ...
    def graph_add_memcpy(self, graph: Any, deps: list, kind: int, dst: int, src: int,
                         size: int) -> Any:
        """kind 0: device to device; 1: host (a region the executor registered) to
        device; 2: device to host."""
    def graph_add_empty(self, graph: Any, deps: list) -> Any: ...
    def graph_add_event(self, graph: Any, deps: list, wait: int, event: Any) -> Any: ...
    def graph_add_dependencies(self, graph: Any, sources: list, targets: list) -> None: ...
    def graph_exec_kernel_set(self, exec_: Any, node: Any, function: Any, grid: tuple,
                              block: tuple, shared_mem: int, params: bytes) -> None: ...
    def graph_exec_update(self, exec_: Any, graph: Any) -> tuple[int, Any]:
        """cuGraphExecUpdate: (CUgraphExecUpdateResult, the node that failed or None)."""
    def graph_instantiate(self, graph: Any, flags: int) -> Any: ...
    def graph_launch(self, exec_: Any, stream: Any) -> None: ...
    def graph_upload(self, exec_: Any, stream: Any) -> None: ...
    def graph_destroy(self, graph: Any) -> None: ...
    def graph_exec_destroy(self, exec_: Any) -> None: ...
    def graph_conditional_handle_create(self, graph: Any, default: int, flags: int) -> int:
        """cuGraphConditionalHandleCreate: the handle's value."""
    def graph_add_conditional(self, graph: Any, deps: list, handle: int, kind: int,
                              size: int) -> tuple[Any, list]:
        """cuGraphAddNode of a conditional node: (the node, its body graphs)."""
    def graph_clone(self, graph: Any) -> Any:
        """cuGraphClone: a new graph, a copy of graph."""
    def graph_node_find_in_clone(self, node: Any, clone: Any) -> Any:
        """cuGraphNodeFindInClone: clone's copy of node (a node of the graph cloned)."""
    # Graph memory (graph_memory.py keeps the books).
    def graph_add_mem_alloc(self, graph: Any, deps: list, size: int) -> tuple[Any, int]:
        """cuGraphAddMemAllocNode of device memory of this device, read-write for it:
        (the node, the allocation's address)."""
    def graph_add_mem_free(self, graph: Any, deps: list, dptr: int) -> Any: ...
    def graph_node_type(self, node: Any) -> int:
        """cuGraphNodeGetType: CUgraphNodeType's number."""
    def graph_mem_alloc_params(self, node: Any) -> tuple[int, int]:
        """cuGraphMemAllocNodeGetParams: (address, bytes)."""
    def graph_mem_free_params(self, node: Any) -> int:
        """cuGraphMemFreeNodeGetParams: the address."""
    def graph_mem_trim(self) -> None:
        """cuDeviceGraphMemTrim."""
    def graph_mem_attribute(self, attr: int) -> int:
        """cuDeviceGetGraphMemAttribute; attr is CUgraphMem_attribute's number."""
    def graph_mem_set_attribute(self, attr: int, value: int) -> None:
        """cuDeviceSetGraphMemAttribute (a high-water mark, to 0)."""
    # CUDA arrays, texture and surface objects, 3D copies (ops/arrays.py checked every
    # handle, extent and range). A descriptor is (width, height, depth, format, channels,
    # flags) as CUDA_ARRAY3D_DESCRIPTOR has them.
    def array_create(self, width: int, height: int, depth: int, fmt: int, channels: int,
                     flags: int) -> Any: ...
    def array_destroy(self, array: Any) -> None: ...
    def array_descriptor(self, array: Any) -> tuple[int, int, int, int, int, int]: ...
    def mipmap_create(self, width: int, height: int, depth: int, fmt: int, channels: int,
                      flags: int, levels: int) -> Any: ...
    def mipmap_destroy(self, mipmap: Any) -> None: ...
    def mipmap_level(self, mipmap: Any, level: int) -> Any:
        """cuMipmappedArrayGetLevel: an array that goes with its mipmapped array."""
    def tex_create(self, res_type: int, resource: Any, fmt: int, channels: int, width: int,
                   height: int, pitch: int, res_flags: int, tex_desc: bytes,
                   view_desc: bytes) -> int:
        """cuTexObjectCreate: the CUtexObject value. resource is an array or mipmapped
        array (res_type 0, 1) or a device address (2 linear, 3 pitch2D); tex_desc and
        view_desc (may be empty) are cuda.h's structures as bytes."""
    def tex_destroy(self, value: int) -> None: ...
    def surf_create(self, array: Any) -> int: ...
    def surf_destroy(self, value: int) -> None: ...
    def memcpy_3d(self, src: tuple, dst: tuple, width: int, height: int, depth: int,
                  stream: Any) -> None:
        """cuMemcpy3DAsync. A side is (kind, where, x, y, z, pitch, height): kind 1 host
        memory of this process (where: its address; the call returns once the bytes are
        taken, or, to host memory, once they are there), 2 device memory (where: its
        address), 3 an array (where: the array)."""
    def synchronize(self) -> None: ...
    def close(self) -> None: ...
