"""Ops that ask about the device, the slice and the VM's processes (monitoring).

The guest's device is its slice: its total memory is the slice's quota, and a
connection serves one vGPU, its device 0. Nothing here takes memory or changes
what the guest holds, but a context limit (cuCtxSetLimit), whose reservation is
charged as measured.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from typing import Any

from hvgpu.errors import CudaError
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, quietly
from hvgpu.host.executor.ops.table import MEASURED, Family
from hvgpu.virtio import protocol as P

FAMILY = Family("device and monitoring")
declare = FAMILY.declare
_MAX_ATTRIBUTES = P.MAX_DEVICE_ATTRIBUTES  # DEVICE_GET_ATTRIBUTES answers at most this many


def _handshake_again(session, hdr, *fields) -> tuple:
    raise CudaError(P.HV_HANDSHAKE, "HELLO was already done on this connection")


@declare("HELLO", check=_handshake_again)
def hello(session, hdr, *fields):
    return ()  # never reached: the session's handshake serves the one HELLO


@declare("PING")
def ping(session, hdr):
    return ()


@declare("DRIVER_GET_VERSION")
def driver_get_version(session, hdr):
    return (session.device.driver_version(),)


@declare("DEVICE_GET_COUNT")
def device_get_count(session, hdr):
    return (session.vgpus(),)


def _ordinal_last(session, hdr, *fields) -> tuple:
    checks.device_ordinal(fields[-1])
    return fields


_CAN_MAP_HOST_MEMORY = 19
_UNIFIED_ADDRESSING = 41
_HOST_POINTER_FOR_REGISTERED_MEM = 91


def _as_guests_see(session, attrib: int, value: int) -> int:
    """CAN_MAP_HOST_MEMORY as the guest has it: its pinned memory reaches kernels only
    where HOST_MAP can map it at the guest's own address (a region, and a device that
    reaches registered memory at its host address under unified addressing)."""
    if attrib != _CAN_MAP_HOST_MEMORY or not value:
        return value
    try:
        return int(bool(session.executor_regions.caps
                        and session.device.attribute(_UNIFIED_ADDRESSING)
                        and session.device.attribute(_HOST_POINTER_FOR_REGISTERED_MEM)))
    except CudaError:
        return 0


@declare("DEVICE_GET_ATTRIBUTE", check=_ordinal_last)
def device_get_attribute(session, hdr, attrib, ordinal):
    return (_as_guests_see(session, attrib, session.device.attribute(attrib)),)


@declare("DEVICE_GET_NAME", check=_ordinal_last)
def device_get_name(session, hdr, ordinal):
    return (session.device.name(),)


@declare("DEVICE_GET_UUID", check=_ordinal_last)
def device_get_uuid(session, hdr, ordinal):
    return (session.device.uuid(),)


@declare("DEVICE_TOTAL_MEM", check=_ordinal_last)
def device_total_mem(session, hdr, ordinal):
    if session.quota is not None:
        return (session.quota.usage()[1],)  # the guest's device is its slice
    return (session.device.total_mem(),)


def _attributes(session, hdr, ordinal, count) -> tuple:
    checks.device_ordinal(ordinal)
    if not 0 < count <= _MAX_ATTRIBUTES:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{count} attributes asked for")
    return ordinal, count


@declare("DEVICE_GET_ATTRIBUTES", check=_attributes)
def device_get_attributes(session, hdr, ordinal, count):
    values = []
    for attrib in range(1, count + 1):
        try:
            values.append(_as_guests_see(session, attrib, session.device.attribute(attrib)))
        except CudaError:
            values.append(0)  # unknown to this driver: as a device without the feature
    return (b"".join(int(v).to_bytes(4, "little", signed=True) for v in values),)


@declare("CTX_GET_LIMIT")
def ctx_get_limit(session, hdr, limit):
    return (session.device.ctx_limit(limit),)


# A context limit is the executor context's, so the VM's programs that this executor
# serves at once share it (as threads of one process share their context's): it holds
# until the program that set it last ends, and then goes back to what it was before.
# What the driver reserves for it (a thread's stack on every resident thread, the printf
# FIFO, the malloc heap) is device memory no allocation shows: measured, as a module's
# variables are, and charged to the guest that set it.
_LIMITS: dict[tuple[int, int], tuple[Any, int]] = {}  # (device, limit) -> (setter, first value)


def _limit_set(session, limit: int, value: int) -> int:
    """Set ``limit``, charging the change in the driver's free memory; the bytes it
    took (negative: gave back)."""
    device = session.device
    with DEVICE_MEMORY.measuring():
        free_before = device.mem_info()[0]
        device.ctx_set_limit(limit, value)
        taken = free_before - device.mem_info()[0]
    return taken


@declare("CTX_SET_LIMIT", charge=MEASURED)
def ctx_set_limit(session, hdr, limit, value):
    device = session.device
    key = (id(device), limit)
    before = device.ctx_limit(limit) if 0 <= limit < _MAX_LIMIT else None
    taken = _limit_set(session, limit, value)
    held = session.limit_charges.get(limit, 0)
    if taken > 0 and session.quota is not None:
        try:
            session.ledger.charge(taken)
        except CudaError as exc:
            with DEVICE_MEMORY:
                quietly(device.ctx_set_limit, limit, before)
            raise CudaError(exc.status, f"context limit {limit} = {value} takes {taken} bytes "
                                        f"of device memory: {exc.detail}") from None
        held += taken
    elif taken < 0:
        back = min(held, -taken)
        session.ledger.uncharge(back)
        held -= back
    session.limit_charges[limit] = held
    owner = _LIMITS.get(key)
    _LIMITS[key] = (session, owner[1] if owner is not None else before)
    return (device.ctx_limit(limit),)


_MAX_LIMIT = 16  # CUlimit's values are below (cuda.h 13.0 has 10)


def release_limits(session) -> None:
    """At the end: each limit this guest set last goes back to its value before the
    first set (freeing what it reserved); its charges go with the guest's whole."""
    device = session.device
    for key, (owner, first) in list(_LIMITS.items()):
        if key[0] != id(device) or owner is not session:
            continue
        del _LIMITS[key]
        if first is not None:
            with DEVICE_MEMORY:
                quietly(device.ctx_set_limit, key[1], first)
    session.limit_charges.clear()


