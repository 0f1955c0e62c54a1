"""The region lane: regions a guest attaches, room in them, copies through them.

A region (``executor/regions.py``) is a sealed memfd the guest passes with
REGION_ATTACH, or the VM's device region, and counts against the executor's
region budget, not the device quota. A copy names (region, offset,
size), checked against the region and, in the VM's region, against the room
this connection took. Detaching waits for the GPU and is parked while a graph
may still copy to or from the region.

Must not open files (the agent opens the VM's region; guests send memfds) or
import CUDA.
"""

from __future__ import annotations

import logging
import os

from hvgpu.errors import CudaError
from hvgpu.host.executor import regions
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.ledger import quietly
from hvgpu.host.executor.ops.table import RELEASES, REGION_MEMORY, Family
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as region_layout

log = logging.getLogger(__name__)

FAMILY = Family("regions")
declare = FAMILY.declare


def drop(session, attached: regions.Attached) -> None:
    """After the GPU is done with it: no DMA may outlive the mapping or the room."""
    session.device.synchronize()
    attached.give_all(session.host_maps)
    if attached.owned:
        attached.region.close()
        session.executor_regions.budget.give(attached.region.size)


def _attach(session, hdr, kind, flags, size) -> tuple:
    """The descriptor that came with the frame (``session.frame_fd``) stays the
    session's until the action takes it: a refused frame's is closed by the session."""
    fd = session.frame_fd
    if flags:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"REGION_ATTACH flags {flags:#x}")
    if len(session.regions) >= regions.MAX_REGIONS:
        raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, "a connection attaches at most "
                        f"{regions.MAX_REGIONS} regions")
    if kind == region_layout.KIND_MEMFD:
        if fd is None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            "REGION_ATTACH of a memfd came without its descriptor")
        regions.check_memfd(fd, size)
    elif kind == region_layout.KIND_DEVICE:
        if fd is not None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            "REGION_ATTACH of the device region takes no descriptor")
        if any(not a.owned for a in session.regions.values()):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            "the device region is already attached on this connection")
    else:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"no region kind {kind}")
    return kind, size


@declare("REGION_ATTACH", check=_attach, charge=REGION_MEMORY)
def region_attach(session, hdr, kind, size):
    fd, session.frame_fd = session.frame_fd, None
    try:
        if kind == region_layout.KIND_MEMFD:
            session.executor_regions.budget.take(size, "a memfd region")
            owned, fd = fd, None  # the Region's from here: it closes it, even failing
            try:
                got = regions.Region(owned, size, session.device, kind=region_layout.KIND_MEMFD)
            except BaseException:
                session.executor_regions.budget.give(size)
                raise
            attached = regions.Attached(got, owned=True)
        else:
            attached = regions.Attached(session.executor_regions.attach_device(session.device),
                                        owned=False)
            if size not in (0, attached.region.size):
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                f"the VM's region is {attached.region.size} bytes, not "
                                f"{size} (0 takes it whole)")
    finally:
        if fd is not None:
            os.close(fd)
    session.region_ids += 1
    session.regions[session.region_ids] = attached
    log.info("%s: attached a %s region of %d bytes as %d", session.peer,
             "memfd" if attached.owned else "device", attached.region.size, session.region_ids)
    device = 0 if attached.owned else session.executor_regions.vgpu
    return session.region_ids, device, attached.region.size, attached.region.token


def _region(session, hdr, number, *fields) -> tuple:
    return (number, checks.region(session, number), *fields)


@declare("REGION_DETACH", check=_region, charge=RELEASES)
def region_detach(session, hdr, number, attached):
    # A graph may copy from or to it: unmapped only once no graph is left.
    if number not in session.graphs.regions or not session.graphs.park(
            f"region {number}", lambda: drop(session, attached)):
        drop(session, attached)
    session.graphs.regions.discard(number)
    del session.regions[number]


@declare("REGION_ALLOC", check=_region)
def region_alloc(session, hdr, number, attached, reserved, size):
    return (attached.take(size),)


def _room(session, hdr, number, reserved, offset) -> tuple:
    attached = checks.region(session, number)
    if offset not in attached.rooms:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"offset {offset} is not an allocation of this connection")
    return number, attached, offset


@declare("REGION_FREE", check=_room)
def region_free(session, hdr, number, attached, offset):
    session.device.synchronize()  # cuMemFreeHost waits for the device, too
    if (number, offset) in session.graphs.rooms:  # a graph may still copy to or from it
        size = attached.rooms.pop(offset)  # the guest's no more; the region's later
        mapped = attached.maps.pop(offset, None)  # and its mapping at the guest's address
        if mapped is not None:
            session.host_maps.remove(mapped.addr)

        def later():
            if mapped is not None:
                mapped.close()
            attached.region.rooms.give(offset, size)
        if session.graphs.park(f"room {offset} of region {number}", later):
            return
        attached.rooms[offset] = size
        if mapped is not None:
            attached.maps[offset] = mapped
            session.host_maps.add(mapped.addr, mapped.size, number, offset)
    attached.give(offset, session.host_maps)


def _upload(session, hdr, dst, number, reserved, offset, size, stream) -> tuple:
    session.graphs.region_used(number)  # a capture under way may take the copy in
    src = checks.region(session, number).address(offset, size, "source")
    checks.device_range(session, dst, size, "destination")
    if session.graphs.origins:  # a capture under way may take it in
        checks.graph_reaches_room(session, number, offset)
    return dst, src, size, checks.stream(session, stream) if size else None


@declare("MEMCPY_HTOD_REGION", check=_upload)
def memcpy_htod_region(session, hdr, dst, src, size, s):
    if size:
        session.device.memcpy_htod_async(dst, src, size, s)
    session.counts["h2d_bytes"] += size


def _download(session, hdr, number, reserved, offset, src, size, stream) -> tuple:
    session.graphs.region_used(number)  # a capture under way may take the copy in
    dst = checks.region(session, number).address(offset, size, "destination")
    checks.device_range(session, src, size, "source")
    if session.graphs.origins:  # a capture under way may take it in
        checks.graph_reaches_room(session, number, offset)
    return dst, src, size, checks.stream(session, stream) if size else None


@declare("MEMCPY_DTOH_REGION", check=_download)
def memcpy_dtoh_region(session, hdr, dst, src, size, s):
    if size:
        session.device.memcpy_dtoh_async(dst, src, size, s)
    session.counts["d2h_bytes"] += size


def release_all(session) -> None:
    for attached in session.regions.values():
        quietly(drop, session, attached)
    session.regions.clear()
