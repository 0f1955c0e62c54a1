"""Virtual memory management and stream-ordered pools.

``vmm.VirtualMemory`` and ``pools.Pools`` keep the books of what the guest
reserved, created, mapped and allocated from its pools, and charge the slice
as the driver takes memory (``table.BOOKS``); the ops here check their
arguments (``vmm.check_*``, ``pools.check_*``) and hand the rest to them. A
pool allocation or free on a capturing stream is refused: it would be a graph
memory node, which hvgpu does not build.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.errors import CudaError
from hvgpu.host.executor import ipc, pools, vmm
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.device import STREAM_LEGACY, STREAM_PER_THREAD
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.ledger import quietly
from hvgpu.host.executor.ops.table import BOOKS, RELEASES, Family, by_books
from hvgpu.virtio import protocol as P

FAMILY = Family("virtual memory and pools")
declare = FAMILY.declare


# -- virtual memory management ---------------------------------------------------------

def _reserve(session, hdr, size, alignment, addr, flags) -> tuple:
    vmm.check_reserve(size, alignment, addr, flags)
    return size, alignment, addr


@declare("MEM_ADDRESS_RESERVE", check=_reserve)
def mem_address_reserve(session, hdr, size, alignment, addr):
    return (session.vmm.reserve(size, alignment, addr),)


@declare("MEM_ADDRESS_FREE", check=by_books)
def mem_address_free(session, hdr, dptr, size):
    session.vmm.free_addresses(dptr, size)


def _create(session, hdr, size, type_, handle_types, loc_type, loc_id, alloc_flags) -> tuple:
    compression = vmm.check_create(session.device, size, type_, handle_types, loc_type, loc_id,
                                   alloc_flags)
    return size, handle_types, compression


@declare("MEM_CREATE", check=_create, charge=BOOKS)
def mem_create(session, hdr, size, handle_types, compression):
    return (session.vmm.create(size, handle_types, compression),)


# Shared among the VM's processes through the executor's table (ipc.py): the memory
# stays charged to the slice, whichever process holds it last.
@declare("MEM_EXPORT", fields=(F.vmm_handle("handle"), F.one_of("handle_type", (vmm.POSIX_FD,)),
                               F.one_of("flags", (0,))))
def mem_export(session, hdr, handle, handle_type, flags):
    return (session.vmm.export(handle, session),)


@declare("MEM_IMPORT", fields=(F.one_of("handle_type", (vmm.POSIX_FD,)),
                               F.ipc_token("token", what=ipc.VMM, own=True)))
def mem_import(session, hdr, handle_type, export):
    return (session.vmm.import_(export),)


@declare("MEM_RELEASE", check=by_books, charge=RELEASES)
def mem_release(session, hdr, handle):
    session.vmm.release(handle)


def _map(session, hdr, dptr, size, offset, handle, flags) -> tuple:
    vmm.check_map(flags)
    return dptr, size, offset, handle


@declare("MEM_MAP", check=_map)
def mem_map(session, hdr, dptr, size, offset, handle):
    session.vmm.map(dptr, size, offset, handle)


# The last mapping of memory the guest released gives it back.
@declare("MEM_UNMAP", check=by_books, charge=RELEASES)
def mem_unmap(session, hdr, dptr, size):
    session.vmm.unmap(dptr, size)


def _access(session, hdr, dptr, size, descs) -> tuple:
    return dptr, size, vmm.check_access(descs)


@declare("MEM_SET_ACCESS", check=_access)
def mem_set_access(session, hdr, dptr, size, flags):
    session.vmm.set_access(dptr, size, flags)


@declare("MEM_GET_ACCESS", check=by_books)
def mem_get_access(session, hdr, dptr):
    return (session.vmm.get_access(dptr),)


def _granularity(session, hdr, option) -> tuple:
    vmm.check_granularity(option)
    return (option,)


@declare("MEM_GET_GRANULARITY", check=_granularity)
def mem_get_granularity(session, hdr, option):
    return (session.vmm.granularity(option),)


def _granularity_of(session, hdr, option, alloc_flags) -> tuple:
    vmm.check_granularity(option)
    return option, vmm.check_alloc_flags(alloc_flags)


@declare("MEM_GET_GRANULARITY_OF", check=_granularity_of)
def mem_get_granularity_of(session, hdr, option, compression):
    return (session.vmm.granularity(option, compression),)


@declare("MEM_RETAIN_HANDLE", check=by_books)
def mem_retain_handle(session, hdr, dptr):
    return (session.vmm.retain(dptr),)


@declare("MEM_HANDLE_INFO", check=by_books)
def mem_handle_info(session, hdr, handle):
    return (session.vmm.handle_size(handle),)


@declare("MEM_HANDLE_PROPS", check=by_books)
def mem_handle_props(session, hdr, handle):
    return session.vmm.handle_props(handle)


# -- stream-ordered allocation -----------------------------------------------------------

def _pool(session, hdr, type_, handle_types, loc_type, loc_id, max_size, usage) -> tuple:
    pools.check_create(type_, handle_types, loc_type, loc_id, usage)
    return max_size, handle_types


# A pool is charged what it holds, as it grows (mem_alloc_async), not when it is made.
@declare("MEM_POOL_CREATE", check=_pool)
def mem_pool_create(session, hdr, max_size, handle_types):
    return (session.pools.create(max_size, handle_types),)


# Shared among the VM's processes through the executor's table (ipc.py), as VMM memory
# is: the pool's memory stays charged to the slice, whichever process holds it last.
@declare("MEM_POOL_EXPORT", fields=(F.one_of("handle_type", (vmm.POSIX_FD,)),
                                    F.one_of("flags", (0,))))
def mem_pool_export(session, hdr, pool, handle_type, flags):
    return (session.pools.export(pool, session),)


@declare("MEM_POOL_IMPORT", fields=(F.one_of("handle_type", (vmm.POSIX_FD,)),
                                    F.one_of("flags", (0,)),
                                    F.ipc_token("token", what=ipc.POOL, own=True)))
def mem_pool_import(session, hdr, handle_type, flags, export):
    return (session.pools.import_(export),)


@declare("MEM_POOL_EXPORT_POINTER", check=by_books)
def mem_pool_export_pointer(session, hdr, dptr):
    return (session.pools.export_pointer(dptr, session),)


# Another process's allocation: imported into a pool this one imported, never into the
# exporter itself (its own pointer is its already).
@declare("MEM_POOL_IMPORT_POINTER", fields=(F.ipc_token("token", what=ipc.POINTER),))
def mem_pool_import_pointer(session, hdr, pool, export):
    return session.pools.import_pointer(pool, export)


@declare("MEM_POOL_DESTROY", check=by_books, charge=RELEASES)
def mem_pool_destroy(session, hdr, pool):
    session.pools.destroy(pool)


@declare("MEM_POOL_DEFAULT")
def mem_pool_default(session, hdr):
    return (session.pools.default(),)


def _capture_graph(session, s) -> int | None:
    """The handle of the graph capturing stream ``s`` (of this connection), or None."""
    graphs = session.graphs
    if not graphs.capturing(s):
        return None
    status, _, graph, _ = session.device.stream_capture_info(s)
    gh = graphs.graph_handle(graph) if graph is not None else None
    if gh is None:
        raise CudaError(P.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "the stream's capture is "
                        "not one of this connection's, or has been invalidated")
    return gh


def _alloc_async(session, hdr, size, pool, stream) -> tuple:
    s = checks.stream(session, stream)
    pools.check_size(size)
    gh = _capture_graph(session, s)
    if gh is not None:  # an allocation node of the capture's graph (graph_memory.py)
        session.graph_memory.check_size(size)
        return size, pool, stream, (gh, s, session.pools.object_of(pool))
    return size, pool, stream, None


# Captured: charged when the graph is instantiated (graph_memory.py).
@declare("MEM_ALLOC_ASYNC", check=_alloc_async, charge=BOOKS)
def mem_alloc_async(session, hdr, size, pool, stream, captured):
    if captured is None:
        return (session.pools.alloc(size, pool, stream),)
    gh, s, obj = captured
    dptr = session.device.pool_alloc(size, obj, s)
    session.graph_memory.allocated(gh, dptr, size)
    return (dptr,)


def _free_async(session, hdr, dptr, stream) -> tuple:
    s = checks.stream(session, stream)
    if session.graph_memory.is_allocation(dptr):  # a graph's: a free node, or freed now
        gh = _capture_graph(session, s)
        session.graph_memory.check_free(dptr, gh)
        return dptr, stream, (gh, s)
    session.graphs.refuse_if_capturing(s, "cuMemFreeAsync of memory no graph allocated")
    return dptr, stream, None


# Freed on its stream; a pool the guest destroyed goes with its last allocation. Graph
# memory's charge goes at the next trim (graph_memory.py).
@declare("MEM_FREE_ASYNC", check=_free_async, charge=RELEASES)
def mem_free_async(session, hdr, dptr, stream, graph):
    if graph is None:
        session.pools.free(dptr, stream)
        return
    gh, s = graph
    session.device.pool_free(dptr, s)
    if gh is not None:
        session.graph_memory.freed_in(gh, dptr)
    else:
        session.graph_memory.freed(dptr)


@declare("MEM_POOL_SET_ATTRIBUTE", check=by_books)
def mem_pool_set_attribute(session, hdr, pool, attrib, value):
    session.pools.set_attribute(pool, attrib, value)


@declare("MEM_POOL_GET_ATTRIBUTE", check=by_books)
def mem_pool_get_attribute(session, hdr, pool, attrib):
    return (session.pools.get_attribute(pool, attrib),)


@declare("MEM_POOL_TRIM_TO", check=by_books, charge=RELEASES)
def mem_pool_trim_to(session, hdr, pool, keep):
    session.pools.trim(pool, keep)


def release_all(session) -> None:
    """At the end: pool memory first, freed on the streams it was allocated on, then
    mappings, physical memory and reservations."""
    device = session.device
    if session.vmm.mappings:
        # Unmapping does not wait for the GPU (cuMemFree does): work still queued on
        # the guest's streams must not find its memory gone.
        for stream in (*(s.obj for s in session.streams.objects.values()),
                       device.stream(STREAM_LEGACY), device.stream(STREAM_PER_THREAD)):
            quietly(device.stream_synchronize, stream)
    session.pools.release_all()
    session.vmm.release_all()
