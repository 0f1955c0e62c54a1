"""The C loop of one-way frames on the real driver (``gpu`` marker).

An in-process session over CudaDevice runs a step-shaped sequence of every
one-way op twice: with the C loop (libcuda's entry points: the _v2 copies, the
memsets' narrow value arguments, CUlaunchConfig's layout) and with the Python
path alone. Device memory, errors and which frames Python read are compared.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hvgpu.virtio import protocol as P
from tests.security.data_lane import SessionGuest

pytestmark = pytest.mark.gpu

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
N = 4096
STEPS = 50


def devices():
    from hvgpu.host.executor.cuda_device import CudaDevice

    class PythonPath(CudaDevice):
        def driver_entries(self):
            return {}

    return CudaDevice, PythonPath


def priority(value=0):
    return struct.pack("<I4xi", 8, value).ljust(72, b"\0")  # CU_LAUNCH_ATTRIBUTE_PRIORITY


def run(device_type, extra=lambda g, bufs, fn: []):
    """(x, y, z after STEPS steps, the reply to a PING after ``extra``'s frames, the ops
    Python read)."""
    g = SessionGuest(device_type(0))
    try:
        x, y, z = (g.ok("MEM_ALLOC", N * 4) for _ in range(3))
        module = g.ok("MODULE_COMPILE", "saxpy.cu", "", payload=SAXPY.encode())[0]
        fn = g.ok("MODULE_GET_FUNCTION", module, "saxpy")
        g.ok("FUNC_GET_PARAM_INFO", fn)
        side = g.ok("STREAM_CREATE", 1)
        e1, e2 = g.ok("EVENT_CREATE", 2), g.ok("EVENT_CREATE", 2)
        g.python_ops.clear()
        blocks = N // 256
        frames = []
        for i in range(STEPS):
            data = np.arange(N, dtype=np.float32) + i
            frames += [
                g.oneway("MEMCPY_HTOD", x, side, payload=data[:1024].tobytes()),
                g.oneway("MEMCPY_HTOD", x + 4096, side, payload=data[1024:].tobytes()),
                g.oneway("MEMSET", y, N, 0x3F800000, 4, side),
                g.oneway("LAUNCH_KERNEL", fn, blocks, 1, 1, 256, 1, 1, 0, side,
                         struct.pack("<f4xQQi", 2.0, x, y, N)),
                g.oneway("EVENT_RECORD", e1, side),
                g.oneway("STREAM_WAIT_EVENT", 0, e1, 0),
                g.oneway("MEMCPY_DTOD", z, y, N * 4, 0),
                g.oneway("LAUNCH_KERNEL_EX", fn, blocks, 1, 1, 256, 1, 1, 0, 0,
                         struct.pack("<f4xQQi", 0.5, x, z, N), priority()),
                g.oneway("MEMSET", z + 4 * (N - 64), 32, 0xBEEF, 2, 0),
                g.oneway("MEMSET", z + 4 * (N - 16), 7, 0x7F, 1, 0),
                g.oneway("EVENT_RECORD", e2, 0),
                g.oneway("STREAM_WAIT_EVENT", side, e2, 0),
            ]
        g.send(*frames)
        g.ok("CTX_SYNCHRONIZE")
        python_ops = list(g.python_ops)
        memory = [np.frombuffer(g.ok("MEMCPY_DTOH", p, N * 4, 0), dtype=np.float32)
                  for p in (x, y, z)]
        g.send(*extra(g, (x, y, z), fn))
        error = g.call("PING")
        return memory, error, python_ops
    finally:
        g.close()


def test_a_step_through_the_c_loop_matches_the_python_path_and_numpy():
    c_loop, python_path = devices()
    (x, y, z), _, python_ops = run(c_loop)
    assert python_ops == [P.OP["CTX_SYNCHRONIZE"]]  # every one-way frame was the C loop's
    reference, _, reference_ops = run(python_path)
    assert P.OP["LAUNCH_KERNEL"] in reference_ops
    for got, want in zip((x, y, z), reference):
        assert got.tobytes() == want.tobytes()
    data = np.arange(N, dtype=np.float32) + STEPS - 1
    assert np.array_equal(x, data) and np.array_equal(y, 2 * data + 1)
    want_z = 0.5 * data + 2 * data + 1
    raw = want_z.view(np.uint8).copy()
    raw[4 * (N - 64):4 * (N - 64) + 64] = np.frombuffer(struct.pack("<H", 0xBEEF) * 32, np.uint8)
    raw[4 * (N - 16):4 * (N - 16) + 7] = 0x7F
    assert z.tobytes() == raw.tobytes()


def failing(g, bufs, fn):
    """A launch the driver refuses (a grid of 0 blocks) and a misaligned 4-byte memset."""
    x, y, _ = bufs
    return [g.oneway("LAUNCH_KERNEL", fn, 0, 1, 1, 256, 1, 1, 0, 0,
                     struct.pack("<f4xQQi", 1.0, x, y, N)),
            g.oneway("MEMSET", y + 1, 4, 0, 4, 0)]


def test_a_call_the_driver_refuses_in_the_c_loop_is_reported_as_the_python_path_reports_it():
    c_loop, python_path = devices()
    _, error, _ = run(c_loop, failing)
    _, reference, _ = run(python_path, failing)
    print(f"\nC loop: {error}\nPython: {reference}")
    assert error[0] == reference[0] != 0
    assert error[1][:2] == reference[1][:2]  # the same frame named
