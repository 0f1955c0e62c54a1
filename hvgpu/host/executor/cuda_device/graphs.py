"""Stream capture and graph calls of ``CudaDevice``.

Nodes are added through libcuda directly, their parameters as the C structures
of ``driver``. :class:`GraphCalls` is a part of ``CudaDevice`` and uses what its
``__init__`` sets: ``ctx``, the context memset and memcpy nodes name.

Must not validate guest input beyond what the driver does: the session has.
"""

from __future__ import annotations

import ctypes
import struct

from hvgpu.host.executor.cuda_device.driver import (DEVICE, HOST, KernelNodeParams,
                                                    Memcpy3D, MemsetNodeParams,
                                                    UpdateResultInfo, cu, driver_library,
                                                    fail, ok, result_code)


GRAPH_NODE_TYPE_CONDITIONAL = 13  # CUgraphNodeType


class MemAllocNodeParams(ctypes.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS (v1 and v2)
    _fields_ = [("alloc_type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("max_size", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54),
                ("access_descs", ctypes.c_void_p), ("access_count", ctypes.c_size_t),
                ("bytesize", ctypes.c_size_t), ("dptr", ctypes.c_uint64)]


assert ctypes.sizeof(MemAllocNodeParams) == 88 + 32


class GraphCalls:
    """``GpuDevice``'s capture and graph methods over the driver."""

    # -- stream capture and graphs ---------------------------------------------------

    def stream_begin_capture(self, stream, mode: int) -> None:
        ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode(mode)),
            "cuStreamBeginCapture")

    def stream_end_capture(self, stream):
        return ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")

    def stream_capture_info(self, stream) -> tuple[int, int, object, list]:
        # cuda-bindings 12 answers (err, status, id, graph, deps, n); 13 adds edge data
        # before n. Only the first four outputs are read.
        result = cu.cuStreamGetCaptureInfo(stream)
        if result_code(result[0]) != 0:
            fail(result[0], "cuStreamGetCaptureInfo")
        status, cid, graph, deps = result[1], result[2], result[3], result[4]
        n = int(result[-1])
        return int(status), int(cid), graph, list(deps or [])[:n]

    def graph_node_count(self, graph) -> int:
        return int(ok(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])

    def graph_nodes(self, graph) -> list:
        _, count = ok(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
        if not count:
            return []
        nodes, count = ok(cu.cuGraphGetNodes(graph, int(count)), "cuGraphGetNodes")
        return list(nodes)[:int(count)]

    def _nodes(self, nodes: list):
        return (ctypes.c_void_p * max(len(nodes), 1))(*[int(n) for n in nodes])

    def _add(self, what: str, fn, graph, deps: list, *rest) -> int:
        node = ctypes.c_void_p()
        err = fn(ctypes.byref(node), ctypes.c_void_p(int(graph)), self._nodes(deps),
                 ctypes.c_size_t(len(deps)), *rest)
        if err:
            fail(err, what)
        return node.value or 0

    def _kernel_params(self, function, grid, block, shared_mem, params: bytes):
        buf = ctypes.create_string_buffer(bytes(params), max(len(params), 1))
        size = ctypes.c_size_t(len(params))
        extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
        p = KernelNodeParams(int(function), (ctypes.c_uint * 3)(*grid),
                              (ctypes.c_uint * 3)(*block), shared_mem, None,
                              ctypes.addressof(extra), None, None)
        return p, (buf, size, extra)  # the driver copies them; kept alive over the call

    def graph_create(self):
        graph = ctypes.c_void_p()
        err = driver_library().cuGraphCreate(ctypes.byref(graph), 0)
        if err:
            fail(err, "cuGraphCreate")
        return cu.CUgraph(graph.value)

    def graph_add_kernel(self, graph, deps, function, grid, block, shared_mem, params):
        p, keep = self._kernel_params(function, grid, block, shared_mem, params)
        return cu.CUgraphNode(self._add("cuGraphAddKernelNode", driver_library().cuGraphAddKernelNode_v2,
                                        graph, deps, ctypes.byref(p)))

    def graph_add_memset(self, graph, deps, dst, pitch, value, element_size, width, height):
        p = MemsetNodeParams(dst, pitch if height > 1 else width * element_size, value,
                              element_size, width, height)
        return cu.CUgraphNode(self._add("cuGraphAddMemsetNode", driver_library().cuGraphAddMemsetNode,
                                        graph, deps, ctypes.byref(p),
                                        ctypes.c_void_p(int(self.ctx))))

    def graph_add_memcpy(self, graph, deps, kind, dst, src, size):
        p = Memcpy3D()
        p.src_memory_type = HOST if kind == 1 else DEVICE
        p.dst_memory_type = HOST if kind == 2 else DEVICE
        if kind == 1:
            p.src_host = src
        else:
            p.src_device = src
        if kind == 2:
            p.dst_host = dst
        else:
            p.dst_device = dst
        p.width_bytes, p.height, p.depth = size, 1, 1
        return cu.CUgraphNode(self._add("cuGraphAddMemcpyNode", driver_library().cuGraphAddMemcpyNode,
                                        graph, deps, ctypes.byref(p),
                                        ctypes.c_void_p(int(self.ctx))))

    def graph_add_empty(self, graph, deps):
        return cu.CUgraphNode(self._add("cuGraphAddEmptyNode", driver_library().cuGraphAddEmptyNode,
                                        graph, deps))

    def graph_add_event(self, graph, deps, wait, event):
        lib = driver_library()
        fn, what = ((lib.cuGraphAddEventWaitNode, "cuGraphAddEventWaitNode") if wait else
                    (lib.cuGraphAddEventRecordNode, "cuGraphAddEventRecordNode"))
        return cu.CUgraphNode(self._add(what, fn, graph, deps, ctypes.c_void_p(int(event))))

    def graph_add_dependencies(self, graph, sources, targets) -> None:
        err = driver_library().cuGraphAddDependencies_v2(
            ctypes.c_void_p(int(graph)), self._nodes(sources), self._nodes(targets), None,
            ctypes.c_size_t(len(sources)))
        if err:
            fail(err, "cuGraphAddDependencies")

    def graph_exec_kernel_set(self, exec_, node, function, grid, block, shared_mem, params):
        p, keep = self._kernel_params(function, grid, block, shared_mem, params)
        err = driver_library().cuGraphExecKernelNodeSetParams_v2(
            ctypes.c_void_p(int(exec_)), ctypes.c_void_p(int(node)), ctypes.byref(p))
        if err:
            fail(err, "cuGraphExecKernelNodeSetParams")

    def graph_exec_update(self, exec_, graph):
        info = UpdateResultInfo()
        err = driver_library().cuGraphExecUpdate_v2(ctypes.c_void_p(int(exec_)),
                                                     ctypes.c_void_p(int(graph)),
                                                     ctypes.byref(info))
        node = cu.CUgraphNode(info.error_node) if info.error_node else None
        if err and not info.result:
            fail(err, "cuGraphExecUpdate")
        return int(info.result), node

    def graph_instantiate(self, graph, flags: int):
        return ok(cu.cuGraphInstantiate(graph, flags), "cuGraphInstantiate")

    def graph_launch(self, exec_, stream) -> None:
        err = driver_library().cuGraphLaunch(ctypes.c_void_p(int(exec_)),
                                              ctypes.c_void_p(int(stream)))
        if err:
            fail(err, "cuGraphLaunch")

    def graph_upload(self, exec_, stream) -> None:
        ok(cu.cuGraphUpload(exec_, stream), "cuGraphUpload")

    def graph_destroy(self, graph) -> None:
        ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")

    def graph_exec_destroy(self, exec_) -> None:
        ok(cu.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")

    def graph_conditional_handle_create(self, graph, default: int, flags: int) -> int:
        handle = ctypes.c_uint64()
        err = driver_library().cuGraphConditionalHandleCreate(
            ctypes.byref(handle), ctypes.c_void_p(int(graph)), ctypes.c_void_p(int(self.ctx)),
            ctypes.c_uint(default), ctypes.c_uint(flags))
        if err:
            fail(err, "cuGraphConditionalHandleCreate")
        return handle.value

    def graph_add_conditional(self, graph, deps, handle: int, kind: int, size: int):
        # CUgraphNodeParams (cuda.h 13.0): type at 0, the union at 16 (for a conditional
        # node: handle, type, size, phGraph_out, ctx), 256 bytes in all
        params = ctypes.create_string_buffer(256)
        struct.pack_into("<i", params, 0, GRAPH_NODE_TYPE_CONDITIONAL)
        struct.pack_into("<QIIQQ", params, 16, handle, kind, size, 0, int(self.ctx))
        node = cu.CUgraphNode(self._add("cuGraphAddNode", driver_library().cuGraphAddNode,
                                        graph, deps, params))
        out = struct.unpack_from("<Q", params, 32)[0]
        bodies = (ctypes.c_void_p * size).from_address(out) if out else []
        return node, [cu.CUgraph(b or 0) for b in bodies]

    def graph_clone(self, graph):
        return ok(cu.cuGraphClone(graph), "cuGraphClone")

    def graph_node_find_in_clone(self, node, clone):
        return ok(cu.cuGraphNodeFindInClone(node, clone), "cuGraphNodeFindInClone")

    # -- graph memory ---------------------------------------------------------------

    def graph_add_mem_alloc(self, graph, deps, size: int):
        p = MemAllocNodeParams()
        p.alloc_type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        p.location_type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
        p.location_id = int(self.dev)
        p.bytesize = size
        node = self._add("cuGraphAddMemAllocNode", driver_library().cuGraphAddMemAllocNode,
                         graph, deps, ctypes.byref(p))
        return cu.CUgraphNode(node), int(p.dptr)

    def graph_add_mem_free(self, graph, deps, dptr: int):
        return cu.CUgraphNode(self._add("cuGraphAddMemFreeNode",
                                        driver_library().cuGraphAddMemFreeNode, graph, deps,
                                        ctypes.c_uint64(dptr)))

    def graph_node_type(self, node) -> int:
        kind = ctypes.c_int()
        err = driver_library().cuGraphNodeGetType(ctypes.c_void_p(int(node)), ctypes.byref(kind))
        if err:
            fail(err, "cuGraphNodeGetType")
        return kind.value

    def graph_mem_alloc_params(self, node) -> tuple[int, int]:
        p = MemAllocNodeParams()
        err = driver_library().cuGraphMemAllocNodeGetParams(ctypes.c_void_p(int(node)),
                                                             ctypes.byref(p))
        if err:
            fail(err, "cuGraphMemAllocNodeGetParams")
        return int(p.dptr), int(p.bytesize)

    def graph_mem_free_params(self, node) -> int:
        dptr = ctypes.c_uint64()
        err = driver_library().cuGraphMemFreeNodeGetParams(ctypes.c_void_p(int(node)),
                                                            ctypes.byref(dptr))
        if err:
            fail(err, "cuGraphMemFreeNodeGetParams")
        return dptr.value

    def graph_mem_trim(self) -> None:
        err = driver_library().cuDeviceGraphMemTrim(ctypes.c_int(int(self.dev)))
        if err:
            fail(err, "cuDeviceGraphMemTrim")

    def graph_mem_attribute(self, attr: int) -> int:
        value = ctypes.c_uint64()
        err = driver_library().cuDeviceGetGraphMemAttribute(ctypes.c_int(int(self.dev)), attr,
                                                             ctypes.byref(value))
        if err:
            fail(err, "cuDeviceGetGraphMemAttribute")
        return value.value

    def graph_mem_set_attribute(self, attr: int, value: int) -> None:
        raw = ctypes.c_uint64(value)
        err = driver_library().cuDeviceSetGraphMemAttribute(ctypes.c_int(int(self.dev)), attr,
                                                             ctypes.byref(raw))
        if err:
            fail(err, "cuDeviceSetGraphMemAttribute")
