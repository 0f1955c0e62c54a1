"""An op's field checks as data: which request field names what, and how it is judged.

An op declared with ``fields=`` (``table.Family.declare``) says of its request's
fields, in the order they are judged, which is

- :func:`function`: a function of this guest's (resolved with its parameters' size);
- :func:`stream`, :func:`event`: a stream or an event of this guest's;
- :func:`device_range`: a device address whose range (a size field, times another,
  or the frame's payload) lies inside an allocation of this guest's;
- :func:`one_of`: a value among a few;
- :func:`params`: a kernel parameter buffer of the size the op's function takes;
- :func:`attrs`: launch attributes, whole and naming no event;
- :func:`ipc_allocation`, :func:`ipc_token`, :func:`ipc_opened`, :func:`ipc_event`,
  :func:`vmm_handle`:
  what CUDA IPC among one VM's processes names (``HOST_KINDS``: checked here only,
  the C loop serves no op that has them).

From that one description :func:`derive` makes the op's Python check (the error
statuses and messages of ``checks``), and ``hvgpu.virtio.cgen`` makes the C
launch loop's table of the same checks (launch_burst.h), for the ops declared
``burst=``: so the two cannot drift. What the Python check does besides, for a
capture under way (noting what a graph may reach, refusing a pageable copy on a
capturing stream), the C loop never needs: it does not run while one is.

Must not call the driver but to look things up (through ``checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hvgpu.errors import CudaError, ProtocolError
from hvgpu.host.executor.ops import checks
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P

KINDS = {  # each kind of check, as the C loop's header says it
    "function": "a function handle of this guest's",
    "stream": "a stream handle of this guest's",
    "event": "an event handle of this guest's",
    "range": "a device address: its range lies inside an allocation of this guest's",
    "one_of": "a value among those allowed",
    "params": "a parameter buffer's length: the size the op's function takes",
    "attrs": "launch attributes' length: whole records, none naming an event"}
# Kinds only the Python path checks: an op that has one is never served by the C loop.
HOST_KINDS = {
    "ipc_allocation": "a device address inside a cuMemAlloc allocation of this guest's",
    "ipc_token": "an IPC handle: IPC_HANDLE_SIZE bytes naming a live export of this executor, "
                 "made by another connection",
    "ipc_opened": "the base of memory this connection opened from an IPC handle",
    "ipc_event": "an event of this guest's made with CU_EVENT_INTERPROCESS and "
                 "CU_EVENT_DISABLE_TIMING",
    "vmm_handle": "a memory allocation handle of this guest's (cuMemCreate, or imported)"}
PAYLOAD = "payload"  # device_range's size: the frame's payload length
_HANDLE_TYPES = ("u64",)
_SCALARS = ("u8", "u16", "u32", "u64", "i32")


@dataclass(frozen=True)
class FieldCheck:
    kind: str
    field: str
    size: str | None = None  # range: the field holding its size, or PAYLOAD
    times: str | None = None  # range: the field its size is multiplied by
    what: str = ""  # range: how an error names it
    values: tuple[int, ...] = ()  # one_of
    capture: str = ""  # stream: refused while capturing, named so
    own: bool = False  # ipc_token: the connection that exported it may open it too


def function(field: str) -> FieldCheck:
    return FieldCheck("function", field)


def stream(field: str, *, capture: str = "") -> FieldCheck:
    """``capture``: what the op is, where a capturing stream cannot take it."""
    return FieldCheck("stream", field, capture=capture)


def event(field: str) -> FieldCheck:
    return FieldCheck("event", field)


def device_range(field: str, size: str, *, what: str, times: str | None = None) -> FieldCheck:
    return FieldCheck("range", field, size=size, times=times, what=what)


def one_of(field: str, values: tuple[int, ...]) -> FieldCheck:
    return FieldCheck("one_of", field, values=tuple(values))


def params(field: str) -> FieldCheck:
    return FieldCheck("params", field)


def attrs(field: str) -> FieldCheck:
    return FieldCheck("attrs", field)


def ipc_allocation(field: str) -> FieldCheck:
    return FieldCheck("ipc_allocation", field)


def ipc_token(field: str, *, what: str, own: bool = False) -> FieldCheck:
    """``what``: the kind of export it must name (ipc.MEMORY, ipc.EVENT, ipc.VMM, ipc.POOL,
    ipc.POINTER);
    ``own``: the exporting connection may open it too (as a shareable handle may be
    imported in the process that exported it)."""
    return FieldCheck("ipc_token", field, what=what, own=own)


def vmm_handle(field: str) -> FieldCheck:
    return FieldCheck("vmm_handle", field)


def ipc_opened(field: str) -> FieldCheck:
    return FieldCheck("ipc_opened", field)


def ipc_event(field: str) -> FieldCheck:
    return FieldCheck("ipc_event", field)


def validate(name: str, fields: tuple[FieldCheck, ...], *, raw: bool = False) -> None:
    """Refuse a description the request's fields do not bear out (at declaration)."""
    op = P.OPS_BY_NAME[name]
    types = dict(op.request)
    seen: set[str] = set()
    for check in fields:
        if check.kind not in KINDS and check.kind not in HOST_KINDS:
            raise ValueError(f"{name}: no field check {check.kind!r}")
        typ = types.get(check.field)
        if typ is None:
            raise ValueError(f"{name}: no request field {check.field!r}")
        if check.kind in ("params", "attrs", "ipc_token"):
            if typ != "bytes":
                raise ValueError(f"{name}: {check.field} is {typ}, not bytes")
        elif check.kind in ("function", "stream", "event", "range", "ipc_allocation",
                            "ipc_opened", "ipc_event", "vmm_handle"):
            if typ not in _HANDLE_TYPES:
                raise ValueError(f"{name}: {check.field} is {typ}, not u64")
        elif typ not in _SCALARS:
            raise ValueError(f"{name}: {check.field} is {typ}, not a number")
        if check.kind in ("function", "stream", "event", "params", "attrs"):
            if check.kind in seen:  # the C loop keeps one of each per frame
                raise ValueError(f"{name}: two {check.kind} checks")
            seen.add(check.kind)
        if check.kind == "params" and "function" not in seen:
            raise ValueError(f"{name}: params checked before the function they belong to")
        if check.kind == "range":
            if check.size == PAYLOAD:
                if not op.request_payload:
                    raise ValueError(f"{name}: a range of the payload, but it takes none")
            elif types.get(check.size) not in _SCALARS:
                raise ValueError(f"{name}: no size field {check.size!r}")
            if check.times is not None and types.get(check.times) not in _SCALARS:
                raise ValueError(f"{name}: no multiplier field {check.times!r}")
            if not check.what:
                raise ValueError(f"{name}: a range must say what it is")
        if check.kind == "ipc_token" and check.what not in ("memory", "event", "vmm", "pool",
                                                            "pool pointer"):
            raise ValueError(f"{name}: an IPC token names memory, an event, VMM memory, a "
                             "pool or a pool allocation")
        if check.kind == "one_of" and not all(0 <= v < 64 for v in check.values):
            raise ValueError(f"{name}: one_of values must lie in [0, 64)")
    if raw and any(typ == "str" for _, typ in op.request):
        raise ValueError(f"{name}: a raw op cannot decode strings in place")


