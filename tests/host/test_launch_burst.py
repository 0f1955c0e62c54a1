"""The executor's C launch loop (hvgpu/host/executor/launch_burst.c), driven directly.

A ctypes function with cuLaunchKernel's signature stands in for libcuda and
records what it is asked to launch.
"""

from __future__ import annotations

import ctypes
import struct

import pytest

from hvgpu.host.executor.launch_burst import LaunchBurst, unavailable_reason
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")

LAUNCH = P.OP["LAUNCH_KERNEL"]
ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


class Recorder:
    def __init__(self, fail_on=None):
        self.calls = []
        self.fail_on = fail_on or {}  # function value -> CUresult

        def entry(fn, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra):
            params = b""
            if extra:
                assert (extra[0], extra[2], extra[4]) == (1, 2, None)
                params = ctypes.string_at(extra[1], ctypes.c_size_t.from_address(extra[3]).value)
            self.calls.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream or 0, params))
            return self.fail_on.get(fn, 0)

        self.entry = ENTRY(entry)
        self.burst = LaunchBurst(ctypes.cast(self.entry, ctypes.c_void_p).value)
        self.burst.set_stream(0, 0)


def launch_frame(function, params=b"", stream=0, seq=1, grid=(1, 1, 1), block=(32, 1, 1),
                 flags=P.FLAG_ONEWAY, version=P.VERSION):
    body = codec.REQUEST[LAUNCH].encode((function, *grid, *block, 0, stream, params))
    head = bytearray(pack_header(LAUNCH, flags, seq, 0, len(body)))
    head[2] = version
    return bytes(head) + body


def run(rec, data: bytes, version=P.VERSION):
    buf = bytearray(len(data) + 64)
    buf[7:7 + len(data)] = data
    return rec.burst.run(buf, 7, 7 + len(data), version, P.MAX_BODY)


def test_a_run_of_launches_reaches_the_driver_in_order_with_its_parameters():
    rec = Recorder()
    rec.burst.set_function(16, 0x1000, 12)
    rec.burst.set_stream(17, 0xBEEF)
    frames = b"".join(launch_frame(16, struct.pack("<iQ", i, 0xDEAD), stream=17 if i % 2 else 0,
                                   seq=i, grid=(i + 1, 2, 3), block=(64, 1, 1))
                      for i in range(500))
    consumed, launched, status, _ = run(rec, frames)
    assert (consumed, launched, status) == (len(frames), 500, 0)
    assert rec.calls[3] == (0x1000, (4, 2, 3), (64, 1, 1), 0, 0xBEEF, struct.pack("<iQ", 3, 0xDEAD))
    assert [struct.unpack("<iQ", c[5])[0] for c in rec.calls] == list(range(500))


def test_kernels_without_parameters_get_no_buffer():
    rec = Recorder()
    rec.burst.set_function(16, 0x1000, 0)
    run(rec, launch_frame(16))
    assert rec.calls == [(0x1000, (1, 1, 1), (32, 1, 1), 0, 0, b"")]


@pytest.mark.parametrize("why, frame", [
    ("unknown function", launch_frame(99, b"\0" * 4)),
    ("unknown stream", launch_frame(16, b"\0" * 4, stream=55)),
    ("wrong parameter size", launch_frame(16, b"\0" * 8)),
    ("a synchronous launch", launch_frame(16, b"\0" * 4, flags=0)),
    ("another protocol version", launch_frame(16, b"\0" * 4, version=P.VERSION + 1)),
    ("another op", pack_header(P.OP["PING"], 0, 1, 0, 0)),
    ("bad magic", b"XX" + launch_frame(16, b"\0" * 4)[2:]),
    ("a launch carrying payload", pack_header(LAUNCH, P.FLAG_ONEWAY, 1, 0, 52, 8)
     + launch_frame(16, b"\0" * 4)[32:]),
    ("params length not matching the body",
     launch_frame(16, b"\0" * 4)[:76] + struct.pack("<I", 8) + b"\0" * 4),
    ("an incomplete frame", launch_frame(16, b"\0" * 4)[:-1]),
    ("an incomplete header", launch_frame(16, b"\0" * 4)[:20]),
])
def test_it_stops_before_any_frame_the_python_path_must_judge(why, frame):
    rec = Recorder()
    rec.burst.set_function(16, 0x1000, 4)
    good = launch_frame(16, b"\1\0\0\0")
    after = b"" if why.startswith("an incomplete") else good
    consumed, launched, status, _ = run(rec, good * 2 + frame + after)
    assert (consumed, launched, status) == (len(good) * 2, 2, 0), why
    assert len(rec.calls) == 2


def test_a_failed_launch_stops_the_run_and_names_its_frame():
    rec = Recorder(fail_on={0x2000: 700})
    rec.burst.set_function(16, 0x1000, 0)
    rec.burst.set_function(17, 0x2000, 0)
    good, bad = launch_frame(16, seq=1), launch_frame(17, seq=2)
    consumed, launched, status, seq = run(rec, good + bad + good)
    assert (consumed, launched, status, seq) == (len(good) * 2, 1, 700, 2)
    assert len(rec.calls) == 2  # the frame after the failure is left for the next run


def test_handles_forgotten_after_unload_or_destroy_are_refused_and_the_rest_kept():
    rec = Recorder()
    for h in range(16, 1016):  # enough to grow the tables several times
        rec.burst.set_function(h, 0x1000 + h, 0)
        rec.burst.set_stream(h, 0x9000 + h)
    for h in range(16, 1016, 3):
        rec.burst.drop_function(h)
        rec.burst.drop_stream(h)
    for h in range(16, 1016):
        consumed, launched, _, _ = run(rec, launch_frame(h, stream=h))
        assert launched == (0 if (h - 16) % 3 == 0 else 1), h
    assert {c[0] - 0x1000 for c in rec.calls} == {h for h in range(16, 1016) if (h - 16) % 3}
    assert all(c[4] - 0x9000 == c[0] - 0x1000 for c in rec.calls)


def test_a_function_set_again_takes_the_new_value():
    rec = Recorder()
    rec.burst.set_function(16, 0x1000, 0)
    rec.burst.set_function(16, 0x3000, 4)
    assert run(rec, launch_frame(16))[1] == 0  # the old size no longer matches
    assert run(rec, launch_frame(16, b"\0" * 4))[1] == 1
    assert rec.calls[0][0] == 0x3000
