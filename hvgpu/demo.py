"""``hvgpu demo``: a private agent plus a guest, running checked CUDA work.

Uses only public pieces (``Agent`` on a temporary unix socket, the guest API)
so it shows exactly the path a VM's program takes, minus vsock. Must not
reach into executor internals, and must say plainly what it could not do.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.host.agent import Agent, AgentConfig, default_cache_dir
from hvgpu.virtio import protocol as P

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

MATMUL = r"""
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float acc = 0.f;
        for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
        C[row * n + col] = acc;
    }
}
"""


def run_saxpy(conn: Connection, n: int) -> float:
    """y = a*x + y on the GPU; returns the relative error against numpy."""
    dev = Device(connection=conn)
    kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    rng = np.random.default_rng()
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    dx, dy = dev.allocate(x.nbytes), dev.allocate(y.nbytes)
    dx.copy_from(x)
    dy.copy_from(y)
    launch(kernel, LaunchConfig(grid=(n + 255) // 256, block=256), np.float32(3.0), dx, dy, n)
    out = np.empty_like(y)
    dy.copy_to(out)
    ref = 3.0 * x.astype(np.float64) + y
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def run_matmul(conn: Connection, n: int = 256) -> float:
    dev = Device(connection=conn)
    kernel = Program(MATMUL, connection=conn).compile().get_kernel("matmul")
    rng = np.random.default_rng()
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    da, db, dc = (dev.allocate(a.nbytes) for _ in range(3))
    da.copy_from(a)
    db.copy_from(b)
    launch(kernel, LaunchConfig(grid=((n + 15) // 16, (n + 15) // 16), block=(16, 16)),
           da, db, dc, n)
    c = np.empty_like(a)
    dc.copy_to(c)
    ref = a.astype(np.float64) @ b
    return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))


def run_demo(size: int, echo=print, device: str | None = None, env: dict | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="hvgpu-demo-") as tmp:
        address = f"unix://{Path(tmp) / 'agent.sock'}"
        agent = Agent(AgentConfig(listen=[address], vsock_port=None,
                                  cache_dir=default_cache_dir(), device=device,
                                  log_level="WARNING", env=env or {}))
        agent.start()
        thread = threading.Thread(target=agent.serve_forever, daemon=True)
        thread.start()
        try:
            return _run(address, size, echo)
        finally:
            agent.stop()
            thread.join(timeout=10)


def _run(address: str, size: int, echo) -> int:
    echo(f"agent:  listening on {address} (a private socket; VMs use vsock port "
         f"{P.DEFAULT_PORT})")
    t0 = time.perf_counter()
    with Connection(address) as conn:
        echo(f"guest:  connected as {conn.peer}, protocol v{conn.version}, {conn.agent}")
        dev = Device(connection=conn)
        try:
            name = dev.name
        except CudaError as exc:
            echo(f"gpu:    none usable on this host: {exc}")
            echo("result: the agent, an executor process and the data-lane handshake ran; "
                 "SAXPY and the matrix multiply did NOT run, because they need an NVIDIA "
                 "GPU and its driver on this host.")
            return 0
        free, total = dev.mem_info()
        echo(f"gpu:    {name}, compute capability {'.'.join(map(str, dev.compute_capability))}"
             f", {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free)")
        err = run_saxpy(conn, size)
        echo(f"saxpy:  n={size}, relative error vs numpy {err:.1e}  "
             f"{'OK' if err < 1e-6 else 'WRONG'}")
        merr = run_matmul(conn)
        echo(f"matmul: 256x256, relative error vs numpy {merr:.1e}  "
             f"{'OK' if merr < 1e-5 else 'WRONG'}")
    echo(f"done in {time.perf_counter() - t0:.2f}s")
    return 0 if err < 1e-6 and merr < 1e-5 else 1
