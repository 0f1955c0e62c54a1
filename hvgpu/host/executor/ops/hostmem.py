"""Device-mapped pinned memory (HOST_MAP) and stream memory operations (STREAM_MEMOP).

HOST_MAP maps a guest's pinned memory, which lies in a region (``regions.py``), a
second time at the guest's own address and registers it device-mapped
(``host_maps.py``): a kernel then reads and writes the guest's bytes through the
guest's pointer. It maps only a whole allocation of this connection (an owned memfd
region, or one of its rooms of the VM's region), once, at page-aligned addresses
inside user space where nothing is mapped and no device memory or reservation of the
executor's sessions lies; the mapping goes with the room or region (``regions.py``
undoes it where they are given back, after the device is done with them).

STREAM_MEMOP carries cuStreamWaitValue32/64, cuStreamWriteValue32/64 and
cuStreamBatchMemOp: one-way, ordered on their stream, their errors reported at the
next synchronisation. Every address they name lies in device memory of this
connection (cuMemAlloc, pools, mapped VMM memory, module variables) or in its
device-mapped pinned memory, checked before the driver sees it: a guest cannot make
the GPU write or wait on another guest's memory or the executor's. While a capture is
under way, what they name is noted as reachable by a graph, so freeing it is parked.

Must not import CUDA; the session's ``GpuDevice`` maps, registers and runs them.
"""

from __future__ import annotations

import logging
import struct

from hvgpu.errors import CudaError
from hvgpu.host.executor import host_maps
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.table import Family
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

FAMILY = Family("device-mapped host memory and stream memory operations")
declare = FAMILY.declare

_RECORD = struct.Struct("<IIQQ")  # operation, flags, address, value
assert _RECORD.size == P.MEMOP_SIZE
_WAIT32, _WRITE32, _FLUSH, _WAIT64, _WRITE64, _BARRIER = 1, 2, 3, 4, 5, 6
_WIDTH = {_WAIT32: 4, _WRITE32: 4, _WAIT64: 8, _WRITE64: 8}  # the ones naming an address
_CALLS = (P.MEMOP_BATCH, P.MEMOP_BATCH_V1, P.MEMOP_ONE, P.MEMOP_ONE_V1)


def _host_map(session, hdr, number, reserved, offset, size, addr) -> tuple:
    attached = checks.region(session, number)
    if reserved:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"HOST_MAP reserved {reserved:#x}")
    attached.mappable(offset, size)
    host_maps.check_address(addr, size)
    if host_maps.overlaps_device(session.neighbours(), addr, size):
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                        f"0x{addr:x}+{size} meets device memory or a reservation of this "
                        "executor: pinned memory there cannot be device-mapped")
    return number, attached, offset, size, addr


@declare("HOST_MAP", check=_host_map)
def host_map(session, hdr, number, attached, offset, size, addr):
    mapped = host_maps.HostMap(attached.region.addr + offset, size, addr, session.device)
    attached.maps[offset] = mapped
    session.host_maps.add(addr, size, number, offset)
    log.debug("%s: pinned memory of region %d at offset %d mapped at 0x%x (%d bytes)",
              session.peer, number, offset, addr, size)
    return (addr,)


def _address(session, address: int, width: int) -> None:
    """Device memory of this guest, or its device-mapped pinned memory."""
    if session.host_maps.find(address, width) is not None:
        if session.graphs.origins:  # a capture under way may take it in
            checks.graph_reaches(session, address)
        return
    checks.device_range(session, address, width, "stream memory operation's address")


def _memop(session, hdr, stream, flags, call, count, raw) -> tuple:
    s = checks.stream(session, stream)
    if call not in _CALLS:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"STREAM_MEMOP call {call}")
    one = call in (P.MEMOP_ONE, P.MEMOP_ONE_V1)
    if not 0 < count <= (1 if one else P.MAX_MEMOPS):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{count} memory operations (1 to {1 if one else P.MAX_MEMOPS})")
    if len(raw) != count * P.MEMOP_SIZE:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{count} memory operations take "
                        f"{count * P.MEMOP_SIZE} bytes, not {len(raw)}")
    if one and flags:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "a single memory operation has no "
                        "batch flags")
    ops = []
    for operation, op_flags, address, value in _RECORD.iter_unpack(raw):
        width = _WIDTH.get(operation)
        if width is None and (one or operation not in (_FLUSH, _BARRIER)):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"no memory operation {operation}")
        if width is not None:
            _address(session, address, width)
            if width == 4 and value >> 32:
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                                f"a 32-bit memory operation's value {value:#x}")
        else:
            address = value = 0  # a flush or barrier names no memory
        ops.append((operation, op_flags, address, value))
    return s, call, ops, flags


@declare("STREAM_MEMOP", check=_memop)
def stream_memop(session, hdr, s, call, ops, flags):
    session.device.stream_memops(s, call, ops, flags)