# -- the Python check --------------------------------------------------------------


def _one_of_message(name: str, check: FieldCheck) -> Callable[[int], str]:
    shown = [str(v) for v in check.values]
    allowed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
    prefix = f"{name.lower()} {check.field}"
    return lambda value: f"{prefix} {value} is not {allowed}"


def _steps(name: str, fields: tuple[FieldCheck, ...]) -> list[Callable]:
    """One step(session, hdr, values) per check, judging values (a list) in place."""
    index = {field: i for i, field in enumerate(codec.REQUEST[P.OP[name]].names)}
    params_at = next((index[c.field] for c in fields if c.kind == "params"), None)
    steps = []
    for check in fields:
        at = index[check.field]
        if check.kind == "function" and params_at is not None:
            def step(session, hdr, values, at=at):
                # its lookup and its parameters' size, as a launch has always judged them
                values[at] = checks.launch_params(session, values[at], values[params_at])
        elif check.kind == "function":
            def step(session, hdr, values, at=at):
                values[at] = checks.function(session, values[at])
        elif check.kind == "params":
            def step(session, hdr, values, at=at):
                if session.graphs.origins:  # a capture under way may take the launch in
                    checks.graph_reads_params(session, values[at])
        elif check.kind == "stream" and check.capture:
            def step(session, hdr, values, at=at, what=check.capture):
                s = values[at] = checks.stream(session, values[at])
                session.graphs.refuse_if_capturing(s, what)
        elif check.kind == "stream":
            def step(session, hdr, values, at=at):
                values[at] = checks.stream(session, values[at])
        elif check.kind == "event":
            def step(session, hdr, values, at=at):
                session.graphs.event_used(values[at])  # a capture under way may take it in
                values[at] = checks.event(session, values[at])
        elif check.kind == "range":
            size = None if check.size == PAYLOAD else index[check.size]
            times = None if check.times is None else index[check.times]

            def step(session, hdr, values, at=at, size=size, times=times, what=check.what):
                n = hdr.payload_len if size is None else values[size]
                if times is not None:
                    n *= values[times]
                checks.device_range(session, values[at], n, what)
        elif check.kind == "one_of":
            allowed, message = frozenset(check.values), _one_of_message(name, check)

            def step(session, hdr, values, at=at, allowed=allowed, message=message):
                if values[at] not in allowed:
                    raise CudaError(P.CUDA_ERROR_INVALID_VALUE, message(values[at]))
        elif check.kind == "attrs":
            def step(session, hdr, values, at=at):
                launch_attrs(values[at])
        elif check.kind == "ipc_allocation":
            def step(session, hdr, values, at=at):
                values[at] = checks.ipc_allocation(session, values[at])
        elif check.kind == "ipc_token":
            def step(session, hdr, values, at=at, what=check.what, own=check.own):
                values[at] = checks.ipc_token(session, values[at], what, own=own)
        elif check.kind == "vmm_handle":
            def step(session, hdr, values, at=at):
                session.vmm.handle_size(values[at])  # CUDA_ERROR_INVALID_HANDLE if not
        elif check.kind == "ipc_opened":
            def step(session, hdr, values, at=at):
                values[at] = checks.ipc_opened(session, values[at])
        else:  # ipc_event
            def step(session, hdr, values, at=at):
                values[at] = checks.ipc_event(session, values[at])
        steps.append(step)
    return steps


