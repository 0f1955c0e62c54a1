"""Device memory ops: allocations (cuMemAlloc), copies and memsets, free memory.

An :class:`Allocation` is charged as the driver takes it (its granularity, not
the size asked), ahead of the driver call, and owns that charge until it is
freed. A copy or memset touches only ranges the guest owns
(``checks.device_range``). Copies through the socket are staged in the
executor's pinned pool and are refused on a capturing stream (a graph would
replay them from a staging buffer reused since).

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.errors import ConnectionLost, CudaError
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, Resource, quietly
from hvgpu.host.executor.ops.table import ALREADY_REPLIED, SETTLES_FIRST, Family, RELEASES, ahead
from hvgpu.host.executor.staging import StagingPool
from hvgpu.host.executor.tables import Allocations
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

FAMILY = Family("memory")
declare = FAMILY.declare


class Allocation(Resource):
    """One cuMemAlloc of the guest: its address is its handle."""

    __slots__ = ()

    def release(self, session) -> None:
        with DEVICE_MEMORY:
            session.device.mem_free(self.handle)
        session.ledger.uncharge(self.charge)


def staging(session) -> StagingPool:
    """The executor's staging pool, or one of the session's own made on first use."""
    if session.staging is None:
        session.staging = StagingPool(session.device)
    return session.staging


def _size(session, hdr, size) -> tuple:
    if size == 0:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "cannot allocate 0 bytes")
    return (size,)


# Charged as the driver takes it (its granularity), not as asked, so that many small
# allocations cannot hold more than the quota.
@declare("MEM_ALLOC", check=_size, charge=ahead(lambda session, size:
                                                 session.device.footprint(size)))
def mem_alloc(session, hdr, size, *, charged):
    with DEVICE_MEMORY:
        ptr = session.device.mem_alloc(size)
    session.allocs.add(ptr, size)
    session.allocations[ptr] = Allocation(ptr, charged)
    return (ptr,)


def _allocation(session, hdr, dptr) -> tuple:
    if dptr not in session.allocations and session.graph_memory.is_allocation(dptr):
        return (dptr,)  # a graph's allocation, freed outside the graph
    if dptr not in session.allocations:
        opened = " (opened from an IPC handle: cuIpcCloseMemHandle lets it go)" \
            if dptr in session.ipc_held.opened else ""
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"0x{dptr:x} is not an allocation of this guest{opened}")
    return (dptr,)


def release_of(session, allocation: Allocation):
    """What gives ``allocation`` back: at once, or, where it was exported to the VM's
    other processes (ipc.py), once the last of them closed it; its charge stays on
    the slice until then, no longer this guest's."""
    export = session.ipc_held.exports.pop(allocation.handle, None)
    if export is None:
        return lambda: allocation.release(session)
    device, ptr = session.device, allocation.handle
    uncharge = session.ledger.hand_over(allocation.charge)

    def last() -> None:
        with DEVICE_MEMORY:
            quietly(device.mem_free, ptr)
        uncharge()
    return session.ipc.withdraw(export, last)


@declare("MEM_FREE", check=_allocation, charge=RELEASES)
def mem_free(session, hdr, dptr):
    if dptr not in session.allocations:  # graph memory: its charge goes at the next trim
        with DEVICE_MEMORY:
            session.device.mem_free(dptr)
        session.graph_memory.freed(dptr)
        return
    session.allocs.remove(dptr)
    release = release_of(session, session.allocations.pop(dptr))
    if dptr in session.graphs.allocations and session.graphs.park(
            f"allocation 0x{dptr:x}", release):
        return  # a graph may still write it: freed, and uncharged, when the last goes
    release()


@declare("MEMCPY_HTOD", burst=("cuMemcpyHtoDAsync",), fields=(
    F.device_range("dst", F.PAYLOAD, what="destination"),
    F.stream("stream", capture="a copy from pageable host memory")))
def memcpy_htod(session, hdr, dst, s):
    n = hdr.payload_len
    staging(session).upload(session.reader.read_payload_into, dst, n, s)
    session.counts["h2d_bytes"] += n


def _download(session, hdr, src, size, stream) -> tuple:
    checks.device_range(session, src, size, "source")
    s = checks.stream(session, stream)
    session.graphs.refuse_if_capturing(s, "a copy to pageable host memory")
    return src, size, s


@declare("MEMCPY_DTOH", check=_download)
def memcpy_dtoh(session, hdr, src, size, s):
    lock = session.send_lock
    started = False

    def start():
        nonlocal started
        head = pack_header(hdr.op, P.FLAG_REPLY, hdr.seq, 0, 0, size)
        try:
            with lock:
                session.streaming = started = True  # until the last byte: no progress frame
                if session.kernel_output is not None:  # a blocking copy flushes printf
                    session.output_locked(head)
                session.send_locked(head)
        except OSError as exc:
            raise ConnectionLost(f"guest went away during a copy: {exc}") from None

    def send(view):
        try:
            with lock:
                session.send_locked(view)
        except OSError as exc:
            raise ConnectionLost(f"guest went away during a copy: {exc}") from None

    try:
        staging(session).download(src, size, s, start, send)
    except CudaError as exc:
        if started:  # the guest is owed bytes we cannot produce
            raise ConnectionLost(f"copy failed after its reply began ({exc}); "
                                 "closing the connection") from None
        raise
    session.counts["d2h_bytes"] += size
    session.streaming = False
    return ALREADY_REPLIED


@declare("MEMCPY_DTOD", burst=("cuMemcpyDtoDAsync",), fields=(
    F.device_range("dst", "size", what="destination"),
    F.device_range("src", "size", what="source"), F.stream("stream")))
def memcpy_dtod(session, hdr, dst, src, size, s):
    session.device.memcpy_dtod_async(dst, src, size, s)


@declare("MEMSET", burst=("cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async"), fields=(
    F.one_of("width", (1, 2, 4)),
    F.device_range("dst", "count", times="width", what="destination"), F.stream("stream")))
def memset(session, hdr, dst, count, value, width, s):
    session.device.memset_async(dst, value, width, count, s)


@declare("MEM_GET_INFO", charge=SETTLES_FIRST)
def mem_get_info(session, hdr):
    free, total = session.device.mem_info()
    if session.quota is not None:
        used, limit = session.quota.usage()
        return (max(0, min(limit - used, free)), limit)
    return (free, total)


def release_staging(session) -> None:
    if session.staging is not None and session.owns_staging:
        session.staging.close()
    session.staging = None


def release_all(session) -> None:
    """At the end: every allocation, under the lock a module load measures under
    (another session's load would otherwise be charged less than it took); their
    charges go with the guest's whole."""
    with DEVICE_MEMORY:
        for ptr, allocation in list(session.allocations.items()):
            if ptr in session.ipc_held.exports:  # others of the VM may still hold it
                quietly(release_of(session, allocation))
            else:
                quietly(session.device.mem_free, ptr)
    session.allocations.clear()
    session.allocs = Allocations()
