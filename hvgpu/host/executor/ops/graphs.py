"""Stream capture and CUDA graphs: captures, graphs built node by node, instantiations.

``graphs.Graphs`` keeps the books (handles, what a graph may still reach, what is
parked until no graph is left); this module checks what each op names and
drives it. An instantiation is uploaded at once on a stream of the executor's
own and charged what that took of device memory (its own memory, which no
cuMemAlloc shows), measured as a module load is; one whose graph has memory nodes is
not uploaded (the driver would map its allocations then, not at the first launch) and
is charged what it allocates instead (graph_memory.py).

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.errors import CudaError
from hvgpu.host.executor.graph_memory import (RESERVED_CURRENT, RESERVED_HIGH, USED_CURRENT,
                                               USED_HIGH, node_params)
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, quietly
from hvgpu.host.executor.ops.table import MEASURED, RELEASES, Family, by_books
from hvgpu.host.executor.vmm import check_location
from hvgpu.virtio import protocol as P

GRAPH_MEM_ATTRIBUTES = (USED_CURRENT, USED_HIGH, RESERVED_CURRENT, RESERVED_HIGH)
FAMILY = Family("graphs")
declare = FAMILY.declare


def _stream(session, hdr, handle, *fields) -> tuple:
    return (handle, checks.stream(session, handle), *fields)


# -- capture -------------------------------------------------------------------------

@declare("STREAM_BEGIN_CAPTURE", check=_stream)
def stream_begin_capture(session, hdr, handle, s, mode):
    return session.graphs.begin(handle, s, mode)


# A capture that fails to end is destroyed by the driver, and with it what it parked.
@declare("STREAM_END_CAPTURE", check=_stream, charge=RELEASES)
def stream_end_capture(session, hdr, handle, s):
    return (session.graphs.end(handle, s),)


def _capture_info(session, hdr, stream, nodes) -> tuple:
    if nodes not in (0, 1):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"STREAM_CAPTURE_INFO nodes {nodes}")
    return checks.stream(session, stream), nodes


@declare("STREAM_CAPTURE_INFO", check=_capture_info)
def stream_capture_info(session, hdr, s, nodes):
    return session.graphs.info(s, nodes=bool(nodes))


# -- graphs and instantiations ----------------------------------------------------------

def upload_stream(session):
    """A stream of the executor's own for uploads: no capture or wait of the guest's
    is on it."""
    if session.upload_stream is None:
        session.upload_stream = session.device.stream_create(1)  # CU_STREAM_NON_BLOCKING
    return session.upload_stream


@declare("GRAPH_INSTANTIATE", charge=MEASURED, check=by_books)
def graph_instantiate(session, hdr, graph, flags):
    """Instantiated and uploaded at once, and charged what that took of device memory."""
    graphs, device = session.graphs, session.device
    memory = session.graph_memory
    if memory.has_nodes(graph):
        # Not uploaded: the driver would map its allocations' memory now, which it does at
        # the first launch (programs read the graph memory figures before it). Charged what
        # it allocates instead (graph_memory.py), or refused past the quota.
        handle = graphs.instantiate(graph, flags)
        try:
            memory.instantiated(graph, handle, flags)
        except CudaError:
            with DEVICE_MEMORY:
                quietly(graphs.destroy_exec, handle)
            raise
        return (handle,)
    if session.quota is None:
        return (graphs.instantiate(graph, flags),)

    def make() -> int:
        handle = graphs.instantiate(graph, flags)
        try:
            stream = upload_stream(session)
            device.graph_upload(graphs.execs.get(handle), stream)
            device.stream_synchronize(stream)
        except CudaError:
            with DEVICE_MEMORY:
                quietly(graphs.destroy_exec, handle)
            raise
        return handle

    handle, taken = session.ledger.measure(device, make, graphs.destroy_exec,
                                           "the instantiated graph takes")
    session.exec_charges[handle] = taken
    return (handle,)


@declare("GRAPH_GET_NODES", check=by_books)
def graph_get_nodes(session, hdr, graph, most):
    return session.graphs.list_nodes(graph, most)


def _create(session, hdr, flags) -> tuple:
    if flags:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"cuGraphCreate flags {flags:#x}")
    return ()


@declare("GRAPH_CREATE", check=_create)
def graph_create(session, hdr):
    return (session.graphs.create(),)


@declare("GRAPH_EXEC_UPDATE", check=by_books)
def graph_exec_update(session, hdr, exec_, graph):
    return session.graphs.update(exec_, graph)


@declare("GRAPH_CLONE", check=by_books)
def graph_clone(session, hdr, graph):
    return (session.graphs.clone(graph),)


@declare("GRAPH_NODE_FIND_IN_CLONE", check=by_books)
def graph_node_find_in_clone(session, hdr, clone, node):
    return (session.graphs.find_in_clone(clone, node),)


def _launch(session, hdr, exec_, stream) -> tuple:
    s = checks.stream(session, stream)
    if session.graphs.capturing(s):  # a graph in a graph: copies of it, without bound
        raise CudaError(P.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a graph launched on a "
                        "capturing stream (a child graph node) is not built by hvgpu")
    return exec_, s


@declare("GRAPH_LAUNCH", check=_launch)
def graph_launch(session, hdr, exec_, s):
    memory = session.graph_memory
    if not memory.holds_memory(exec_):
        session.graphs.launch(exec_, s)
        return
    with DEVICE_MEMORY:  # the driver maps its allocations' memory as it launches
        session.graphs.launch(exec_, s)
    memory.launched(exec_)


def _upload(session, hdr, exec_, stream) -> tuple:
    return exec_, checks.stream(session, stream)


@declare("GRAPH_UPLOAD", check=_upload)
def graph_upload(session, hdr, exec_, s):
    session.graphs.upload(exec_, s)


# The last graph gone releases what was parked for it.
@declare("GRAPH_DESTROY", charge=RELEASES, check=by_books)
def graph_destroy(session, hdr, graph):
    with DEVICE_MEMORY:  # it may hold device memory, and what it parked
        session.graphs.destroy(graph)


@declare("GRAPH_EXEC_DESTROY", charge=RELEASES, check=by_books)
def graph_exec_destroy(session, hdr, exec_):
    with DEVICE_MEMORY:
        session.graphs.destroy_exec(exec_)
    session.ledger.uncharge(session.exec_charges.pop(exec_, 0))
    session.graph_memory.settle()  # what the driver's pool still holds stays charged


# -- nodes ---------------------------------------------------------------------------------

def _kernel(session, function, gx, gy, gz, bx, by, bz, shared_mem, params) -> tuple:
    """A kernel node's launch: the guest's function, with the kernel's parameter size."""
    fn = checks.launch_params(session, function, params)
    checks.graph_reads_params(session, params)
    return fn, (gx, gy, gz), (bx, by, bz), shared_mem, bytes(params)


