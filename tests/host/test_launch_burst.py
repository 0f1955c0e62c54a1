"""The executor's C loop of one-way frames (hvgpu/host/executor/launch_burst.c), driven
directly.

ctypes functions with the driver's signatures stand in for libcuda (``Driver``)
and record what they are asked to do. Host-to-device copies are read from host
memory only when an event recorded behind them is synchronized, or at the end,
as a GPU may read them late: a loop that reused staging memory too early would
deliver the wrong bytes.
"""

from __future__ import annotations

import ctypes
import struct

import pytest

from hvgpu.host.executor.launch_burst import SERVED, CopyRing, LaunchBurst, unavailable_reason
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header
from tests.fake_gpu import C_SIGNATURES, extra_params

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")

OP = P.OP
MEM = 0x7000_0000  # the guest's one allocation: [MEM, MEM + 4096)
SIZE = 4096


class Driver:
    """libcuda's entry points, recording each call; ``fail(name, args)`` gives a
    call's status (0: success)."""

    def __init__(self, fail=lambda name, args: 0):
        self.calls: list[tuple] = []
        self.pending: list[tuple] = []  # host-to-device copies not read yet
        self.covered: dict[int, list] = {}  # event -> the copies recorded before it
        self.copied: list[tuple] = []  # (dst, bytes) as copies were read
        self._keep = []
        self.entries = {}
        for name, signature in C_SIGNATURES.items():
            def entry(*args, name=name):
                args = tuple(self._plain(name, args))
                status = fail(name, args)
                self.calls.append((name, *args))
                if not status:
                    self._effect(name, args)
                return status
            c_entry = ctypes.CFUNCTYPE(ctypes.c_int, *signature)(entry)
            self._keep.append(c_entry)
            self.entries[name] = ctypes.cast(c_entry, ctypes.c_void_p).value

    @staticmethod
    def _plain(name, args):
        """The call's arguments as values: NULL streams as 0, parameter buffers as bytes."""
        if name == "cuLaunchKernel":
            fn, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra = args
            assert kernel_params is None
            return [fn, (gx, gy, gz), (bx, by, bz), shared, stream or 0, extra_params(extra)]
        if name == "cuLaunchKernelEx":
            config, fn, kernel_params, extra = args
            assert kernel_params is None
            c = config.contents
            attrs = ctypes.string_at(c.attrs, 72 * c.num_attrs) if c.num_attrs else b""
            return [fn, tuple(c.grid), tuple(c.block), c.shared_mem, c.stream or 0,
                    extra_params(extra), attrs]
        return [a or 0 if a is None or isinstance(a, int) else a for a in args]

    def _effect(self, name, args):
        if name == "cuMemcpyHtoDAsync":
            dst, src, n, stream = args
            self.pending.append((stream, dst, src, n))
        elif name == "cuEventRecord":
            event, stream = args
            self.covered[event] = [c for c in self.pending if c[0] == stream]
        elif name == "cuEventSynchronize":
            self._read(self.covered.pop(args[0], []))

    def _read(self, copies):
        for copy in copies:
            if copy in self.pending:
                self.pending.remove(copy)
                self.copied.append((copy[1], ctypes.string_at(copy[2], copy[3])))

    def finish(self):
        """The GPU catches up: every copy not read yet is read now."""
        self._read(list(self.pending))
        return self.copied

    def named(self, name):
        return [c[1:] for c in self.calls if c[0] == name]


def frame(op, *values, seq=1, flags=P.FLAG_ONEWAY, payload=b"", version=P.VERSION, body=None):
    code = OP[op]
    if body is None:
        body = codec.REQUEST[code].encode(values)
    head = bytearray(pack_header(code, flags, seq, 0, len(body), len(payload)))
    head[2] = version
    return bytes(head) + body + payload


def launch(function, params=b"", stream=0, seq=1, grid=(1, 1, 1), block=(32, 1, 1), **kw):
    return frame("LAUNCH_KERNEL", function, *grid, *block, 0, stream, params, seq=seq, **kw)


def launch_ex(function, params=b"", attrs=b"", stream=0, seq=1, grid=(1, 1, 1),
              block=(32, 1, 1), shared=0):
    return frame("LAUNCH_KERNEL_EX", function, *grid, *block, shared, stream, params, attrs,
                 seq=seq)


