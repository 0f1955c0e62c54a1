"""Ops that ask about the device, the slice and the VM's processes (monitoring).

The guest's device is its slice: its total memory is the slice's quota, and a
connection serves one vGPU, its device 0. Nothing here takes memory or changes
what the guest holds.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.errors import CudaError
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.table import Family
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


@declare("DEVICE_GET_ATTRIBUTE", check=_ordinal_last)
def device_get_attribute(session, hdr, attrib, ordinal):
    return (session.device.attribute(attrib),)


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
            values.append(session.device.attribute(attrib))
        except CudaError:
            values.append(0)  # unknown to this driver: as a device without the feature
    return (b"".join(int(v).to_bytes(4, "little", signed=True) for v in values),)


@declare("CTX_GET_LIMIT")
def ctx_get_limit(session, hdr, limit):
    return (session.device.ctx_limit(limit),)


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