def _kernel_node(session, hdr, graph, function, gx, gy, gz, bx, by, bz, smem, deps,
                 params) -> tuple:
    return graph, deps, _kernel(session, function, gx, gy, gz, bx, by, bz, smem, params)


@declare("GRAPH_ADD_KERNEL_NODE", check=_kernel_node)
def graph_add_kernel_node(session, hdr, graph, deps, kernel):
    return (session.graphs.add_node(graph, deps, lambda g, d: session.device.graph_add_kernel(
        g, d, *kernel)),)


def _memset_node(session, hdr, graph, dst, pitch, value, width_bytes, width, height,
                 deps) -> tuple:
    if width_bytes not in (1, 2, 4) or not width or not height:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"memset node of {height} rows of "
                        f"{width} elements of {width_bytes} bytes")
    row = width * width_bytes
    if height > 1 and pitch < row:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"pitch {pitch} under a row of {row}")
    checks.device_range(session, dst, (height - 1) * pitch + row, "destination")
    checks.graph_reaches(session, dst)
    return graph, dst, pitch, value, width_bytes, width, height, deps


@declare("GRAPH_ADD_MEMSET_NODE", check=_memset_node)
def graph_add_memset_node(session, hdr, graph, dst, pitch, value, width_bytes, width, height,
                          deps):
    return (session.graphs.add_node(graph, deps, lambda g, d: session.device.graph_add_memset(
        g, d, dst, pitch, value, width_bytes, width, height)),)


def _memcpy_node(session, hdr, graph, kind, region, dst, src, size, deps) -> tuple:
    if kind == P.MEMCPY_NODE_DEVICE:
        checks.device_range(session, dst, size, "destination")
        checks.device_range(session, src, size, "source")
    elif kind == P.MEMCPY_NODE_FROM_REGION:
        src, room = checks.region(session, region).address(src, size, "source"), src
        checks.device_range(session, dst, size, "destination")
        checks.graph_reaches_room(session, region, room)
    elif kind == P.MEMCPY_NODE_TO_REGION:
        dst, room = checks.region(session, region).address(dst, size, "destination"), dst
        checks.device_range(session, src, size, "source")
        checks.graph_reaches_room(session, region, room)
    else:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"memcpy node kind {kind}")
    if not size:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "a memcpy node of 0 bytes")
    for ptr in ((dst, src) if kind == P.MEMCPY_NODE_DEVICE else
                (dst,) if kind == P.MEMCPY_NODE_FROM_REGION else (src,)):
        checks.graph_reaches(session, ptr)
    return graph, kind, region, dst, src, size, deps


@declare("GRAPH_ADD_MEMCPY_NODE", check=_memcpy_node)
def graph_add_memcpy_node(session, hdr, graph, kind, region, dst, src, size, deps):
    if kind:  # detaching the region is parked while a graph may copy to or from it
        session.graphs.regions.add(region)
    return (session.graphs.add_node(graph, deps, lambda g, d: session.device.graph_add_memcpy(
        g, d, kind, dst, src, size)),)