def attr(ident, value=b""):
    return struct.pack("<I4x", ident) + value.ljust(64, b"\0")


def loop(driver=None, ring=None):
    """A loop that knows the default stream, stream 17 (0xBEEF), event 18 (0xE7),
    functions 16 (4-byte parameters) and 19 (none), and the guest's allocation."""
    driver = driver or Driver()
    burst = LaunchBurst(driver.entries)
    burst.driver = driver  # its entry points live as long as the loop
    burst.set_stream(0, 0)
    burst.set_stream(17, 0xBEEF)
    burst.set_event(18, 0xE7)
    burst.set_function(16, 0x1000, 4)
    burst.set_function(19, 0x1900, 0)
    burst.add_range(MEM, SIZE)
    if ring is not None:
        burst.set_ring(ring)
    return burst


def run(burst, data: bytes, version=P.VERSION):
    buf = bytearray(len(data) + 64)
    buf[7:7 + len(data)] = data
    return burst.run(buf, 7, 7 + len(data), version, P.MAX_BODY)


class Ring:
    """A copy ring over ordinary memory, ``count`` segments of ``segment`` bytes."""

    def __init__(self, segment=256, count=4):
        self.memory = (ctypes.c_char * (segment * count))()
        self.base = ctypes.addressof(self.memory)
        self.events = [0xE000 + i for i in range(count)]
        self.ring = CopyRing(self.base, segment * count, segment, self.events)

    def holds(self, address):
        return self.base <= address < self.base + len(self.memory)


# -- launches ---------------------------------------------------------------------


def test_a_run_of_launches_reaches_the_driver_in_order_with_its_parameters():
    driver = Driver()
    burst = loop(driver)
    burst.set_function(16, 0x1000, 12)
    frames = b"".join(launch(16, struct.pack("<iQ", i, 0xDEAD), stream=17 if i % 2 else 0,
                             seq=i, grid=(i + 1, 2, 3), block=(64, 1, 1)) for i in range(500))
    done = run(burst, frames)
    assert (done.consumed, done.launched, done.status) == (len(frames), 500, 0)
    assert done.counts == {OP["LAUNCH_KERNEL"]: 500}
    calls = driver.named("cuLaunchKernel")
    assert calls[3] == (0x1000, (4, 2, 3), (64, 1, 1), 0, 0xBEEF, struct.pack("<iQ", 3, 0xDEAD))
    assert [struct.unpack("<iQ", c[5])[0] for c in calls] == list(range(500))


def test_kernels_without_parameters_get_no_buffer():
    driver = Driver()
    run(loop(driver), launch(19))
    assert driver.named("cuLaunchKernel") == [(0x1900, (1, 1, 1), (32, 1, 1), 0, 0, b"")]


def test_a_launch_with_attributes_reaches_cuLaunchKernelEx_as_the_guest_gave_it():
    driver = Driver()
    attrs = attr(4, struct.pack("<III", 2, 1, 1)) + attr(8, struct.pack("<i", -1))
    done = run(loop(driver), launch_ex(16, b"\1\2\3\4", attrs, stream=17, grid=(8, 1, 1),
                                       shared=1024) + launch_ex(19))
    assert (done.counts, done.launched, done.status) == ({OP["LAUNCH_KERNEL_EX"]: 2}, 2, 0)
    assert driver.named("cuLaunchKernelEx") == [
        (0x1000, (8, 1, 1), (32, 1, 1), 1024, 0xBEEF, b"\1\2\3\4", attrs),
        (0x1900, (1, 1, 1), (32, 1, 1), 0, 0, b"", b"")]


def test_event_records_and_stream_waits_reach_the_driver_with_the_host_handles():
    driver = Driver()
    done = run(loop(driver), frame("EVENT_RECORD", 18, 17) + frame("STREAM_WAIT_EVENT", 0, 18, 0)
               + frame("STREAM_WAIT_EVENT", 17, 18, 1))
    assert done.counts == {OP["EVENT_RECORD"]: 1, OP["STREAM_WAIT_EVENT"]: 2}
    assert driver.named("cuEventRecord") == [(0xE7, 0xBEEF)]
    assert driver.named("cuStreamWaitEvent") == [(0, 0xE7, 0), (0xBEEF, 0xE7, 1)]


