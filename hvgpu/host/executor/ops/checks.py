"""The checks several families make: is this stream, range, function or region the
guest's?

Each raises CudaError with CUDA's status and a message naming what was refused,
or returns the object the guest's number names. A check may note what a capture
under way could reach (``graphs.Graphs``: freeing it is then parked), never more.

Must not call the driver for work, only to look things up.
"""

from __future__ import annotations

from typing import Any

from hvgpu.errors import CudaError
from hvgpu.host.executor.device import STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD
from hvgpu.virtio import protocol as P

_SPECIAL_STREAMS = (STREAM_DEFAULT, STREAM_LEGACY, STREAM_PER_THREAD)


def stream(session, handle: int) -> Any:
    """The device's stream a guest's stream number names."""
    if handle in _SPECIAL_STREAMS:
        return session.device.stream(handle)
    return session.streams.get(handle).obj


def event(session, handle: int) -> Any:
    return session.events.get(handle).obj


def device_ordinal(ordinal: int) -> None:
    if ordinal != 0:
        raise CudaError(P.CUDA_ERROR_INVALID_DEVICE,
                        f"device {ordinal}: a connection serves one vGPU, its device 0 "
                        "(each of a VM's vGPUs has its own connection)")


def device_range(session, ptr: int, n: int, what: str) -> None:
    """Inside an allocation of this guest (cuMemAlloc, pool, readable-writable mapped
    memory, or an allocation node of its graphs), or a module variable it looked up."""
    if session.graphs.origins:  # a capture under way may take this work in
        graph_reaches(session, ptr)
    if session.allocs.holds(ptr, n) or session.pools.allocs.holds(ptr, n) \
            or session.vmm.covers(ptr, n) or session.graph_memory.ranges.holds(ptr, n):
        return
    for ranges in session.globals.values():
        if ranges.holds(ptr, n):
            return
    why = session.vmm.why_not(ptr)
    if why is not None:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{what}: {why}")
    # Refused (check raises): said from the view of the allocation ptr falls in, if any.
    (session.pools.allocs if session.pools.allocs.holds(ptr, 1) else session.allocs).check(
        ptr, n, what)


def graph_reaches(session, ptr: int) -> None:
    """A graph may write or read the allocation ``ptr`` falls in: freeing it is parked;
    or device-mapped pinned memory: giving its room back or detaching its region is."""
    base = session.allocs.base_of(ptr)
    if base is not None:
        session.graphs.allocations.add(base)
    elif session.host_maps.starts:
        found = session.host_maps.find(ptr, 1)
        if found is not None:
            session.graphs.regions.add(found[0])
            if not session.regions[found[0]].owned:
                session.graphs.rooms.add(found)


def graph_reaches_room(session, number: int, offset: int) -> None:
    """A graph may copy to or from ``offset`` of region ``number``: in the VM's device
    region (shared by the VM's processes) the room it lies in goes back to the region
    only once no graph is left, so no other process is given it while a replay writes it."""
    attached = session.regions[number]
    if not attached.owned:
        for at, n in attached.rooms.items():
            if at <= offset < at + n:
                session.graphs.rooms.add((number, at))


def graph_reads_params(session, params) -> None:
    """A kernel a graph runs: every aligned 8 bytes of its parameters that falls in
    an allocation may be a pointer it writes through."""
    words = memoryview(params)[:len(params) // 8 * 8].cast("B").cast("Q")
    for value in words:
        graph_reaches(session, value)


def function(session, handle: int) -> Any:
    """The device's function a guest's function number names."""
    return session.functions.get(handle)[1]


def layout(session, handle: int) -> list:
    """A function's parameters (offset, size), asked of the driver once."""
    found = session.layouts.get(handle)
    if found is None:
        found = session.device.param_layout(session.functions.get(handle)[1])
        session.layouts[handle] = found
    return found


def launchable(session, handle: int) -> tuple:
    """(function, its parameters' size), known to the C loop from here on."""
    entry = session.launchable.get(handle)
    if entry is None:
        params = layout(session, handle)
        entry = session.launchable[handle] = (
            session.functions.get(handle)[1],
            (params[-1][0] + params[-1][1]) if params else 0)
        if session.burst is not None:
            session.burst.set_function(handle, session.device.handle_value(entry[0]), entry[1])
    return entry


def launch_params(session, handle: int, params) -> Any:
    """The function to launch, once the parameter buffer has the kernel's size."""
    entry = session.launchable.get(handle)
    fn, need = entry if entry is not None else launchable(session, handle)
    if len(params) != need:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"parameter buffer is {len(params)} bytes, the kernel takes {need}")
    return fn


def region(session, number: int):
    """The region (regions.Attached) a guest's region number names."""
    attached = session.regions.get(number)
    if attached is None:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"region {number} is not attached on this connection")
    return attached


# -- CUDA IPC among the processes of one VM (ipc.py) ---------------------------------------

EVENT_INTERPROCESS = 0x4 | 0x2  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING


def ipc_allocation(session, ptr: int) -> Any:
    """The cuMemAlloc allocation of this guest ``ptr`` lies in (the memory
    cuIpcGetMemHandle exports: not pool, mapped or opened memory)."""
    base = session.allocs.base_of(ptr)
    if base is None or base not in session.allocations:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"0x{ptr:x} is not inside a cuMemAlloc allocation of this guest")
    return session.allocations[base]


def ipc_token(session, token, kind: str, own: bool = False) -> Any:
    """The live export of this executor ``token`` names, exported by another
    connection (unless ``own``): opening one's own cuIpc handle is refused, as the
    driver refuses a handle opened in the process that made it."""
    export = session.ipc.find(token, kind)
    if export.exporter is session and not own:
        raise CudaError(P.CUDA_ERROR_INVALID_CONTEXT,
                        f"the IPC {kind} handle was exported by this process: it opens in "
                        "another process only")
    return export


def ipc_opened(session, ptr: int) -> list:
    """What this connection opened at ``ptr`` (the base cuIpcOpenMemHandle gave)."""
    opened = session.ipc_held.opened.get(ptr)
    if opened is None:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"0x{ptr:x} is not memory this process opened with "
                        "cuIpcOpenMemHandle")
    return opened


def ipc_event(session, handle: int) -> Any:
    """An event of this guest's that may be exported (made with CU_EVENT_INTERPROCESS
    and CU_EVENT_DISABLE_TIMING, not opened from another process's handle)."""
    held = session.events.get(handle)
    if held.flags & EVENT_INTERPROCESS != EVENT_INTERPROCESS:
        raise CudaError(P.CUDA_ERROR_INVALID_HANDLE,
                        f"event {handle} was not made with CU_EVENT_INTERPROCESS and "
                        "CU_EVENT_DISABLE_TIMING")
    if held.export is not None and held.export.exporter is not session:
        raise CudaError(P.CUDA_ERROR_INVALID_HANDLE,
                        f"event {handle} was opened from another process's IPC handle")
    return held
