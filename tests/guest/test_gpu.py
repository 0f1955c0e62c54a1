"""The guest API against the real executor on a real GPU (``gpu`` marker).

Each test starts an agent on a unix socket whose executors use CUDA, and
checks results against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from hvgpu.errors import CompileError, CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch

pytestmark = pytest.mark.gpu

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

MATMUL = r"""
#define T 16
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {
    __shared__ float As[T][T], Bs[T][T];
    int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < n; t += T) {
        As[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? A[row * n + t + threadIdx.x] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? B[(t + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < T; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) C[row * n + col] = acc;
}
"""

FAULT = r"""
extern "C" __global__ void write_to(int* p) { *p = 1; }
"""


@pytest.fixture
def conn(gpu_agent):
    c = Connection(gpu_agent.address)
    yield c
    c.close()


def test_device_reports_the_real_gpu(conn):
    dev = Device(connection=conn)
    free, total = dev.mem_info()
    print(f"\n{dev.name} cc {dev.compute_capability} SMs {dev.multiprocessor_count} "
          f"{dev.uuid} total {dev.total_memory} free {free}")
    assert dev.total_memory == total > free > 0
    assert dev.compute_capability[0] >= 7
    assert dev.uuid.startswith("GPU-")


def test_saxpy_matches_numpy(conn):
    dev = Device(connection=conn)
    kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    assert kernel.layout == [(0, 4), (8, 8), (16, 8), (24, 4)]
    rng = np.random.default_rng()
    n = 1_000_003
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    dx, dy = dev.allocate(x.nbytes), dev.allocate(y.nbytes)
    dx.copy_from(x)
    dy.copy_from(y)
    launch(kernel, LaunchConfig(grid=(n + 255) // 256, block=256), np.float32(2.5), dx, dy, n)
    out = np.full(n, np.nan, dtype=np.float32)
    dy.copy_to(out)
    ref = 2.5 * x.astype(np.float64) + y  # the GPU fuses the multiply-add
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_matmul_on_a_stream_with_events(conn):
    dev = Device(connection=conn)
    kernel = Program(MATMUL, connection=conn).compile().get_kernel("matmul")
    rng = np.random.default_rng()
    n = 512
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    stream = dev.create_stream()
    da, db, dc = (dev.allocate(a.nbytes) for _ in range(3))
    da.copy_from(a, stream=stream)
    db.copy_from(b, stream=stream)
    dc.fill(0xFF, stream=stream)
    start, end = stream.record(), dev.create_event()
    launch(kernel, LaunchConfig(grid=(n // 16, n // 16), block=(16, 16), stream=stream),
           da, db, dc, n)
    stream.record(end)
    end.sync()
    assert end.is_done and stream.is_done
    assert (end - start) > 0
    c = np.empty((n, n), dtype=np.float32)
    dc.copy_to(c, stream=stream)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-5


def test_ptx_and_device_to_device_copies(conn):
    dev = Device(connection=conn)
    src = dev.allocate(1 << 20)
    dst = dev.allocate(1 << 20)
    data = np.random.default_rng().integers(0, 255, 1 << 20, dtype=np.uint8)
    src.copy_from(data)
    dst.copy_from(src)
    np.testing.assert_array_equal(np.frombuffer(dst.copy_to(), dtype=np.uint8), data)
    dst.fill(0x01020304, width=4)
    assert set(np.frombuffer(dst.copy_to(), dtype=np.uint32)) == {0x01020304}


def test_bad_source_returns_the_compiler_log(conn):
    with pytest.raises(CompileError) as info:
        Program('extern "C" __global__ void k() { undefined_thing(); }', connection=conn).compile()
    assert "undefined_thing" in info.value.log


def test_out_of_bounds_copy_is_refused_and_connection_survives(conn):
    dev = Device(connection=conn)
    buf = dev.allocate(4096)
    with pytest.raises(CudaError) as info:
        conn.copy_from_device(bytearray(8192), buf.ptr)
    assert info.value.status == 1
    assert dev.mem_info()[1] > 0


def test_illegal_address_surfaces_at_the_next_sync(conn):
    dev = Device(connection=conn)
    kernel = Program(FAULT, connection=conn).compile().get_kernel("write_to")
    launch(kernel, LaunchConfig(grid=1, block=1), 16)  # a pointer nobody allocated
    with pytest.raises(CudaError) as info:
        dev.sync()
    assert info.value.status in (700, 719)