def test_memsets_of_each_width_and_device_copies_reach_the_driver():
    driver = Driver()
    done = run(loop(driver), frame("MEMSET", MEM, 4096, 0x1FF, 1, 0)
               + frame("MEMSET", MEM + 2, 2047, 0x12345, 2, 17)
               + frame("MEMSET", MEM, 1024, 0xDEADBEEF, 4, 0)
               + frame("MEMSET", MEM + SIZE, 0, 7, 4, 0)  # nothing, at the very end: as Python
               + frame("MEMCPY_DTOD", MEM + 2048, MEM, 2048, 17))
    assert done.counts == {OP["MEMSET"]: 4, OP["MEMCPY_DTOD"]: 1} and not done.status
    assert driver.named("cuMemsetD8Async") == [(MEM, 0xFF, 4096, 0)]
    assert driver.named("cuMemsetD16Async") == [(MEM + 2, 0x2345, 2047, 0xBEEF)]
    assert driver.named("cuMemsetD32Async") == [(MEM, 0xDEADBEEF, 1024, 0),
                                                (MEM + SIZE, 7, 0, 0)]
    assert driver.named("cuMemcpyDtoDAsync") == [(MEM + 2048, MEM, 2048, 0xBEEF)]


def test_a_mixed_step_is_served_in_one_call():
    driver, ring = Driver(), Ring()
    step = [launch(16, b"\0" * 4, seq=1), frame("EVENT_RECORD", 18, 0, seq=2),
            frame("STREAM_WAIT_EVENT", 17, 18, 0, seq=3), frame("MEMSET", MEM, 64, 0, 4, 17, seq=4),
            frame("MEMCPY_DTOD", MEM + 256, MEM, 256, 17, seq=5),
            frame("MEMCPY_HTOD", MEM + 512, 17, seq=6, payload=b"x" * 100),
            launch_ex(16, b"\0" * 4, attr(8), stream=17, seq=7)]
    data = b"".join(step) * 20
    done = run(loop(driver, ring.ring), data)
    assert done.consumed == len(data) and not done.status and done.frames == 140
    assert done.counts == {code: 20 for code in SERVED}
    assert done.h2d_bytes == 2000 and done.launched == 40
    assert [c[0] for c in driver.calls[:7]] == [
        "cuLaunchKernel", "cuEventRecord", "cuStreamWaitEvent", "cuMemsetD32Async",
        "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync", "cuLaunchKernelEx"]
    assert driver.finish() == [(MEM + 512, b"x" * 100)] * 20


# -- what it leaves to the Python path --------------------------------------------

GOOD = launch(16, b"\1\0\0\0")


