"""The executor lane: every message between the agent and a slice's executor, once.

A slice's executor receives guest connections (their sockets passed with
SCM_RIGHTS) and orders from the agent, and asks the agent to reserve and
release memory in the slice's quota ledger. Each message is one
SOCK_SEQPACKET datagram of JSON: ``{"v": LANE_VERSION, "op": NAME, fields...}``.
The table below names every message, which way it goes, its fields with
their types and bounds, and how many file descriptors ride with it. Both
sides encode with :func:`encode` and check what they receive with
:func:`decode`, so neither can send what the table does not allow, and the
agent treats anything else from an executor (which parses guest modules and
may be compromised) as that executor's failure.

Must not do I/O (transport does) or decide anything (agent and executor do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hvgpu.errors import HvgpuError
from hvgpu.host.names import MAX_VGPUS

LANE_VERSION = 1
MAX_DATAGRAM = 8192  # every message is far smaller; a larger one is a broken peer
MAX_BYTES = 1 << 50  # no GPU has a PiB: a larger size is a broken peer
MAX_ID = (1 << 53) - 1  # exact in every JSON reader
REPLY_MESSAGE_MAX = 2048
MAX_COUNT = (1 << 53) - 1  # a counter beyond this is a broken peer (and inexact in JSON)
MAX_STATUS = (1 << 31) - 1
STATS_STATUSES_MAX = 64  # distinct statuses one STATS names; an executor keeps the commonest

TO_AGENT = "executor->agent"
TO_EXECUTOR = "agent->executor"


class LaneError(HvgpuError):
    """A message that the table does not allow."""

    code = "bad-lane-message"


@dataclass(frozen=True)
class Field:
    name: str
    type: type  # int, str, bool, or dict: counts by status ({"700": 3}, keys in lo..hi)
    lo: int = 0  # ints: the bounds, inclusive
    hi: int = MAX_BYTES
    size: int = 256  # strs: the most characters; dicts: the most entries
    optional: bool = False


@dataclass(frozen=True)
class Message:
    op: str
    direction: str
    fields: tuple = ()
    fds: int = 0  # file descriptors that must come with it
    doc: str = ""


_ID = Field("id", int, 1, MAX_ID)
_SIZE = Field("n", int, 0, MAX_BYTES)
_PEER = Field("peer", str, size=256)

CONN = Message("conn", TO_EXECUTOR, (_PEER,), fds=1,
               doc="a guest connection of this slice; its socket rides along")
RETIRE = Message("retire", TO_EXECUTOR,
                 doc="take no new connections; exit once the last one closes")
REPLY = Message("reply", TO_EXECUTOR, (
    _ID,
    Field("ok", bool, optional=True),
    Field("status", int, 1, (1 << 31) - 1, optional=True),
    Field("message", str, size=REPLY_MESSAGE_MAX, optional=True),
    Field("used", int, 0, MAX_BYTES, optional=True),
    Field("limit", int, 0, MAX_BYTES, optional=True),
    Field("count", int, 0, MAX_VGPUS, optional=True),
    # USAGE: the vGPU's GPU utilisation in percent, as NVML last gave it for its
    # executors' processes; absent where the driver gives no such figure.
    Field("util", int, 0, 100, optional=True),
), doc="the answer to the request with the same id")
RESERVE = Message("reserve", TO_AGENT, (_ID, _SIZE),
                  doc="take n bytes from the slice's quota; replied ok, or status+message")
RELEASE = Message("release", TO_AGENT, (_SIZE,), doc="give n reserved bytes back")
USAGE = Message("usage", TO_AGENT, (_ID,),
                doc="replied with used and limit, and util (the slice's GPU utilisation in "
                    "percent) where the agent knows it")
VGPUS = Message("vgpus", TO_AGENT, (_ID,), doc="replied with count: the VM's vGPUs now")
CLOSED = Message("closed", TO_AGENT, (_PEER,), doc="a guest connection ended")
POISONED = Message("poisoned", TO_AGENT, (Field("status", int, 1, (1 << 31) - 1),),
                   doc="a kernel fault poisoned this process's CUDA: retire it now")

STATS = Message("stats", TO_AGENT, (
    Field("launches", int, 0, MAX_COUNT),
    Field("round_trips", int, 0, MAX_COUNT),
    Field("to_gpu", int, 0, MAX_COUNT),
    Field("from_gpu", int, 0, MAX_COUNT),
    Field("errors", dict, 1, MAX_STATUS, size=STATS_STATUSES_MAX),
), doc="what this executor's guests did since it started: kernel launches, frames that "
       "waited for a reply, bytes copied each way, failed calls by CUDA status; totals, "
       "sent every few seconds while they change and at exit")

REGION = Message("region", TO_AGENT, (_ID,),
                 doc="open the VM's region device region; answered by REGION_FD, or "
                     "by a REPLY with status+message")
REGION_FD = Message("region_fd", TO_EXECUTOR, (_ID, Field("size", int, 1, MAX_BYTES)), fds=1,
                    doc="the VM's region file, opened read-write, size bytes long")

TABLE: dict[str, Message] = {m.op: m for m in (CONN, RETIRE, REPLY, RESERVE, RELEASE, USAGE,
                                               VGPUS, CLOSED, POISONED, STATS, REGION,
                                               REGION_FD)}
REQUESTS = (RESERVE, USAGE, VGPUS, REGION)  # those that carry an id and wait for an answer


def _check(message: Message, fields: dict) -> dict:
    known = {f.name: f for f in message.fields}
    for name in fields:
        if name not in known:
            raise LaneError(f"{message.op}: no field {name!r}")
    for f in message.fields:
        if f.name not in fields:
            if f.optional:
                continue
            raise LaneError(f"{message.op}: field {f.name!r} is missing")
        value = fields[f.name]
        if f.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LaneError(f"{message.op}: {f.name} is {value!r}, not an integer")
            if not f.lo <= value <= f.hi:
                raise LaneError(f"{message.op}: {f.name} = {value} is outside {f.lo}..{f.hi}")
        elif f.type is bool:
            if not isinstance(value, bool):
                raise LaneError(f"{message.op}: {f.name} is {value!r}, not true/false")
        elif f.type is dict:
            _check_counts(message, f, value)
        elif not isinstance(value, str) or len(value) > f.size:
            raise LaneError(f"{message.op}: {f.name} is not a text of at most {f.size} "
                            "characters")
    return fields


def _check_counts(message: Message, f: Field, value) -> None:
    """Counts by status: at most f.size entries, each a status (a decimal key in
    f.lo..f.hi, written as JSON writes an int) and a count in 0..MAX_COUNT."""
    if not isinstance(value, dict) or len(value) > f.size:
        raise LaneError(f"{message.op}: {f.name} is not an object of at most {f.size} "
                        "entries")
    for key, count in value.items():
        if not (isinstance(key, str) and 0 < len(key) <= 10 and key.isdigit()
                and key.isascii() and str(int(key)) == key and f.lo <= int(key) <= f.hi):
            raise LaneError(f"{message.op}: {f.name} has the key {str(key)[:20]!r}, not a "
                            f"status in {f.lo}..{f.hi}")
        if isinstance(count, bool) or not isinstance(count, int) \
                or not 0 <= count <= MAX_COUNT:
            raise LaneError(f"{message.op}: {f.name}[{key}] is {str(count)[:30]}, not a count "
                            f"in 0..{MAX_COUNT}")


def encode(message: Message, /, **fields) -> bytes:
    """One datagram; raises LaneError for what the table does not allow."""
    if TABLE.get(message.op) is not message:
        raise LaneError(f"{message.op!r} is not a message of the executor lane")
    _check(message, fields)
    data = json.dumps({"v": LANE_VERSION, "op": message.op, **fields}).encode()
    if len(data) > MAX_DATAGRAM:
        raise LaneError(f"{message.op}: {len(data)} bytes, more than {MAX_DATAGRAM}")
    return data


def decode(data: bytes, fds: int, direction: str) -> tuple[Message, dict]:
    """(message, fields) of one received datagram that came with ``fds`` descriptors
    and was sent ``direction``; LaneError for anything the table does not allow."""
    if len(data) > MAX_DATAGRAM:
        raise LaneError(f"a datagram of {len(data)} bytes or more (at most {MAX_DATAGRAM})")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise LaneError(f"not JSON: {data[:60]!r}") from None
    if not isinstance(doc, dict):
        raise LaneError(f"not a JSON object: {data[:60]!r}")
    version = doc.pop("v", None)
    if version != LANE_VERSION:
        raise LaneError(f"lane version {version!r}; this side speaks {LANE_VERSION}")
    op = doc.pop("op", None)
    message = TABLE.get(op) if isinstance(op, str) else None
    if message is None:
        raise LaneError(f"unknown op {op!r}"[:120])
    if message.direction != direction:
        raise LaneError(f"{op} goes {message.direction}, not {direction}")
    if fds != message.fds:
        raise LaneError(f"{op} came with {fds} file descriptor(s), not {message.fds}")
    return message, _check(message, doc)