@declare("SLICE_INFO")
def slice_info(session, hdr):
    if session.quota is None:
        return ("", session.device.total_mem(), 0, 0)
    used, limit = session.quota.usage()
    return (session.slice_name, limit, used, session.compute)


@declare("VGPU_PROCESSES")
def vgpu_processes(session, hdr):
    rows: dict[int, list] = {}  # pid -> [name, bytes]: one row per process
    for other in session.neighbours():
        if other.monitor or other.closed or other.version == 0:
            continue
        row = rows.setdefault(other.client_pid, [other.client_name, 0])
        row[1] += max(0, other.charged)
    listed = sorted(rows.items())[:P.MAX_PROCESSES]
    return (len(listed), b"".join(pid.to_bytes(4, "little") for pid, _ in listed),
            b"".join(used.to_bytes(8, "little") for _, (_, used) in listed),
            "\0".join(name for _, (name, _) in listed))


@declare("VGPU_UTILIZATION")
def vgpu_utilization(session, hdr):
    ask = getattr(session.quota, "utilization", None)  # None: the whole GPU, no slice
    util = ask() if ask is not None else None
    return (0, 0) if util is None else (1, util)


# The L2 cache's persisting lines are the GPU's, so a reset touches the other tenants'
# too, as any context's does on a shared GPU: it changes how fast, never what, they
# compute (the lines become normal ones).
@declare("CTX_RESET_PERSISTING_L2")
def ctx_reset_persisting_l2(session, hdr):
    session.device.ctx_reset_persisting_l2()


@declare("DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH")
def device_texture_1d_linear_max_width(session, hdr, fmt, channels):
    return (session.device.texture_1d_linear_max_width(fmt, channels),)


def _atomic_operations(session, hdr, operations) -> tuple:
    if len(operations) % 4 or len(operations) > 4 * P.MAX_ATOMIC_OPERATIONS:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{len(operations)} bytes of atomic operations: u32 each, at most "
                        f"{P.MAX_ATOMIC_OPERATIONS}")
    return (bytes(operations),)


@declare("DEVICE_HOST_ATOMIC_CAPS", check=_atomic_operations)
def device_host_atomic_caps(session, hdr, operations):
    return (session.device.host_atomic_caps(operations),)