LEFT_TO_PYTHON = [
    ("unknown function", launch(99, b"\0" * 4)),
    ("unknown stream", launch(16, b"\0" * 4, stream=55)),
    ("wrong parameter size", launch(16, b"\0" * 8)),
    ("a synchronous launch", launch(16, b"\0" * 4, flags=0)),
    ("another protocol version", launch(16, b"\0" * 4, version=P.VERSION + 1)),
    ("another op", pack_header(OP["PING"], 0, 1, 0, 0)),
    ("a one-way op it does not serve", frame("MEM_FREE", MEM)),
    ("bad magic", b"XX" + launch(16, b"\0" * 4)[2:]),
    ("a launch carrying payload", pack_header(OP["LAUNCH_KERNEL"], P.FLAG_ONEWAY, 1, 0, 52, 8)
     + launch(16, b"\0" * 4)[32:]),
    ("params length not matching the body",
     launch(16, b"\0" * 4)[:76] + struct.pack("<I", 8) + b"\0" * 4),
    ("a body over the limit", pack_header(OP["LAUNCH_KERNEL"], P.FLAG_ONEWAY, 1, 0,
                                          P.MAX_BODY + 1)),
    ("an incomplete header", launch(16, b"\0" * 4)[:20]),
    # launches with attributes
    ("an attribute naming an event", launch_ex(16, b"\0" * 4, attr(8) + attr(7))),
    ("a launch completion event", launch_ex(16, b"\0" * 4, attr(12))),
    ("attributes that are not whole", launch_ex(16, b"\0" * 4, attr(8)[:71])),
    ("more attributes than any launch has", launch_ex(16, b"\0" * 4, attr(8) * 33)),
    ("attribute length past the body", frame("LAUNCH_KERNEL_EX", body=launch_ex(
        16, b"\0" * 4, attr(8))[32:32 + 44] + struct.pack("<II", 4, 144) + b"\0" * 4 + attr(8))),
    ("a short launch_ex body", frame("LAUNCH_KERNEL_EX", body=b"\0" * 51)),
    ("launch_ex of an unknown function", launch_ex(99)),
    ("launch_ex on an unknown stream", launch_ex(16, b"\0" * 4, stream=55)),
    ("launch_ex with the wrong parameter size", launch_ex(16, b"\0" * 3)),
    # events and streams
    ("recording an unknown event", frame("EVENT_RECORD", 77, 0)),
    ("recording on an unknown stream", frame("EVENT_RECORD", 18, 55)),
    ("waiting on an unknown event", frame("STREAM_WAIT_EVENT", 0, 77, 0)),
    ("an unknown stream waiting", frame("STREAM_WAIT_EVENT", 55, 18, 0)),
    ("an event record with a trailing byte", frame("EVENT_RECORD", body=struct.pack("<QQB",
                                                                                    18, 0, 0))),
    ("a short stream wait", frame("STREAM_WAIT_EVENT", body=struct.pack("<QQ", 0, 18))),
    # device memory
    ("a memset width of 3", frame("MEMSET", MEM, 4, 0, 3, 0)),
    ("a memset width of 0", frame("MEMSET", MEM, 4, 0, 0, 0)),
    ("a memset past the allocation", frame("MEMSET", MEM + 4000, 25, 0, 4, 0)),
    ("a memset before it", frame("MEMSET", MEM - 1, 1, 0, 1, 0)),
    ("a memset whose size overflows", frame("MEMSET", MEM, (1 << 63) + 1, 0, 2, 0)),
    ("a memset on an unknown stream", frame("MEMSET", MEM, 4, 0, 1, 55)),
    ("a copy from outside", frame("MEMCPY_DTOD", MEM, 0x1000, 16, 0)),
    ("a copy to outside", frame("MEMCPY_DTOD", 0x1000, MEM, 16, 0)),
    ("a copy running past the end", frame("MEMCPY_DTOD", MEM, MEM + 8, SIZE - 7, 0)),
    ("a copy whose end wraps around", frame("MEMCPY_DTOD", MEM, MEM + 8, (1 << 64) - 4, 0)),
    ("a copy on an unknown stream", frame("MEMCPY_DTOD", MEM, MEM + 8, 8, 55)),
    ("a memset with a payload", frame("MEMSET", MEM, 4, 0, 1, 0, payload=b"x")),
    # host-to-device copies
    ("a copy to outside the allocation", frame("MEMCPY_HTOD", 0x1000, 0, payload=b"x" * 8)),
    ("a copy running past its end", frame("MEMCPY_HTOD", MEM + SIZE - 4, 0, payload=b"x" * 8)),
    ("a copy on an unknown stream", frame("MEMCPY_HTOD", MEM, 55, payload=b"x" * 8)),
    ("a copy larger than a ring segment", frame("MEMCPY_HTOD", MEM, 0, payload=b"x" * 257)),
    ("an empty copy", frame("MEMCPY_HTOD", MEM, 0)),
    ("a copy with a short body", frame("MEMCPY_HTOD", body=struct.pack("<Q", MEM),
                                       payload=b"x")),
]


@pytest.mark.parametrize("why, frame_", LEFT_TO_PYTHON, ids=[w for w, _ in LEFT_TO_PYTHON])
def test_it_stops_before_any_frame_the_python_path_must_judge(why, frame_):
    driver, ring = Driver(), Ring()
    incomplete = why.startswith("an incomplete")
    done = run(loop(driver, ring.ring), GOOD * 2 + frame_ + (b"" if incomplete else GOOD))
    assert (done.consumed, done.launched, done.status) == (len(GOOD) * 2, 2, 0), why
    assert (done.need, done.want_ring) == (0, False), why
    assert [c[0] for c in driver.calls] == ["cuLaunchKernel"] * 2, why


def test_a_frame_it_serves_that_arrived_in_part_says_how_many_bytes_it_needs():
    for whole in (GOOD, launch_ex(16, b"\0" * 4, attr(8)), frame("EVENT_RECORD", 18, 0),
                  frame("MEMCPY_HTOD", MEM, 0, payload=b"y" * 200)):
        for cut in (33, len(whole) - 1):
            ring = Ring()
            done = run(loop(ring=ring.ring), GOOD + whole[:cut])
            assert (done.consumed, done.need) == (len(GOOD), len(whole))