def launch_attrs(attrs) -> None:
    """Whole CUlaunchAttribute records, none naming an event (those hold guest handles)."""
    size = P.LAUNCH_ATTR_SIZE
    if len(attrs) % size:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{len(attrs)} bytes of launch attributes is not a whole number")
    for i in range(0, len(attrs), size):
        if int.from_bytes(attrs[i:i + 4], "little") in P.LAUNCH_EVENT_ATTRS:
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, "launch attributes naming events")


def _views(fields: codec.FieldCodec) -> Callable:
    """fields.decode, its variable fields left as views of the body (no copy): the
    session hands the body to the check before it reads the next frame."""
    fixed, size, names = fields.fixed, fields.fixed.size, fields.names
    variable = fields.var_index

    def decode(body) -> list:
        if len(body) < size:
            raise ProtocolError(f"body of {len(body)} bytes is shorter than the "
                                f"{size} its fields need", code="bad-frame")
        values = list(fixed.unpack_from(body))
        pos = size
        for i in variable:
            n = values[i]
            if pos + n > len(body):
                raise ProtocolError(f"field {names[i]!r} claims {n} bytes past "
                                    "the end of the body", code="bad-frame")
            values[i] = body[pos:pos + n]
            pos += n
        if pos != len(body):
            raise ProtocolError(f"body has {len(body) - pos} trailing bytes", code="bad-frame")
        return values
    return decode


def derive(name: str, fields: tuple[FieldCheck, ...], *, raw: bool = False) -> Callable:
    """The op's Python check from its field checks: ``check(session, hdr, *fields)``
    (``raw``: ``check(session, hdr, body)``, decoding it in place), returning the
    fields with each handle replaced by the object it names."""
    validate(name, fields, raw=raw)
    steps = tuple(_steps(name, fields))
    if raw:
        decode = _views(codec.REQUEST[P.OP[name]])

        def check(session, hdr, body) -> list:
            values = decode(body)
            for step in steps:
                step(session, hdr, values)
            return values
    else:
        def check(session, hdr, *fields) -> list:
            values = list(fields)
            for step in steps:
                step(session, hdr, values)
            return values
    check.fields = fields
    return check
