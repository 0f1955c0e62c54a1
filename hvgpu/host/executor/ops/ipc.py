"""CUDA IPC among the processes of one VM: cuIpcGetMemHandle and its kin.

The executor's table of exports (``ipc.Exports``, one per executor, shared by its
sessions) names each exported cuMemAlloc allocation or interprocess event by a
random token; a connection that opens a token gets the same device memory (its
range becomes copyable by it) or the same driver event (a handle of its own).
Every field is checked as data (``fields=``): an IPC handle must name a live
export of this executor made by another connection; what is closed must have
been opened here.

Nothing is charged: an export is the exporter's memory, already charged to the
slice, which it stays until the last process holding it lets go.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.errors import CudaError
from hvgpu.host.executor import ipc
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.ops import streams
from hvgpu.host.executor.ops.table import Family
from hvgpu.virtio import protocol as P

FAMILY = Family("IPC among one VM's processes")
declare = FAMILY.declare

IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1  # CUipcMem_flags: the only flag there is


@declare("IPC_GET_MEM_HANDLE", fields=(F.ipc_allocation("dptr"),))
def ipc_get_mem_handle(session, hdr, allocation):
    held = session.ipc_held.exports
    export = held.get(allocation.handle)
    if export is None:  # one token per allocation, as long as it lives
        export = held[allocation.handle] = session.ipc.export(
            ipc.MEMORY, session, base=allocation.handle,
            size=session.allocs.sizes[allocation.handle])
    return (export.token,)


@declare("IPC_OPEN_MEM_HANDLE", fields=(
    F.one_of("flags", (0, IPC_MEM_LAZY_ENABLE_PEER_ACCESS)),
    F.ipc_token("handle", what=ipc.MEMORY)))
def ipc_open_mem_handle(session, hdr, flags, export):
    opened = session.ipc_held.opened.get(export.base)
    if opened is not None and opened[0] is export:  # opened before: one more reference
        opened[1] += 1
        return export.base, export.size
    if opened is not None or not session.ipc.hold(export):
        # this connection still holds memory the exporter freed at the same address
        # (closed too few times), or the export was withdrawn since it was looked up
        raise _gone(export)
    session.ipc_held.opened[export.base] = [export, 1]
    session.allocs.add(export.base, export.size)
    return export.base, export.size


def _gone(export):
    return CudaError(P.CUDA_ERROR_INVALID_VALUE,
                     f"the IPC memory handle's allocation at 0x{export.base:x} is gone")


@declare("IPC_CLOSE_MEM_HANDLE", fields=(F.ipc_opened("dptr"),))
def ipc_close_mem_handle(session, hdr, opened):
    opened[1] -= 1
    if opened[1]:
        return (opened[1],)
    export = opened[0]
    close(session, export)
    return (0,)


def close(session, export) -> None:
    """This connection no longer reaches the export's memory; the driver gets it back
    once no one holds it (parked while a graph of this connection may reach it)."""
    del session.ipc_held.opened[export.base]
    session.allocs.remove(export.base)
    let_go = lambda: session.ipc.let_go(export)  # noqa: E731
    if export.base in session.graphs.allocations and session.graphs.park(
            f"IPC memory 0x{export.base:x}", let_go):
        return
    let_go()


@declare("IPC_GET_EVENT_HANDLE", fields=(F.ipc_event("event"),))
def ipc_get_event_handle(session, hdr, event):
    if event.export is None:
        event.export = session.ipc.export(ipc.EVENT, session, obj=event.obj)
    return (event.export.token,)


@declare("IPC_OPEN_EVENT_HANDLE", fields=(F.ipc_token("handle", what=ipc.EVENT),))
def ipc_open_event_handle(session, hdr, export):
    if not session.ipc.hold(export):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "the IPC event handle's event is gone")
    # as the driver's: an event without timing (CU_EVENT_DISABLE_TIMING)
    return (streams.add_event(session, export.obj, 0x2, export),)


def release_all(session) -> None:
    """At the end: what this connection opened (events go with its other events)."""
    for export, _ in list(session.ipc_held.opened.values()):
        try:
            close(session, export)
        except Exception:  # releasing at exit: never stop releasing
            pass