def test_an_entry_point_the_device_lacks_leaves_its_op_to_python():
    driver = Driver()
    entries = dict(driver.entries)
    del entries["cuMemsetD16Async"], entries["cuLaunchKernelEx"]
    burst = LaunchBurst(entries)
    burst.set_stream(0, 0)
    burst.set_function(16, 0x1000, 4)
    burst.add_range(MEM, SIZE)
    for frame_ in (frame("MEMSET", MEM, 4, 0, 2, 0), launch_ex(16, b"\0" * 4)):
        assert run(burst, frame_).consumed == 0
    assert run(burst, frame("MEMSET", MEM, 4, 0, 4, 0)).consumed > 0


# -- failures ---------------------------------------------------------------------


@pytest.mark.parametrize("entry, bad", [
    ("cuLaunchKernel", launch(16, b"\0" * 4, seq=2)),
    ("cuLaunchKernelEx", launch_ex(16, b"\0" * 4, seq=2)),
    ("cuEventRecord", frame("EVENT_RECORD", 18, 0, seq=2)),
    ("cuStreamWaitEvent", frame("STREAM_WAIT_EVENT", 0, 18, 0, seq=2)),
    ("cuMemsetD8Async", frame("MEMSET", MEM, 4, 0, 1, 0, seq=2)),
    ("cuMemcpyDtoDAsync", frame("MEMCPY_DTOD", MEM, MEM + 8, 8, 0, seq=2)),
    ("cuMemcpyHtoDAsync", frame("MEMCPY_HTOD", MEM, 0, seq=2, payload=b"z" * 8)),
])
def test_a_failed_call_stops_the_run_and_names_its_frame(entry, bad):
    driver = Driver(fail=lambda name, args: 700 if name == entry and args[0] != 0x1900 else 0)
    good = launch(19, seq=1)
    ring = Ring()
    done = run(loop(driver, ring.ring), good + bad + good)
    assert (done.consumed, done.status, done.seq, done.op) == (
        len(good) + len(bad), 700, 2, bad[4] | bad[5] << 8)
    assert done.frames == 2 and done.launched == 1
    assert driver.calls[-1][0] in (entry, "cuEventRecord")  # the frame after it is left


def test_handles_and_ranges_forgotten_are_refused_and_the_rest_kept():
    driver = Driver()
    burst = loop(driver)
    for h in range(100, 1100):  # enough to grow the tables several times
        burst.set_function(h, 0x1000 + h, 0)
        burst.set_stream(h, 0x9000 + h)
        burst.set_event(h, 0x5000 + h)
        burst.add_range(0x100_0000 + h * 0x1000, 0x100)
    for h in range(100, 1100, 3):
        burst.drop_function(h)
        burst.drop_stream(h)
        burst.drop_event(h)
        burst.drop_range(0x100_0000 + h * 0x1000)
    for h in range(100, 1100):
        kept = (h - 100) % 3 != 0
        assert run(burst, launch(h, stream=h)).launched == kept, h
        assert bool(run(burst, frame("EVENT_RECORD", h, h)).consumed) == kept, h
        assert bool(run(burst, frame("MEMSET", 0x100_0000 + h * 0x1000 + 0x80, 0x80, 0, 1,
                                     0)).consumed) == kept, h
    assert {c[0] - 0x1000 for c in driver.named("cuLaunchKernel")} == {
        h for h in range(100, 1100) if (h - 100) % 3}
    assert all(c[4] - 0x9000 == c[0] - 0x1000 for c in driver.named("cuLaunchKernel"))


def test_a_function_set_again_takes_the_new_value():
    driver = Driver()
    burst = loop(driver)
    burst.set_function(16, 0x3000, 8)
    assert run(burst, launch(16, b"\0" * 4)).launched == 0  # the old size no longer matches
    assert run(burst, launch(16, b"\0" * 8)).launched == 1
    assert driver.named("cuLaunchKernel")[0][0] == 0x3000


