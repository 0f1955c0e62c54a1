"""How an op of the data lane is declared: its check, its charge and its action.

Every protocol op the executor serves is one :class:`Op` in the table
(``ops.TABLE``), declared by the module of its family with :meth:`Family.declare`:

- ``check(session, hdr, *fields)`` refuses what the guest may not do (a handle it
  does not hold, a range outside its memory, a value CUDA would refuse) before
  anything is held or any work given to the driver (it may ask the driver, as
  whether a stream is capturing), and returns the values ``act`` takes (handles
  resolved to the objects they name); or, declared as data (``fields=``, see
  ``fields.py``), the check is derived from that description;
- ``burst`` names the driver entry points with which the executor's C loop
  (launch_burst.c) serves the op, applying the same field checks from the table
  ``hvgpu.virtio.cgen`` generates from ``fields``: the ops declared so are the ones
  the C loop serves;
- ``charge`` says what the op does to the slice's quota (:class:`Charge`); where
  the charge can be made around the action (ahead of it, or a settling of the
  pools) the table makes it, so the action cannot forget it;
- ``act(session, hdr, *checked)`` does the work and returns the reply's values
  (or :data:`ALREADY_REPLIED` when it sent its reply itself).

Each op is compiled once into ``serve(session, hdr, body)``: decode, check,
charge, act, with no more calls than the work needs (the session's hot path).

Must not import CUDA, do I/O or keep state of its own: the session owns the
state, the families' modules the work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor.ops import fields as F
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P

ALREADY_REPLIED = object()  # an action that sent its own reply (a payload streamed back)


@dataclass(frozen=True)
class Charge:
    """What an op does to the slice's quota."""

    kind: str
    doc: str
    size: Callable[..., int] | None = None  # AHEAD: (session, *checked) -> bytes


NONE = Charge("none", "takes nothing from the slice's quota")
MEASURED = Charge("measured", "charged what the driver's free memory fell by while it ran "
                              "(ledger.measure, under the device-memory lock held exclusive); "
                              "undone when the quota refuses it")
BOOKS = Charge("books", "charged by the books of its family (vmm.VirtualMemory, pools.Pools), "
                        "ahead of the driver taking the memory and given back as it returns")
RELEASES = Charge("releases", "gives back what the object it destroys was charged (the "
                              "quota, or the region budget) once the driver has it "
                              "back; parked while a graph may still reach it, and given back "
                              "with the last graph")
SETTLES = Charge("settles", "a synchronisation point: after it, each pool is trimmed to its "
                            "release threshold and what it gave back is uncharged")
SETTLES_FIRST = Charge("settles first", "before it answers, each pool is trimmed to its "
                                        "release threshold and what it gave back uncharged")
REGION_MEMORY = Charge("region", "takes its size from the executor's region budget (hvgpu "
                                "attach --region), not from the device quota; given "
                                "back when it is detached")
KINDS = ("none", "ahead", "measured", "books", "releases", "settles", "settles first",
         "region")


def ahead(size: Callable[..., int]) -> Charge:
    """Charged ``size(session, *checked)`` bytes before the action, given back if the
    action fails; the action gets the amount (``charged=``) for what it makes to own."""
    return Charge("ahead", "charged before the driver is called, as much as the driver "
                           "will take; given back if the call fails", size)


def as_sent(session, hdr, *fields) -> tuple:
    """The fields need no check beyond their decoding (their kinds and bounds): they
    name nothing the guest holds, and the driver refuses values it does not take."""
    return fields


def by_books(session, hdr, *fields) -> tuple:
    """Each field names something the guest holds, which the family's books look up
    as they change and refuse when it is not there (a reservation, a mapping, a
    pool, a graph of this connection): nothing to check before."""
    return fields


