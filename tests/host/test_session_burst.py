"""A session serves a training step's one-way frames in its C loop, with the results
of its Python path.

Each scenario runs twice against the GPU test double: once with the C loop,
once with the Python path alone (a device that offers no driver entry points),
and the two must leave the same bytes in device memory and report the same
errors. ``SessionGuest.python_ops`` says which frames the Python path read.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hvgpu.host.executor.launch_burst import unavailable_reason
from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
N = 256  # floats per buffer


class PythonOnly(FakeDevice):
    """The double without driver entry points: every frame takes the Python path."""

    def driver_entries(self):
        return {}


def attr(ident, value=b""):
    return struct.pack("<I4x", ident) + value.ljust(64, b"\0")


class Step:
    """A guest set up as a training loop is: buffers, a kernel, a side stream, events."""

    def __init__(self, device):
        self.device = device
        self.g = g = SessionGuest(device)
        self.x, self.y, self.z = (g.ok("MEM_ALLOC", N * 4) for _ in range(3))
        module = g.ok("MODULE_COMPILE", "saxpy.cu", "", payload=SAXPY.encode())[0]
        self.fn = g.ok("MODULE_GET_FUNCTION", module, "saxpy")
        g.ok("FUNC_GET_PARAM_INFO", self.fn)  # as the shim does before its first launch
        self.side = g.ok("STREAM_CREATE", 1)
        self.e1, self.e2 = g.ok("EVENT_CREATE", 0), g.ok("EVENT_CREATE", 0)  # timed
        g.python_ops.clear()

    def params(self, a, x, y):
        return struct.pack("<f4xQQi", a, x, y, N)

    def frames(self, i: int) -> list[bytes]:
        """One step: every kind of one-way frame a framework's step sends."""
        g, x, y, z = self.g, self.x, self.y, self.z
        data = np.arange(N, dtype=np.float32) + i
        return [
            g.oneway("MEMCPY_HTOD", x, self.side, payload=data.tobytes()),
            g.oneway("MEMSET", y, N, 0x3F800000, 4, self.side),  # 1.0f
            g.oneway("LAUNCH_KERNEL", self.fn, 1, 1, 1, N, 1, 1, 0, self.side,
                     self.params(2.0, x, y)),
            g.oneway("EVENT_RECORD", self.e1, self.side),
            g.oneway("STREAM_WAIT_EVENT", 0, self.e1, 0),
            g.oneway("MEMCPY_DTOD", z, y, N * 4, 0),
            g.oneway("LAUNCH_KERNEL_EX", self.fn, 1, 1, 1, N, 1, 1, 0, 0,
                     self.params(0.5, x, z), attr(8, struct.pack("<i", -1))),
            g.oneway("MEMSET", z + 4 * (N - 8), 8, 0xBEEF, 2, 0),
            g.oneway("MEMSET", z + 4 * (N - 2), 3, 0x7F, 1, 0),
            g.oneway("EVENT_RECORD", self.e2, 0),
            g.oneway("STREAM_WAIT_EVENT", self.side, self.e2, 0),
        ]

    def memory(self) -> bytes:
        g = self.g
        assert g.ok("EVENT_ELAPSED_TIME", self.e1, self.e2) >= 0  # both were recorded
        return b"".join(g.ok("MEMCPY_DTOH", p, N * 4, 0) for p in (self.x, self.y, self.z))


def run_steps(device, steps=20, batched=True):
    step = Step(device)
    frames = [f for i in range(steps) for f in step.frames(i)]
    if batched:
        step.g.send(*frames)
    else:  # one frame per send: the session reads them as they come
        for f in frames:
            step.g.send(f)
    step.g.ok("CTX_SYNCHRONIZE")
    return step


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "frame by frame"])
def test_a_step_shaped_run_is_served_by_the_c_loop_alone_with_pythons_results(batched):
    device = FakeDevice()
    step = run_steps(device, batched=batched)
    assert step.g.python_ops == [P.OP["CTX_SYNCHRONIZE"]]  # no one-way frame reached Python
    served = step.memory()
    assert device.c_launches == 40 and device.launches == 40
    assert device.c_calls["cuMemcpyHtoDAsync"] == 20
    assert device.c_calls["cuEventRecord"] >= 40  # and the copy ring's own
    assert device.launch_ex_attrs == [attr(8, struct.pack("<i", -1))] * 20
    step.g.close()

    reference = run_steps(PythonOnly())
    assert P.OP["LAUNCH_KERNEL"] in reference.g.python_ops  # it did take the Python path
    assert served == reference.memory()
    reference.g.close()
    z = np.frombuffer(served[2 * N * 4:], dtype=np.float32)
    assert z[0] == 0.5 * 19 + (2 * 19 + 1)  # the last step's values, through every op


