"""Streams, events and the synchronisations of the context, a stream or an event.

A :class:`Stream` or :class:`Event` is the driver's object under a handle of
this connection, known to the session's C loop from its creation to its
release. Destroying a stream that is capturing ends its capture, failed, as
the driver does; destroying an event a graph may record or wait for is parked
until no graph is left. A synchronisation is where the guest's frees have
been reached: each pool is settled there (``table.SETTLES``).

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

import struct

from hvgpu.errors import CudaError
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, Resource, quietly
from hvgpu.host.executor.ops.table import RELEASES, SETTLES, Family
from hvgpu.virtio import protocol as P

FAMILY = Family("streams and events")
declare = FAMILY.declare


class Stream(Resource):
    """A stream the guest created."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        super().__init__(0)
        self.obj = obj

    def release(self, session) -> None:
        session.device.stream_destroy(self.obj)
        session.streams.pop(self.handle)
        if session.burst is not None:
            session.burst.drop_stream(self.handle)


class Event(Resource):
    """An event the guest created, or opened from another process's IPC handle."""

    __slots__ = ("obj", "flags", "export")

    def __init__(self, obj, flags: int = 0, export=None):
        super().__init__(0)
        self.obj, self.flags = obj, flags
        self.export = export  # ipc.Export: exported by this guest, or opened from one

    def destroy(self, session):
        """What gives the driver's event back: destroying it, or, where it is shared
        with other processes of the VM (IPC), letting go of this guest's hold."""
        export, obj = self.export, self.obj
        if export is None:
            return lambda: session.device.event_destroy(obj)
        if export.exporter is session:  # nothing opens the token again
            return session.ipc.withdraw(export, lambda: session.device.event_destroy(obj))
        return lambda: session.ipc.let_go(export)

    def release(self, session) -> None:
        """Destroyed at once, or once no graph is left where a graph may use it."""
        handle, destroy = self.handle, self.destroy(session)
        if handle not in session.graphs.events or not session.graphs.park(
                f"event {handle}", destroy):
            destroy()
        session.graphs.events.discard(handle)
        session.events.pop(handle)
        if session.burst is not None:
            session.burst.drop_event(handle)


def add_event(session, obj, flags: int = 0, export=None) -> int:
    event = Event(obj, flags, export)
    event.handle = session.events.add(event)
    if session.burst is not None:
        session.burst.set_event(event.handle, session.device.handle_value(obj))
    return event.handle


def _add_stream(session, obj) -> int:
    stream = Stream(obj)
    stream.handle = session.streams.add(stream)
    if session.burst is not None:
        session.burst.set_stream(stream.handle, session.device.handle_value(obj))
    return stream.handle


def _stream(session, hdr, stream, *fields) -> tuple:
    return (checks.stream(session, stream), *fields)


def _event(session, hdr, event, *fields) -> tuple:
    return (checks.event(session, event), *fields)


@declare("CTX_SYNCHRONIZE", charge=SETTLES)
def ctx_synchronize(session, hdr):
    session.device.synchronize()


# -- streams ----------------------------------------------------------------------------

@declare("STREAM_CREATE")
def stream_create(session, hdr, flags):
    return (_add_stream(session, session.device.stream_create(flags)),)


@declare("STREAM_CREATE_PRIORITY")
def stream_create_priority(session, hdr, flags, priority):
    return (_add_stream(session, session.device.stream_create(flags, priority)),)


@declare("STREAM_PRIORITY_RANGE")
def stream_priority_range(session, hdr):
    return session.device.stream_priority_range()


def _own_stream(session, hdr, handle) -> tuple:
    return (session.streams.get(handle),)


# A capturing stream's capture ends with it, and what the capture parked may go with it.
@declare("STREAM_DESTROY", check=_own_stream, charge=RELEASES)
def stream_destroy(session, hdr, stream):
    if stream.handle in session.graphs.origins:  # as the driver does: its capture ends, failed
        try:
            with DEVICE_MEMORY:
                session.graphs.destroy(session.graphs.end(stream.handle, stream.obj))
        except CudaError:
            pass
    stream.release(session)


@declare("STREAM_SYNCHRONIZE", check=_stream, charge=SETTLES)
def stream_synchronize(session, hdr, s):
    session.device.stream_synchronize(s)


@declare("STREAM_QUERY", check=_stream)
def stream_query(session, hdr, s):
    if not session.device.stream_query(s):
        raise CudaError(P.CUDA_ERROR_NOT_READY)