@dataclass(frozen=True)
class Op:
    code: int
    check: Callable[..., tuple]
    charge: Charge
    act: Callable[..., Any]
    family: str
    raw: bool = False  # check takes the frame's body undecoded (the hot launch path)
    payload: tuple[int, str] | None = None  # the most payload bytes it takes whole, and what
    fields: tuple[F.FieldCheck, ...] = ()  # its field checks as data (check derived from them)
    burst: tuple[str, ...] = ()  # the driver entry points the C loop serves it with
    serve: Callable[..., Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "serve", _compile(self))

    @property
    def name(self) -> str:
        return P.op_name(self.code)


def _compile(op: Op) -> Callable[..., Any]:
    """decode, check, charge and act as one function of (session, hdr, body)."""
    check, act, charge = op.check, op.act, op.charge
    if op.raw:
        if charge.kind != "none":
            raise ValueError(f"{op.name}: an op that takes its body undecoded charges nothing")

        def serve(session, hdr, body):
            return act(session, hdr, *check(session, hdr, body))
        return serve
    decode = codec.REQUEST[op.code].decode
    if charge.kind == "ahead":
        size = charge.size

        def serve(session, hdr, body):
            checked = check(session, hdr, *decode(body))
            n = size(session, *checked)
            session.ledger.charge(n)
            try:
                return act(session, hdr, *checked, charged=n)
            except CudaError:
                session.ledger.uncharge(n)
                raise
    elif charge.kind == "settles":
        def serve(session, hdr, body):
            result = act(session, hdr, *check(session, hdr, *decode(body)))
            session.pools.settle()
            return result
    elif charge.kind == "settles first":
        def serve(session, hdr, body):
            checked = check(session, hdr, *decode(body))
            session.pools.settle()
            return act(session, hdr, *checked)
    elif check is as_sent or check is by_books:
        def serve(session, hdr, body):
            return act(session, hdr, *decode(body))
    else:
        def serve(session, hdr, body):
            return act(session, hdr, *check(session, hdr, *decode(body)))
    return serve


class Family:
    """The ops of one family, as its module declares them."""

    def __init__(self, name: str):
        self.name = name
        self.ops: list[Op] = []

    def declare(self, name: str, *, check: Callable[..., tuple] | None = None,
                charge: Charge = NONE, raw: bool = False,
                payload: tuple[int, str] | None = None,
                fields: tuple[F.FieldCheck, ...] = (), burst: tuple[str, ...] = ()) -> Callable:
        """``@family.declare("MEM_ALLOC", check=..., charge=...)`` on the action;
        ``fields=`` instead of ``check=`` derives the check from its field checks, and
        ``burst=`` (the driver entry points it calls) has the C loop serve it too."""
        code = P.OP[name]  # KeyError: not a protocol op
        if fields and check is not None:
            raise ValueError(f"{name}: a check is given or derived from fields, not both")
        if burst and not fields:
            raise ValueError(f"{name}: the C loop serves only ops whose checks are fields")
        if burst and any(c.kind in F.HOST_KINDS for c in fields):
            raise ValueError(f"{name}: the C loop does not make the Python path's own checks")
        if burst and P.OPS_BY_CODE[code].kind != P.ONEWAY:
            raise ValueError(f"{name}: the C loop serves one-way ops only")
        if fields:
            check = F.derive(name, tuple(fields), raw=raw)
        elif check is None:
            check = as_sent

        def register(act: Callable) -> Callable:
            if charge.kind not in KINDS:
                raise ValueError(f"{name}: no charge kind {charge.kind!r}")
            self.ops.append(Op(code, check, charge, act, self.name, raw, payload,
                               tuple(fields), tuple(burst)))
            return act

        return register


def build(*families: Family) -> dict[int, Op]:
    """The one table: each op of the families, each once."""
    table: dict[int, Op] = {}
    for family in families:
        for op in family.ops:
            if op.code in table:
                raise ValueError(f"{op.name} is declared by {table[op.code].family} and "
                                 f"{op.family}")
            table[op.code] = op
    return table
