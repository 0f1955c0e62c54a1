"""The C loop of one-way frames keeps every rule of the Python path.

A guest may only use its own streams, events and functions, and only touch
device memory inside its own allocations (or module variables it looked up);
malformed frames are refused. Besides the frames below, each field check the
executor's op table declares for an op the C loop serves (``fields=``) gets frames
that fail it. Each hostile frame is sent between two good launches, with the session's C loop and, for reference, with the Python
path alone: both must refuse it with the same status, name the same frame at
the next sync, leave the other guest's memory as it was, and go on serving.
"""

from __future__ import annotations

import struct

import pytest

from hvgpu.host.executor import ops
from hvgpu.host.executor.launch_burst import SERVED_OPS, unavailable_reason
from hvgpu.host.executor.ops import fields as F
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
NOOP = 'extern "C" __global__ void noop() {}'
SIZE = 4096
INVALID_VALUE, INVALID_HANDLE = P.CUDA_ERROR_INVALID_VALUE, P.CUDA_ERROR_INVALID_HANDLE


class PythonOnly(FakeDevice):
    def driver_entries(self):
        return {}


def attr(ident):
    return struct.pack("<I4x", ident) + b"\0" * 64


class Tenant:
    """A guest with a buffer, two kernels, a stream and an event; ``extra_handles`` of
    each kind made first give it handle numbers another tenant does not have."""

    def __init__(self, device, extra_handles=0):
        self.g = g = SessionGuest(device)
        module = g.ok("MODULE_COMPILE", "k.cu", "", payload=(SAXPY + NOOP).encode())[0]
        for _ in range(extra_handles):
            g.ok("MODULE_GET_FUNCTION", module, "noop")
            g.ok("STREAM_CREATE", 1)
            g.ok("EVENT_CREATE", 2)
        self.mem = g.ok("MEM_ALLOC", SIZE)
        self.saxpy = g.ok("MODULE_GET_FUNCTION", module, "saxpy")
        self.noop = g.ok("MODULE_GET_FUNCTION", module, "noop")
        for fn in (self.saxpy, self.noop):
            g.ok("FUNC_GET_PARAM_INFO", fn)
        self.stream = g.ok("STREAM_CREATE", 1)
        self.event = g.ok("EVENT_CREATE", 2)
        g.ok("MEMCPY_HTOD", self.mem, 0, payload=CONTENT)

    def launch(self):
        params = struct.pack("<f4xQQi", 1.0, self.mem, self.mem + 64, 4)
        return self.g.oneway("LAUNCH_KERNEL", self.saxpy, 1, 1, 1, 4, 1, 1, 0, self.stream,
                             params)

    def gone(self, kind):
        """A handle or allocation of this guest's that it has just let go of."""
        g = self.g
        if kind == "memory":
            ptr = g.ok("MEM_ALLOC", 256)
            g.ok("MEM_FREE", ptr)
            return ptr
        if kind == "function":
            module = g.ok("MODULE_COMPILE", "n.cu", "", payload=NOOP.encode())[0]
            fn = g.ok("MODULE_GET_FUNCTION", module, "noop")
            g.ok("FUNC_GET_PARAM_INFO", fn)
            g.ok("MODULE_UNLOAD", module)
            return fn
        handle = g.ok(f"{kind.upper()}_CREATE", 0)
        g.ok(f"{kind.upper()}_DESTROY", handle)
        return handle

    def raw(self, op, body, payload=b""):
        """A one-way frame with this body, whatever its op's fields say."""
        self.g.seq += 1
        return pack_header(P.OP[op], P.FLAG_ONEWAY, self.g.seq, 0, len(body),
                           len(payload)) + body + payload