@declare("GRAPH_ADD_EMPTY_NODE", check=by_books)
def graph_add_empty_node(session, hdr, graph, deps):
    return (session.graphs.add_node(graph, deps, session.device.graph_add_empty),)


def _event_node(session, hdr, graph, wait, reserved, event, deps) -> tuple:
    obj = checks.event(session, event)
    if wait not in (0, 1):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"event node kind {wait}")
    return graph, wait, event, obj, deps


@declare("GRAPH_ADD_EVENT_NODE", check=_event_node)
def graph_add_event_node(session, hdr, graph, wait, event, obj, deps):
    session.graphs.events.add(event)  # destroying it is parked while a graph may use it
    return (session.graphs.add_node(graph, deps, lambda g, d: session.device.graph_add_event(
        g, d, wait, obj)),)


@declare("GRAPH_CONDITIONAL_HANDLE_CREATE", check=by_books)
def graph_conditional_handle_create(session, hdr, graph, default_value, flags):
    return (session.graphs.conditional_handle(graph, default_value, flags),)


@declare("GRAPH_ADD_CONDITIONAL_NODE", check=by_books)
def graph_add_conditional_node(session, hdr, graph, handle, kind, size, deps):
    return session.graphs.add_conditional(graph, deps, handle, kind, size)


@declare("GRAPH_ADD_DEPENDENCIES", check=by_books)
def graph_add_dependencies(session, hdr, graph, sources, targets):
    session.graphs.add_dependencies(graph, sources, targets)


def _kernel_params(session, hdr, exec_, node, function, gx, gy, gz, bx, by, bz, smem,
                   params) -> tuple:
    kernel = _kernel(session, function, gx, gy, gz, bx, by, bz, smem, params)
    return (*session.graphs.exec_node(exec_, node), kernel)


@declare("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", check=_kernel_params)
def graph_exec_kernel_node_set_params(session, hdr, ex, node, kernel):
    session.device.graph_exec_kernel_set(ex, node, *kernel)


# -- graph memory ------------------------------------------------------------------------

def _mem_alloc_node(session, hdr, graph, size, location_type, location_id, deps) -> tuple:
    check_location(location_type, location_id, "a graph allocation")
    session.graph_memory.check_size(size)
    return graph, size, deps


@declare("GRAPH_ADD_MEM_ALLOC_NODE", check=_mem_alloc_node)
def graph_add_mem_alloc_node(session, hdr, graph, size, deps):
    """Charged when instantiated (graph_memory.py): a graph no one instantiates takes
    addresses, not memory."""
    made: list[int] = []

    def add(g, d):
        node, dptr = session.device.graph_add_mem_alloc(g, d, size)
        made.append(dptr)
        return node
    node = session.graphs.add_node(graph, deps, add)
    session.graph_memory.allocated(graph, made[0], size)
    return node, made[0]


def _mem_free_node(session, hdr, graph, dptr, deps) -> tuple:
    session.graph_memory.check_free(dptr, graph)
    return graph, dptr, deps


@declare("GRAPH_ADD_MEM_FREE_NODE", check=_mem_free_node)
def graph_add_mem_free_node(session, hdr, graph, dptr, deps):
    node = session.graphs.add_node(graph, deps, lambda g, d: session.device.graph_add_mem_free(
        g, d, dptr))
    session.graph_memory.freed_in(graph, dptr)
    return (node,)


@declare("GRAPH_NODE_GET_TYPE", check=by_books)
def graph_node_get_type(session, hdr, node):
    kind, dptr, size = node_params(session.device, session.graphs.nodes.get(node))
    return kind, 0, dptr, size


# Gives back what the driver's pool no longer holds.
@declare("DEVICE_GRAPH_MEM_TRIM", charge=RELEASES)
def device_graph_mem_trim(session, hdr):
    with DEVICE_MEMORY:
        session.device.graph_mem_trim()
    session.graph_memory.settle()


def _graph_mem_attribute(session, hdr, attr, set_, value) -> tuple:
    if attr not in GRAPH_MEM_ATTRIBUTES or set_ not in (0, 1):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph memory attribute {attr}")
    if set_ and (attr not in (USED_HIGH, RESERVED_HIGH) or value):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph memory attribute {attr} cannot "
                        f"be set to {value} (only a high-water mark, only to 0)")
    return attr, set_


@declare("DEVICE_GRAPH_MEM_ATTRIBUTE", check=_graph_mem_attribute)
def device_graph_mem_attribute(session, hdr, attr, set_):
    if set_:
        session.device.graph_mem_set_attribute(attr, 0)
        return (0,)
    return (session.device.graph_mem_attribute(attr),)


def release_all(session) -> None:
    """At the end: captures end and graphs go first, and what they held back (parked)
    is released with them, then what their allocations left live; the instantiations'
    charges go with the guest's whole."""
    with DEVICE_MEMORY:
        session.graphs.release_all(session.stream)
        session.graph_memory.release_all()
    session.exec_charges.clear()
    if session.upload_stream is not None:
        quietly(session.device.stream_destroy, session.upload_stream)
        session.upload_stream = None