@declare("STREAM_WAIT_EVENT", burst=("cuStreamWaitEvent",),
         fields=(F.stream("stream"), F.event("event")))
def stream_wait_event(session, hdr, s, e, flags):
    session.device.stream_wait_event(s, e, flags)


# -- stream attributes ------------------------------------------------------------------

_WINDOW = struct.Struct("<QQ")  # CUaccessPolicyWindow's base_ptr and num_bytes
_ACCESS_POLICY_WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
_PRIORITY = 8  # CU_LAUNCH_ATTRIBUTE_PRIORITY


def _stream_attr(attr: int) -> None:
    """Only the attributes cuda.h says are valid for streams: the others' values may
    name events (the executor's objects) and a stream does not take them."""
    if attr not in P.STREAM_ATTRS:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"launch attribute {attr} is not one a stream takes")


def _set_attribute(session, hdr, stream, attr, value) -> tuple:
    s = checks.stream(session, stream)
    _stream_attr(attr)
    if len(value) != P.LAUNCH_ATTR_VALUE_SIZE:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"a stream attribute's value is "
                        f"{P.LAUNCH_ATTR_VALUE_SIZE} bytes, not {len(value)}")
    if attr == _ACCESS_POLICY_WINDOW:
        # the window steers the L2 cache over memory: only over this guest's own
        base, n = _WINDOW.unpack_from(value)
        if n:
            checks.device_range(session, base, n, "access policy window")
    return s, attr, bytes(value)


@declare("STREAM_SET_ATTRIBUTE", check=_set_attribute)
def stream_set_attribute(session, hdr, s, attr, value):
    session.device.stream_set_attribute(s, attr, value)


def _get_attribute(session, hdr, stream, attr) -> tuple:
    s = checks.stream(session, stream)
    _stream_attr(attr)
    return s, attr


@declare("STREAM_GET_ATTRIBUTE", check=_get_attribute)
def stream_get_attribute(session, hdr, s, attr):
    return (session.device.stream_get_attribute(s, attr),)


def _two_streams(session, hdr, dst, src) -> tuple:
    return checks.stream(session, dst), checks.stream(session, src)


@declare("STREAM_COPY_ATTRIBUTES", check=_two_streams)
def stream_copy_attributes(session, hdr, dst, src):
    session.device.stream_copy_attributes(dst, src)


# -- events -------------------------------------------------------------------------------

@declare("EVENT_CREATE")
def event_create(session, hdr, flags):
    return (add_event(session, session.device.event_create(flags), flags),)


def _own_event(session, hdr, handle) -> tuple:
    return (session.events.get(handle),)


@declare("EVENT_DESTROY", check=_own_event)
def event_destroy(session, hdr, event):
    event.release(session)


def _ctx_event(session, hdr, event, wait) -> tuple:
    if wait not in (0, 1):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"CTX_EVENT's wait is 0 or 1, not {wait}")
    return checks.event(session, event), wait


# The executor's context is the vGPU's, which the VM's programs on it share: recording
# captures their work too, and waiting holds theirs back, as one process's contexts do.
@declare("CTX_EVENT", check=_ctx_event)
def ctx_event(session, hdr, e, wait):
    if wait:
        session.device.ctx_wait_event(e)
    else:
        session.device.ctx_record_event(e)


@declare("EVENT_RECORD", burst=("cuEventRecord",), fields=(F.event("event"), F.stream("stream")))
def event_record(session, hdr, e, s):
    session.device.event_record(e, s)


@declare("EVENT_QUERY", check=_event)
def event_query(session, hdr, e):
    if not session.device.event_query(e):
        raise CudaError(P.CUDA_ERROR_NOT_READY)


@declare("EVENT_SYNCHRONIZE", check=_event, charge=SETTLES)
def event_synchronize(session, hdr, e):
    session.device.event_synchronize(e)


def _two_events(session, hdr, start, end) -> tuple:
    return checks.event(session, start), checks.event(session, end)


@declare("EVENT_ELAPSED_TIME", check=_two_events)
def event_elapsed_time(session, hdr, start, end):
    return (session.device.event_elapsed(start, end),)


def release_all(session) -> None:
    """At the end (after what was allocated on them): events, then streams."""
    for held in list(session.events.objects.values()):
        quietly(held.destroy(session))  # shared with other processes (IPC): let go
    session.events.objects.clear()
    for held in list(session.streams.objects.values()):
        quietly(session.device.stream_destroy, held.obj)
    session.streams.objects.clear()