CONTENT = bytes(range(256)) * (SIZE // 256)
EX_FIXED = codec.REQUEST[P.OP["LAUNCH_KERNEL_EX"]].fixed


def ex(me, stream=0, attrs=b""):
    return me.g.oneway("LAUNCH_KERNEL_EX", me.noop, 1, 1, 1, 1, 1, 1, 0, stream, b"", attrs)


# what the attacker sends, given itself and its victim -> the status it earns
CASES = {
    "the victim's event, recorded": (
        lambda me, v: me.g.oneway("EVENT_RECORD", v.event, 0), INVALID_HANDLE),
    "the victim's stream, waiting": (
        lambda me, v: me.g.oneway("STREAM_WAIT_EVENT", v.stream, me.event, 0), INVALID_HANDLE),
    "the victim's event, waited on": (
        lambda me, v: me.g.oneway("STREAM_WAIT_EVENT", 0, v.event, 0), INVALID_HANDLE),
    "the victim's function, launched": (
        lambda me, v: me.g.oneway("LAUNCH_KERNEL", v.noop, 1, 1, 1, 1, 1, 1, 0, 0, b""),
        INVALID_HANDLE),
    "the victim's function, launched with attributes": (
        lambda me, v: me.g.oneway("LAUNCH_KERNEL_EX", v.noop, 1, 1, 1, 1, 1, 1, 0, 0, b"",
                                  attr(8)), INVALID_HANDLE),
    "the victim's stream, launched on with attributes": (
        lambda me, v: ex(me, v.stream, attr(8)), INVALID_HANDLE),
    "the victim's stream, memset on": (
        lambda me, v: me.g.oneway("MEMSET", me.mem, 16, 0, 1, v.stream), INVALID_HANDLE),
    "a memset of the victim's memory": (
        lambda me, v: me.g.oneway("MEMSET", v.mem, 16, 0, 1, 0), INVALID_VALUE),
    "a 4-byte memset past its own allocation": (
        lambda me, v: me.g.oneway("MEMSET", me.mem + SIZE - 8, 3, 0, 4, 0), INVALID_VALUE),
    "a memset whose size wraps around": (
        lambda me, v: me.g.oneway("MEMSET", me.mem, 1 << 62, 0, 4, 0), INVALID_VALUE),
    "a copy out of the victim's memory": (
        lambda me, v: me.g.oneway("MEMCPY_DTOD", me.mem, v.mem, 64, 0), INVALID_VALUE),
    "a copy into the victim's memory": (
        lambda me, v: me.g.oneway("MEMCPY_DTOD", v.mem, me.mem, 64, 0), INVALID_VALUE),
    "a copy whose end wraps around": (
        lambda me, v: me.g.oneway("MEMCPY_DTOD", me.mem + 8, me.mem, (1 << 64) - 4, 0),
        INVALID_VALUE),
    "host bytes into the victim's memory": (
        lambda me, v: me.g.oneway("MEMCPY_HTOD", v.mem, 0, payload=b"\xff" * 64),
        INVALID_VALUE),
    "host bytes running past its own allocation": (
        lambda me, v: me.g.oneway("MEMCPY_HTOD", me.mem + SIZE - 32, 0, payload=b"\xff" * 64),
        INVALID_VALUE),
    "host bytes on the victim's stream": (
        lambda me, v: me.g.oneway("MEMCPY_HTOD", me.mem, v.stream, payload=b"\xff" * 64),
        INVALID_HANDLE),
    "its own freed memory, memset": (
        lambda me, v: me.g.oneway("MEMSET", me.gone("memory"), 16, 0, 1, 0), INVALID_VALUE),
    "its own freed memory, copied to": (
        lambda me, v: me.g.oneway("MEMCPY_HTOD", me.gone("memory"), 0, payload=b"x" * 16),
        INVALID_VALUE),
    "its own destroyed event, recorded": (
        lambda me, v: me.g.oneway("EVENT_RECORD", me.gone("event"), 0), INVALID_HANDLE),
    "its own destroyed stream, waiting": (
        lambda me, v: me.g.oneway("STREAM_WAIT_EVENT", me.gone("stream"), me.event, 0),
        INVALID_HANDLE),
    "a function of its unloaded module": (
        lambda me, v: me.g.oneway("LAUNCH_KERNEL", me.gone("function"), 1, 1, 1, 1, 1, 1, 0, 0,
                                  b""), INVALID_HANDLE),
    "a memset width of 3": (
        lambda me, v: me.g.oneway("MEMSET", me.mem, 4, 0, 3, 0), INVALID_VALUE),
    "a parameter buffer of the wrong size": (
        lambda me, v: me.g.oneway("LAUNCH_KERNEL", me.saxpy, 1, 1, 1, 1, 1, 1, 0, 0,
                                  b"\0" * 24), INVALID_VALUE),
    "a truncated launch": (lambda me, v: me.raw("LAUNCH_KERNEL", b"\0" * 44), P.HV_BAD_FRAME),
    "a truncated event record": (
        lambda me, v: me.raw("EVENT_RECORD", struct.pack("<Q", me.event)), P.HV_BAD_FRAME),
    "a memset with a trailing byte": (
        lambda me, v: me.raw("MEMSET", struct.pack("<QQIIQB", me.mem, 4, 0, 1, 0, 0)),
        P.HV_BAD_FRAME),
    "attributes that are not whole": (lambda me, v: ex(me, 0, attr(8)[:70]), INVALID_VALUE),
    "an attribute naming an event": (
        lambda me, v: ex(me, 0, attr(8) + attr(12)), P.CUDA_ERROR_NOT_SUPPORTED),
    "an attribute count no launch has": (
        lambda me, v: ex(me, 0, attr(8) * 40 + attr(7)), P.CUDA_ERROR_NOT_SUPPORTED),
    "attributes claimed past the body": (
        lambda me, v: me.raw("LAUNCH_KERNEL_EX", EX_FIXED.pack(
            me.noop, 1, 1, 1, 1, 1, 1, 0, 0, 0, 144) + attr(8)), P.HV_BAD_FRAME),
    "an event record with a payload": (
        lambda me, v: me.raw("EVENT_RECORD", struct.pack("<QQ", me.event, 0), b"x" * 8),
        P.HV_BAD_FRAME),
}


# -- one hostile frame per field check the op table declares for the C loop's ops -----
# Each served op's good frame (given the attacker), and for each kind of field check
# the values of its field that fail it (given the attacker, the victim, the check and
# the good fields) with the status they earn: the C loop applies the check from the
# table cgen generated, the Python path the check derived from the same declaration.

def good_fields(me, name) -> tuple[dict, bytes]:
    return {
        "MEMCPY_HTOD": (dict(dst=me.mem, stream=me.stream), b"\xff" * 64),
        "MEMCPY_DTOD": (dict(dst=me.mem, src=me.mem + SIZE // 2, size=64, stream=me.stream), b""),
        "MEMSET": (dict(dst=me.mem, count=16, value=0, width=4, stream=me.stream), b""),
        "LAUNCH_KERNEL": (dict(function=me.noop, stream=me.stream, params=b""), b""),
        "LAUNCH_KERNEL_EX": (dict(function=me.noop, stream=me.stream, params=b"",
                                  attrs=attr(8)), b""),
        "STREAM_WAIT_EVENT": (dict(stream=me.stream, event=me.event, flags=0), b""),
        "EVENT_RECORD": (dict(event=me.event, stream=me.stream), b""),
    }[name]


def _past_own_end(me, v, check, fields, payload):
    n = len(payload) if check.size == F.PAYLOAD else fields[check.size]
    return me.mem + SIZE - n * (fields[check.times] if check.times else 1) + 1


FAILING = {  # kind -> [(what, value of the field that fails it, status)]
    "function": [("the victim's", lambda me, v, c, f, p: v.noop, INVALID_HANDLE),
                 ("a gone", lambda me, v, c, f, p: me.gone("function"), INVALID_HANDLE)],
    "stream": [("the victim's", lambda me, v, c, f, p: v.stream, INVALID_HANDLE),
               ("a destroyed", lambda me, v, c, f, p: me.gone("stream"), INVALID_HANDLE)],
    "event": [("the victim's", lambda me, v, c, f, p: v.event, INVALID_HANDLE),
              ("a destroyed", lambda me, v, c, f, p: me.gone("event"), INVALID_HANDLE)],
    "range": [("in the victim's memory", lambda me, v, c, f, p: v.mem, INVALID_VALUE),
              ("running a byte past its own allocation", _past_own_end, INVALID_VALUE),
              ("in freed memory", lambda me, v, c, f, p: me.gone("memory"), INVALID_VALUE)],
    "one_of": [("not allowed", lambda me, v, c, f, p: min(set(range(64)) - set(c.values)),
                INVALID_VALUE)],
    "params": [("of the wrong size", lambda me, v, c, f, p: b"\0" * (len(f[c.field]) + 8),
                INVALID_VALUE)],
    "attrs": [("not whole", lambda me, v, c, f, p: attr(8)[:70], INVALID_VALUE),
              ("naming an event", lambda me, v, c, f, p: attr(8) + attr(
                  P.LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT), P.CUDA_ERROR_NOT_SUPPORTED)],
}


def _failing_frame(name, check, fail):
    def hostile(me, victim):
        fields, payload = good_fields(me, name)
        fields = dict(fields)
        fields[check.field] = fail(me, victim, check, fields, payload)
        values = [fields.get(n, 1 if n.startswith(("grid_", "block_")) else 0)
                  for n in codec.REQUEST[P.OP[name]].names]
        return me.g.oneway(name, *values, payload=payload)
    return hostile


DECLARED = {}  # case -> (op, check kind)
for _name in SERVED_OPS:
    for _check in ops.TABLE[P.OP[_name]].fields:
        for _what, _fail, _status in FAILING[_check.kind]:
            _case = f"{_name}: {_check.field} ({_check.kind}) {_what}"
            CASES[_case] = (_failing_frame(_name, _check, _fail), _status)
            DECLARED[_case] = (_name, _check.kind)


def test_every_field_check_the_table_declares_for_the_c_loop_has_hostile_frames():
    declared = {(name, check.kind, check.field) for name in SERVED_OPS
                for check in ops.TABLE[P.OP[name]].fields}
    assert declared and set(FAILING) == set(F.KINDS)
    assert {kind for _, kind, _ in declared} == set(F.KINDS)  # each kind is exercised
    assert {(name, kind) for name, kind, _ in declared} == set(DECLARED.values())


def attempt(device):
    """For each case, on one device: (the error at the next sync, the victim's memory
    after, the ops the attacker's Python path read)."""
    victim = Tenant(device, extra_handles=3)
    out = {}
    for case, (hostile, _) in CASES.items():
        victim.g.ok("MEMCPY_HTOD", victim.mem, 0, payload=CONTENT)
        me = Tenant(device)
        bad = hostile(me, victim)
        me.g.python_ops.clear()
        me.g.send(me.launch(), bad, me.launch())
        error = me.g.call("PING")
        me.g.ok("PING")  # and it goes on
        out[case] = (error, victim.g.ok("MEMCPY_DTOH", victim.mem, SIZE, 0),
                     me.g.python_ops, struct.unpack_from("<4xH2xI", bad))
        me.g.close()
    victim.g.close()
    return out


@pytest.fixture(scope="module")
def refusals():
    return attempt(FakeDevice()), attempt(PythonOnly())


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_frame_in_a_run_is_refused_as_the_python_path_refuses_it(refusals, case):
    (error, memory, python_ops, (op, seq)), reference = refusals[0][case], refusals[1][case]
    assert error == reference[0]  # status, frame named and message: the Python path's own
    assert (error[0], *error[1][:2]) == (CASES[case][1], op, seq)
    assert memory == reference[1] == CONTENT  # the victim's memory as it was
    # the loop served the good launches around it and left the hostile frame to Python
    assert python_ops == [op, P.OP["PING"], P.OP["PING"]]