def test_a_range_is_judged_against_the_allocation_it_starts_in():
    burst = loop()
    burst.add_range(MEM + SIZE, 16)  # adjacent: a copy may not span the two
    assert run(burst, frame("MEMSET", MEM + SIZE - 8, 8, 0, 1, 0)).consumed
    assert run(burst, frame("MEMSET", MEM + SIZE + 8, 8, 0, 1, 0)).consumed
    assert not run(burst, frame("MEMSET", MEM + SIZE - 8, 16, 0, 1, 0)).consumed
    burst.add_range(MEM, 8)  # a range added again takes its new size
    assert not run(burst, frame("MEMSET", MEM, 9, 0, 1, 0)).consumed


# -- small host-to-device copies ---------------------------------------------------


def test_small_copies_are_staged_in_the_ring_and_survive_the_receive_buffer_being_reused():
    driver, ring = Driver(), Ring(segment=256, count=4)
    burst = loop(driver, ring.ring)
    expected = []
    buf = bytearray(64 << 10)
    for i in range(300):  # wraps around the ring many times
        payload = bytes([i % 251]) * (1 + i % 100)
        data = frame("MEMCPY_HTOD", MEM + i, 17 if i % 7 == 0 else 0, seq=i, payload=payload)
        buf[:len(data)] = data
        done = burst.run(buf, 0, len(data), P.VERSION, P.MAX_BODY)
        assert (done.consumed, done.h2d_bytes, done.status) == (len(data), len(payload), 0)
        buf[:] = b"\xee" * len(buf)  # the session reads the next frames into it
        expected.append((MEM + i, payload))
    assert driver.finish() == expected
    assert all(ring.holds(c[1]) for c in driver.named("cuMemcpyHtoDAsync"))


def test_copies_on_two_streams_in_one_run_use_two_segments():
    driver, ring = Driver(), Ring(segment=256, count=4)
    data = b"".join(frame("MEMCPY_HTOD", MEM + 8 * i, 17 * (i % 2), seq=i, payload=bytes([i]) * 8)
                    for i in range(40))
    for _ in range(5):
        assert run(loop(driver, ring.ring), data).counts == {OP["MEMCPY_HTOD"]: 40}
    assert sorted(driver.finish()) == sorted((MEM + 8 * i, bytes([i]) * 8)
                                             for i in range(40) for _ in range(5))
    assert {stream for event, stream in driver.named("cuEventRecord")} == {0, 0xBEEF}


def test_two_loops_share_a_ring_without_sharing_a_segment():
    driver, ring = Driver(), Ring(segment=128, count=3)
    a, b = loop(driver, ring.ring), loop(driver, ring.ring)
    expected = []
    for i in range(60):
        payload = bytes([i]) * 100
        assert run(a if i % 2 else b, frame("MEMCPY_HTOD", MEM + i, 0, payload=payload)).consumed
        expected.append((MEM + i, payload))
    assert driver.finish() == expected


def test_without_a_ring_a_small_copy_asks_for_one_and_with_none_goes_to_python():
    burst = loop()
    copy = frame("MEMCPY_HTOD", MEM, 0, payload=b"q" * 16)
    done = run(burst, GOOD + copy)
    assert (done.consumed, done.want_ring) == (len(GOOD), True)
    burst.set_ring(None)
    done = run(burst, GOOD + copy)
    assert (done.consumed, done.want_ring) == (len(GOOD), False)


def test_a_closed_ring_hands_out_no_segment():
    driver, ring = Driver(), Ring()
    burst = loop(driver, ring.ring)
    assert run(burst, frame("MEMCPY_HTOD", MEM, 0, payload=b"1" * 8)).consumed
    assert ring.ring.close()  # no loop holds a segment between runs
    assert run(burst, frame("MEMCPY_HTOD", MEM, 0, payload=b"2" * 8)).consumed == 0
    burst.close()  # the last reference: freed here


def test_a_failed_record_behind_copies_is_reported_with_their_frame():
    driver = Driver(fail=lambda name, args: 999 if name == "cuEventRecord" and args[0] >= 0xE000
                    else 0)
    ring = Ring(segment=256, count=2)
    burst = loop(driver, ring.ring)
    copy = frame("MEMCPY_HTOD", MEM, 0, seq=5, payload=b"a" * 8)
    done = run(burst, copy + GOOD)
    assert (done.status, done.seq, done.op) == (999, 5, OP["MEMCPY_HTOD"])
    assert done.consumed == len(copy) + len(GOOD) and done.launched == 1
    # that segment is never handed out again; the other one is, once (its record fails too)
    for i in range(3):
        done = run(burst, copy)
        assert done.consumed == (len(copy) if i == 0 else 0)