def test_the_sessions_counts_include_what_the_c_loop_served():
    device = FakeDevice()
    step = run_steps(device, steps=5)
    counts = step.g.session.counts
    assert counts["launches"] == 10 and counts["h2d_bytes"] == 5 * N * 4
    assert counts["frames"] >= 5 * 11 + 1
    step.g.close()


def test_copies_too_large_for_the_ring_and_sync_ops_still_take_the_python_path():
    device = FakeDevice()
    step = Step(device)
    g = step.g
    big = np.arange(64 << 10, dtype=np.float32)  # 256 KiB: staging slots, as before
    buf = g.ok("MEM_ALLOC", big.nbytes)
    g.python_ops.clear()
    g.send(g.oneway("MEMCPY_HTOD", buf, 0, payload=big.tobytes()), *step.frames(0))
    assert g.ok("MEMCPY_DTOH", buf, big.nbytes, 0) == big.tobytes()
    assert g.python_ops == [P.OP["MEMCPY_HTOD"], P.OP["MEMCPY_DTOH"]]
    g.close()


def test_a_failed_call_in_the_c_loop_surfaces_at_the_next_sync_as_in_python():
    results = []
    for device in (FakeDevice(), PythonOnly()):
        step = Step(device)
        g = step.g
        frames = step.frames(0)
        bad_at = len(frames)
        # a kernel reading a pointer that is not device memory: the driver's 700
        frames.append(g.oneway("LAUNCH_KERNEL", step.fn, 1, 1, 1, N, 1, 1, 0, 0,
                               step.params(1.0, step.x + (1 << 40), step.y)))
        frames += step.frames(1)
        g.send(*frames)
        status, (failed_op, failed_seq, _) = g.call("PING")
        results.append((status, failed_op, failed_seq - frames_seq(frames[0]), bad_at))
        device.sticky = None
        g.close()
    assert results[0] == results[1]
    assert results[0][:2] == (700, P.OP["LAUNCH_KERNEL"])
    assert results[0][2] == results[0][3]


def frames_seq(frame: bytes) -> int:
    return struct.unpack_from("<I", frame, 8)[0]


class GlobalsDevice(FakeDevice):
    """Every module has a 256-byte variable of any name."""

    def module_global(self, module, name):
        return self.mem_alloc(256), 256


def test_a_module_variable_is_the_c_loops_to_touch_until_its_module_is_unloaded():
    g = SessionGuest(GlobalsDevice())
    module = g.ok("MODULE_COMPILE", "saxpy.cu", "", payload=SAXPY.encode())[0]
    var, size = g.ok("MODULE_GET_GLOBAL", module, "table")
    g.python_ops.clear()
    g.send(g.oneway("MEMSET", var, size, 0x5A, 1, 0))
    assert g.ok("MEMCPY_DTOH", var, size, 0) == b"\x5a" * size
    assert g.python_ops == [P.OP["MEMCPY_DTOH"]]
    g.ok("MODULE_UNLOAD", module)
    g.python_ops.clear()
    bad = g.oneway("MEMSET", var, size, 0, 1, 0)
    g.send(bad)
    status, (failed_op, failed_seq, message) = g.call("PING")
    assert (status, failed_op, failed_seq) == (P.CUDA_ERROR_INVALID_VALUE, P.OP["MEMSET"],
                                               frames_seq(bad))
    assert "not inside any allocation" in message
    assert g.python_ops == [P.OP["MEMSET"], P.OP["PING"]]
    g.close()
