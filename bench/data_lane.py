"""Data-lane benchmark: native CUDA against hvgpu, in alternating timed windows.

On the GPU machine, from the repository root (bench/run_all.py runs this together with
bench/frameworks.py; see there for the one command to run):

    python3 bench/data_lane.py --out /tmp/hvgpu-bench                # default rows, ~3 min
    python3 bench/data_lane.py --out /tmp/hvgpu-bench --rows all     # every row, ~9 min
    python3 bench/data_lane.py --out /tmp/hvgpu-quick --quick        # smoke run, ~1 min
    python3 bench/data_lane.py --render /tmp/hvgpu-bench/data_lane.json docs/performance.md

Every figure compares one front end with itself, natively and through hvgpu:

- *Python API* (in this process): copies are cudaMemcpy through CuPy against
  hvgpu.guest's Buffer copies, sgemm is the same kernel source launched by CuPy and by
  hvgpu.guest, and launches are cuda.core's ``launch()`` against hvgpu.guest's
  ``launch()``, which is shaped after it (cuda-python's cuLaunchKernel where cuda.core
  is not installed; the row is skipped, not compared with another front end, where
  neither is). hvgpu's path: guest API -> unix socket -> agent -> executor -> GPU.
- *CuPy*: bench/cupy_launch.py, natively and under ``hvgpu-guest run`` (the libcuda
  shim): RawKernel launches against RawKernel launches.
- *CUDA C++*: bench/shim_bench.cu built once by nvcc (static cudart, cuBLAS) and run
  natively and through the shim.

Each row is bench/pairs.py's: pairs of windows of at least 2 s, native and hvgpu
alternating (ABBA), the median of per-pair ratios with their spread, noisy rows said so.
Every window is checked (bench/checks.py): launches are counted by the kernel they
launch, sgemm's output is poisoned before and compared after, copies go from fresh bytes
into poisoned memory; odd sizes at odd offsets are copied both ways, pageable and
pinned, before any window. Writes data_lane.json, data_lane.md and data_lane.png to
--out and every process's log to --out/logs.

Must not write the docs or bench/results by itself: --render does that (the table on
docs/performance.md, README's headline rows from it; bench/readme.py), from a results
file that is not a quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import checks, pairs  # noqa: E402
from bench.worker import Worker, WorkerFailed  # noqa: E402

# 64x64 output tile per block, 16-deep k slices, 4x4 outputs per thread.
SGEMM = r"""
#define BM 64
#define BN 64
#define BK 16
extern "C" __global__ void __launch_bounds__(256)
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int n) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < n; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += 256) {
            int r = i / BK, c = i % BK;
            As[c][r] = A[(row0 + r) * n + k0 + c];
            int rb = i / BN, cb = i % BN;
            Bs[rb][cb] = B[(k0 + rb) * n + col0 + cb];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[k][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) C[(row0 + ty * 4 + i) * n + col0 + tx * 4 + j] = acc[i][j];
}
"""
SGEMM_N = 4096
SGEMM_BATCH = 5  # launches between two looks at the clock (~25 ms of work)
COPY_BATCH_BYTES = 512 << 20  # copied between two waits (~10 ms pinned, ~40 ms pageable)
COPY_BATCH_MOST = 4096  # ... and at most this many copies (small ones: ~40 ms)
SGEMM_RTOL = 1e-4  # against cuBLAS: same sums in another order
SYNC_TARGET_US = 60.0
WARM_S = 0.2  # an untimed window per side before a row's pairs: first-use costs out

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SIZE_LABELS = {4 * KIB: "4 KiB", 256 * KIB: "256 KiB", MIB: "1 MiB", 4 * MIB: "4 MiB",
               64 * MIB: "64 MiB", GIB: "1 GiB"}

GROUPS = {
    "api": "Python API: native CuPy / cuda.core in this process, hvgpu.guest -> unix socket "
           "-> agent -> executor process -> GPU",
    "cupy": "CuPy (bench/cupy_launch.py) natively and under hvgpu-guest run: libcuda shim "
            "-> unix socket -> agent -> executor process -> GPU",
    "shim": "CUDA C++ (bench/shim_bench.cu: static cudart, cuBLAS) natively and through the "
            "libcuda shim -> unix socket -> agent -> executor process -> GPU",
}


@dataclass(frozen=True)
class Figure:
    """A row and what each side is asked for: ``spec`` is a window's ROW in
    bench/worker.py's protocol ("launch", "sync", "sgemm", "h2d:BYTES:pageable", ...)."""

    row: pairs.Row
    group: str
    spec: str
    default: bool = False


def _copies(group: str, prefix: str, label_head: str, sizes, pinned: bool, targets: dict,
            defaults=()) -> list[Figure]:
    out = []
    for direction in ("h2d", "d2h"):
        for size in sizes:
            label = SIZE_LABELS[size]
            name = f"{prefix}{'pinned_' if pinned else ''}{direction}_{label}"
            kind = "pinned" if pinned else "pageable"
            row = pairs.Row(name, f"{label_head}{direction.upper()} {label} ({kind})", "GB/s",
                            scale=size / 1e9, target=targets.get(size))
            out.append(Figure(row, group, f"{direction}:{size}:{kind}", size in defaults))
    return out


FIGURES: list[Figure] = [
    Figure(pairs.Row("launch_rate", "pipelined launches (launch())", "launch/s", target=0.50,
                     fmt=",.0f"), "api", "launch", default=True),
    Figure(pairs.Row("sync_roundtrip", "sync round trip (idle GPU)", "µs", scale=1e6,
                     higher_is_better=False, fmt=".1f"), "api", "sync", default=True),
    *_copies("api", "", "", (4 * KIB, MIB, 64 * MIB, GIB), False,
             {64 * MIB: 0.90, GIB: 0.90}, defaults=(64 * MIB,)),
    *_copies("api", "", "", (MIB, 64 * MIB, GIB), True, {64 * MIB: 0.80, GIB: 0.80},
             defaults=(64 * MIB,)),
    Figure(pairs.Row("sgemm_4096", "sgemm 4096 (same kernel)", "TFLOP/s",
                     scale=2 * SGEMM_N ** 3 / 1e12, target=0.95, fmt=".1f"), "api", "sgemm",
           default=True),
    Figure(pairs.Row("cupy_launch_rate", "RawKernel launches", "launch/s", target=0.50,
                     fmt=",.0f"), "cupy", "launch", default=True),
    Figure(pairs.Row("cupy_sync_roundtrip", "cudaDeviceSynchronize (idle GPU)", "µs", scale=1e6,
                     higher_is_better=False, fmt=".1f"), "cupy", "sync"),
    Figure(pairs.Row("shim_launch_rate", "pipelined launches (<<<>>>)", "launch/s", target=0.50,
                     fmt=",.0f"), "shim", "launch", default=True),
    Figure(pairs.Row("shim_sgemm_4096", "cuBLAS sgemm 4096", "TFLOP/s",
                     scale=2 * SGEMM_N ** 3 / 1e12, target=0.95, fmt=".1f"), "shim", "sgemm",
           default=True),
    *_copies("shim", "shim_", "cudaMemcpy ", (4 * KIB, 256 * KIB, 4 * MIB, 64 * MIB, GIB), False,
             {64 * MIB: 0.90, GIB: 0.90}),
    *_copies("shim", "shim_", "cudaMemcpy ", (64 * MIB, GIB), True, {64 * MIB: 0.80, GIB: 0.80}),
]
BY_NAME = {f.row.name: f for f in FIGURES}


def select(rows: list[str]) -> list[Figure]:
    """Figures by name, "default", "all" or a group ("api", "cupy", "shim"), in table order."""
    wanted = set()
    for r in rows:
        if r == "default":
            wanted |= {f.row.name for f in FIGURES if f.default}
        elif r == "all":
            wanted |= set(BY_NAME)
        elif r in GROUPS:
            wanted |= {f.row.name for f in FIGURES if f.group == r}
        elif r in BY_NAME:
            wanted.add(r)
        else:
            raise SystemExit(f"unknown row {r!r}: one of default, all, {', '.join(GROUPS)}, "
                             f"{', '.join(BY_NAME)}")
    return [f for f in FIGURES if f.row.name in wanted]


def parse_spec(spec: str) -> tuple[str, int, str]:
    """("h2d", 67108864, "pinned") from "h2d:67108864:pinned"; ("launch", 0, "") from "launch"."""
    parts = spec.split(":")
    if len(parts) == 3:
        return parts[0], int(parts[1]), parts[2]
    return spec, 0, ""


class InProcess:
    """A side in this process: every row's logic, over a few primitives a subclass gives.

    memset/h2d/d2h/sync as bench/checks.py describes them; dev_alloc(n) and
    pinned_alloc(n) (a NumPy uint8 array in page-locked memory); launches(n), and
    counter_set/counter_get for the counter they add to; sgemm(k), c_poison() and c_get()
    for the product of the inputs set up by sgemm_setup(a, b).
    """

    name = "?"
    reference = None  # the sgemm product to check against (cuBLAS's, computed natively)

    def __init__(self):
        self._buffers: dict = {}

    def window(self, spec: str, seed: int, seconds: float) -> dict:
        op, finish, verify = self.prepare(spec, seed)
        ops, elapsed = pairs.window(op, seconds, finish)
        return {"ops": ops, "seconds": elapsed, "check": verify(ops)}

    def prepare(self, spec: str, seed: int):
        """(op, finish, verify) of one window: data and poison set up here, untimed."""
        kind, size, mem = parse_spec(spec)
        if kind == "launch":
            start = checks.counter_start(seed)
            self.counter_set(start)
            self.sync()
            return (lambda: self.launches(checks.LAUNCH_BATCH)), self.sync, \
                (lambda ops: checks.counter(self.counter_get(), start, ops))
        if kind == "sync":
            return self.sync, None, (lambda ops: None)
        if kind == "sgemm":
            self.c_poison()
            self.sync()

            def batch():  # waited for: the GPU, not the queue, bounds how much is asked
                done = self.sgemm(SGEMM_BATCH)
                self.sync()
                return done
            return batch, self.sync, \
                (lambda ops: checks.matrix(self.c_get(), self.reference, SGEMM_RTOL))
        if kind not in ("h2d", "d2h") or mem not in ("pageable", "pinned"):
            raise ValueError(f"unknown row {spec!r}")
        dev = self.buffer("dev", size)
        host = self.buffer(mem, size, 0)  # what the timed copies read or write
        other = self.buffer(mem, size, 1)  # the pattern's other copy, or the read-back
        want = checks.fresh(size, seed)
        if kind == "h2d":
            host[:] = want
            self.memset(dev, checks.POISON)
            self.sync()

            def verify(ops):
                other[:] = checks.POISON ^ 0x5A
                self.d2h(other, dev, 0)
                problem = checks.first_difference(other, want)
                return problem and f"device memory after the window, read back: {problem}"

            return self._waited(lambda: self.h2d(dev, 0, host), size), self.sync, verify
        other[:] = want
        self.h2d(dev, 0, other)
        self.sync()
        host[:] = checks.POISON

        def verify(ops):
            problem = checks.first_difference(host, other)
            return problem and f"host memory after the window: {problem}"

        return self._waited(lambda: self.d2h(host, dev, 0), size), self.sync, verify

    def _waited(self, copy, size: int):
        """Copies in batches of about COPY_BATCH_BYTES, each waited for: asynchronous
        copies (pinned memory; the Python API's one-way ones) would otherwise queue far
        more work than a window, and the last wait would outlast the worker's timeout."""
        n = max(1, min(COPY_BATCH_MOST, COPY_BATCH_BYTES // size))

        def batch():
            for _ in range(n):
                copy()
            self.sync()
            return n
        return batch

    def buffer(self, kind: str, size: int, index: int = 0):
        """A device ("dev"), pageable or pinned buffer of ``size`` bytes, kept for the row."""
        import numpy as np

        key = (kind, size, index)
        if key not in self._buffers:
            if kind == "dev":
                self._buffers[key] = self.dev_alloc(size)
            elif kind == "pinned":
                self._buffers[key] = self.pinned_alloc(size)
            else:
                self._buffers[key] = np.empty(size, dtype=np.uint8)
        return self._buffers[key]

    def release(self) -> None:
        """Give back the row's buffers before the next row takes its own."""
        self._buffers.clear()

    def odd_sizes(self, seed: int) -> dict:
        """checks.odd_sizes() with pageable and with pinned host memory: None or what failed."""
        out = {}
        dev = self.buffer("dev", checks.CHECK_BYTES)
        for mem in ("pageable", "pinned"):
            n = checks.CHECK_BYTES + 2 * checks.GUARD
            try:
                out[mem] = checks.odd_sizes(self, dev, self.buffer(mem, n, 0),
                                            self.buffer(mem, n, 1), seed)
            except Exception as exc:  # a lane that raises fails its check, not the run
                out[mem] = f"{type(exc).__name__}: {exc}"
        self.release()
        return out


class CoreLauncher:
    """cuda.core's launch(): the native front end that hvgpu.guest's API follows."""

    def __init__(self, cp):
        import numpy as np

        try:
            import cuda.core as core

            core.launch  # noqa: B018 -- before 0.4 it all lived in cuda.core.experimental
        except (ImportError, AttributeError):
            import cuda.core.experimental as core
        dev = core.Device(0)
        dev.set_current()
        program = core.Program(checks.TICK, code_type="c++",
                               options=core.ProgramOptions(arch=f"sm_{dev.arch}"))
        self.kernel = program.compile("cubin").get_kernel("tick")
        self.stream = dev.default_stream
        self.config = core.LaunchConfig(grid=1, block=32)
        self.count = dev.allocate(4)
        dev.sync()
        self.ptr = int(self.count.handle)
        self._launch, self._one = core.launch, np.int32(1)
        version = getattr(core, "__version__", None)
        if version is None:
            import importlib.metadata
            version = importlib.metadata.version("cuda-core")
        self.front_end = f"cuda.core {version} launch()"

    def launches(self, n: int) -> int:
        launch, stream, config, kernel, count, one = (self._launch, self.stream, self.config,
                                                      self.kernel, self.count, self._one)
        for _ in range(n):
            launch(stream, config, kernel, count, one)
        return n


class BindingsLauncher:
    """cuda-python's cuLaunchKernel, its arguments converted on every call as cuda.core's
    and hvgpu.guest's are: the native front end where cuda.core is not installed."""

    def __init__(self, cp):
        import ctypes

        from cuda.bindings import driver

        self.driver = driver
        raw = cp.RawKernel(checks.TICK, "tick")
        self._keep = cp.zeros(1, dtype=cp.uint32)
        self.ptr = self._keep.data.ptr
        self.function = driver.CUfunction(init_value=raw.kernel.ptr)
        self._raw = raw  # owns the module the function lives in
        self.stream = driver.CUstream(0)
        self.params = ((self.ptr, 1), (ctypes.c_void_p, ctypes.c_int))
        import cuda.bindings
        self.front_end = f"cuda.bindings {cuda.bindings.__version__} cuLaunchKernel"

    def launches(self, n: int) -> int:
        launch, f, s, params = self.driver.cuLaunchKernel, self.function, self.stream, self.params
        result = None
        for _ in range(n):
            result = launch(f, 1, 1, 1, 32, 1, 1, 0, s, params, 0)
        if result[0] != self.driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel: {result[0]}")
        return n


class Native(InProcess):
    """CuPy (cudaMemcpy, the same sgemm source) and cuda.core (launches) in this process."""

    name = "native"

    def __init__(self):
        super().__init__()
        import cupy as cp
        import cupyx

        self.cp, self.cupyx = cp, cupyx
        self.launcher, self.launcher_problem = None, None
        self.launcher_notes = problems = []  # why a front end before the one used was not
        for kind in (CoreLauncher, BindingsLauncher):
            try:
                self.launcher = kind(cp)
                break
            except Exception as exc:  # this front end is missing: the next, or no launch row
                problems.append(f"{kind.__name__}: {type(exc).__name__}: {exc}")
        if self.launcher is None:
            self.launcher_problem = "no native Python launch() to compare with (" + \
                "; ".join(problems) + ")"
        self.sgemm_kernel = cp.RawKernel(SGEMM, "sgemm")

    def dev_alloc(self, n):
        return self.cp.empty(n, dtype=self.cp.uint8)

    def release(self):
        super().release()
        # CuPy's pools would keep the row's GiB for a row that never asks for them again
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()

    def pinned_alloc(self, n):
        import numpy as np

        return self.cupyx.empty_pinned(n, dtype=np.uint8)

    def memset(self, dev, byte):
        self.cp.cuda.runtime.memset(dev.data.ptr, byte, dev.nbytes)

    def h2d(self, dev, offset, host):
        self.cp.cuda.runtime.memcpy(dev.data.ptr + offset, host.ctypes.data, host.nbytes, 1)

    def d2h(self, host, dev, offset):
        self.cp.cuda.runtime.memcpy(host.ctypes.data, dev.data.ptr + offset, host.nbytes, 2)

    def sync(self):
        self.cp.cuda.runtime.deviceSynchronize()

    def launches(self, n):
        return self.launcher.launches(n)

    def counter_set(self, value):
        import numpy as np

        v = np.array([value], dtype=np.uint32)
        self.cp.cuda.runtime.memcpy(self.launcher.ptr, v.ctypes.data, 4, 1)

    def counter_get(self):
        import numpy as np

        v = np.zeros(1, dtype=np.uint32)
        self.cp.cuda.runtime.memcpy(v.ctypes.data, self.launcher.ptr, 4, 2)
        return int(v[0])

    def sgemm_setup(self, a, b):
        cp = self.cp
        self.a, self.b = cp.asarray(a), cp.asarray(b)
        self.c = cp.empty_like(self.a)
        self.reference = cp.asnumpy(self.a @ self.b)  # cuBLAS's product
        self.n = cp.int32(a.shape[0])
        self.grid = (a.shape[0] // 64, a.shape[0] // 64)

    def sgemm(self, k):
        for _ in range(k):
            self.sgemm_kernel(self.grid, (256,), (self.a, self.b, self.c, self.n))
        return k

    def c_poison(self):
        self.cp.cuda.runtime.memset(self.c.data.ptr, checks.POISON, self.c.nbytes)

    def c_get(self):
        return self.cp.asnumpy(self.c)


class Hvgpu(InProcess):
    """hvgpu.guest's Python API over its own connection to the agent."""

    name = "hvgpu"

    def __init__(self, address: str):
        super().__init__()
        from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch

        self.conn = Connection(address)
        self.dev = Device(connection=self.conn)
        self._launch, self._config = launch, LaunchConfig(grid=1, block=32)
        self.tick = Program(checks.TICK, connection=self.conn).compile().get_kernel("tick")
        self.sgemm_kernel = Program(SGEMM, connection=self.conn).compile().get_kernel("sgemm")
        self.count = self.dev.allocate(4)
        self._pinned: list = []
        self.LaunchConfig = LaunchConfig

    def dev_alloc(self, n):
        return self.dev.allocate(n)

    def pinned_alloc(self, n):
        import numpy as np

        memory = self.dev.pinned(n)
        self._pinned.append(memory)
        return np.frombuffer(memory.view, dtype=np.uint8)

    def release(self):
        super().release()
        pinned, self._pinned = self._pinned, []
        for memory in pinned:
            try:
                memory.close()
            except BufferError:  # a view still held somewhere: freed with the process
                pass

    def memset(self, dev, byte):
        dev.fill(byte)

    def h2d(self, dev, offset, host):
        dev.copy_from(host, offset=offset)

    def d2h(self, host, dev, offset):
        dev.copy_to(host, offset=offset)

    def sync(self):
        self.dev.sync()

    def launches(self, n):
        # The public call, its arguments packed every time, as cuda.core's launch() does.
        import numpy as np

        launch, kernel, config, count, one = (self._launch, self.tick, self._config, self.count,
                                              np.int32(1))
        for _ in range(n):
            launch(kernel, config, count, one)
        return n

    def counter_set(self, value):
        import numpy as np

        self.count.copy_from(np.array([value], dtype=np.uint32))

    def counter_get(self):
        import numpy as np

        v = np.zeros(1, dtype=np.uint32)
        self.count.copy_to(v)
        return int(v[0])

    def sgemm_setup(self, a, b):
        self.a, self.b, self.c = (self.dev.allocate(a.nbytes) for _ in range(3))
        self.a.copy_from(a)
        self.b.copy_from(b)
        self.shape = a.shape
        n = a.shape[0]
        self.sgemm_config = self.LaunchConfig(grid=(n // 64, n // 64), block=256)
        self.n = n

    def sgemm(self, k):
        for _ in range(k):
            self._launch(self.sgemm_kernel, self.sgemm_config, self.a, self.b, self.c, self.n)
        return k

    def c_poison(self):
        self.c.fill(checks.POISON)

    def c_get(self):
        import numpy as np

        out = np.empty(self.shape, dtype=np.float32)
        self.c.copy_to(out)
        return out

    def close(self):
        self.release()
        self.conn.close()


class Session:
    """Everything the chosen figures are measured with, set up before any window is
    timed: the in-process sides, the C program and the CuPy worker on both sides."""

    def __init__(self, address: str, figures: list[Figure], logs: Path):
        self.address, self.figures, self.logs = address, figures, logs
        self.groups = {f.group for f in figures}
        self.sides: dict[str, dict] = {}  # group -> {"native": side, "hvgpu": side}
        self.workers: list[Worker] = []
        self.problems: dict[str, str] = {}  # group -> why it has no sides
        self.checks: dict = {}  # group -> side -> {"pageable": ..., "pinned": ...}
        self.info: dict = {"front_ends": {}}

    def start(self) -> "Session":
        """Start the worker processes (they set up while start_in_process() runs)."""
        if "shim" in self.groups:
            self._start_workers("shim", self._shim_commands)
        if "cupy" in self.groups:
            self._start_workers("cupy", self._cupy_commands)
        return self

    def _start_workers(self, group, commands):
        try:
            native_cmd, hvgpu_cmd, native_env, hvgpu_env = commands()
        except Exception as exc:  # nvcc missing, the shim not built, ...
            self.problems[group] = f"{type(exc).__name__}: {exc}"
            print(f"{group} rows skipped: {self.problems[group]}", flush=True)
            return
        pair = {}
        for side, cmd, env in (("native", native_cmd, native_env),
                               ("hvgpu", hvgpu_cmd, hvgpu_env)):
            w = Worker(f"{group}-{side}", cmd, env=env, cwd=ROOT,
                       log=self.logs / f"data_lane-{group}-{side}.log")
            self.workers.append(w.start())
            pair[side] = w
        self.sides[group] = pair

    def _shim_env(self) -> tuple[dict, dict]:
        from hvgpu.guest.shim import library

        native = dict(os.environ)
        native.pop("HVGPU_AGENT", None)
        hv = dict(native, HVGPU_AGENT=self.address)
        hv["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(library().parent)] + [p for p in native.get("LD_LIBRARY_PATH", "").split(
                os.pathsep) if p])
        return native, hv

    def _shim_commands(self):
        from bench import toolkit

        nvcc, cublas = toolkit.nvcc(), toolkit.cublas()
        if nvcc is None or cublas is None:
            raise RuntimeError("nvcc or cuBLAS not found")
        exe = Path(tempfile.mkdtemp(prefix="hvgpu-shim-bench-")) / "shim_bench"
        build = subprocess.run([nvcc, "-O2", "-arch=sm_90", "-o", str(exe),
                                str(ROOT / "bench" / "shim_bench.cu"), f"-I{cublas[0]}",
                                f"-L{cublas[1]}", "-lcublas", f"-Xlinker=-rpath={cublas[1]}"],
                               capture_output=True, text=True)
        if build.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n{build.stderr[-2000:]}")
        native, hv = self._shim_env()
        cmd = [str(exe), str(SGEMM_N)]
        return cmd, cmd, native, hv

    def _cupy_commands(self):
        native, _ = self._shim_env()
        hv = dict(native)  # hvgpu-guest run puts the shim first on the library path itself
        py = [sys.executable, "-X", "faulthandler"]
        native_cmd = py + ["-m", "bench.cupy_launch"]
        hvgpu_cmd = py + ["-m", "hvgpu.guest.cli", "--agent", self.address, "run", "--",
                          *native_cmd]
        return native_cmd, hvgpu_cmd, native, hv

    def start_in_process(self) -> None:
        """The Python API's sides, the sgemm inputs and their reference, and the odd-size
        checks: nothing here is timed."""
        if "api" not in self.groups:
            return
        try:
            self._start_api()
        except Exception as exc:  # the Python API rows fail; the other groups still run
            self.problems["api"] = f"{type(exc).__name__}: {exc}"
            print(f"api rows fail: {self.problems['api']}", flush=True)

    def _start_api(self) -> None:
        import numpy as np

        native, hv = Native(), Hvgpu(self.address)
        self.sides["api"] = {"native": native, "hvgpu": hv}
        self.info["front_ends"]["launch_rate"] = {
            "native": native.launcher.front_end if native.launcher else None,
            "hvgpu": "hvgpu.guest.launch()", "not_used": native.launcher_notes}
        if any(f.spec == "sgemm" and f.group == "api" for f in self.figures):
            rng = np.random.default_rng(0)
            a = rng.standard_normal((SGEMM_N, SGEMM_N), dtype=np.float32)
            b = rng.standard_normal((SGEMM_N, SGEMM_N), dtype=np.float32)
            native.sgemm_setup(a, b)
            hv.sgemm_setup(a, b)
            hv.reference = native.reference
        self.checks["api"] = {side: s.odd_sizes(seed=1) for side, s in self.sides["api"].items()}

    def first_kernel(self) -> None:
        """A new guest's connect, compile, allocate, launch and synchronize, timed once
        everything else is warm and idle. The source is new to the agent's compile
        cache, as a program's first kernel is."""
        from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch

        try:
            t0 = time.perf_counter()
            with Connection(self.address) as first:
                source = checks.TICK + f"// first kernel of run {time.time_ns()}\n"
                k = Program(source, connection=first).compile().get_kernel("tick")
                buf = Device(connection=first).allocate(64)
                launch(k, LaunchConfig(block=32), buf, 1)
                Device(connection=first).sync()
                self.info["connect_to_first_kernel_s"] = time.perf_counter() - t0
        except Exception as exc:  # a footnote, not a row: say so and go on
            print(f"first kernel failed: {type(exc).__name__}: {exc}", flush=True)

    def wait_ready(self) -> None:
        for group in ("shim", "cupy"):
            if group not in self.sides:
                continue
            try:
                replies = {side: w.ready() for side, w in self.sides[group].items()}
            except WorkerFailed as exc:
                self.problems[group] = str(exc)
                print(f"{group} rows fail: {exc}", flush=True)
                continue
            if group == "shim":
                self.checks["shim"] = {side: {"pageable and pinned": r.get("checks")}
                                       for side, r in replies.items()}
            self.info[f"{group}_ready"] = replies

    def measure(self, pairs_n: int, seconds: float) -> dict:
        results = {}
        for index, fig in enumerate(self.figures):
            results[fig.row.name] = self._measure_one(index, fig, pairs_n, seconds)
            e = results[fig.row.name]
            print(f"{fig.row.name:26s} {e['status']:8s} {pairs.value_cell(e, 'native', fig.row.fmt):>22s}"
                  f" {pairs.value_cell(e, 'hvgpu', fig.row.fmt):>22s}  {pairs.ratio_cell(e)}",
                  flush=True)
        return results

    def _measure_one(self, index: int, fig: Figure, pairs_n: int, seconds: float) -> dict:
        if fig.group in self.problems:
            return pairs.entry(fig.row, None, [self.problems[fig.group]])
        sides = self.sides.get(fig.group)
        if sides is None:
            return pairs.entry(fig.row, None, ["its sides were not set up"])
        if fig.group == "api" and fig.spec == "launch" and sides["native"].launcher is None:
            return pairs.entry(fig.row, None, [], skipped=sides["native"].launcher_problem)
        failures = []
        kind = parse_spec(fig.spec)[0]
        if kind in ("h2d", "d2h"):  # a lane that fails odd sizes fails its copy rows too
            mem = parse_spec(fig.spec)[2]
            for side, found in self.checks.get(fig.group, {}).items():
                for what, problem in found.items():
                    if problem and (what == mem or what == "pageable and pinned"):
                        failures.append(f"{side}, odd sizes ({what}): {problem}")
        base = 1000 * (index + 1)
        try:
            for side in pairs.SIDES:  # first use (module loads, staging, page tables) untimed
                sides[side].window(fig.spec, base, min(WARM_S, seconds))
            windows = pairs.run_pairs(
                lambda side, pair: sides[side].window(fig.spec, base + 2 * pair + 1 +
                                                      pairs.SIDES.index(side), seconds), pairs_n)
        except Exception as exc:  # the row fails; the run goes on with the next one
            return pairs.entry(fig.row, None, failures + [f"{type(exc).__name__}: {exc}"[:2000]])
        finally:
            for side in sides.values():
                if isinstance(side, InProcess):
                    side.release()
        e = pairs.entry(fig.row, windows, failures)
        if fig.row.name == "sync_roundtrip" or fig.row.name == "cupy_sync_roundtrip":
            e["target_us"] = SYNC_TARGET_US
        return e

    def ping_us(self, seconds: float) -> float | None:
        """hvgpu's PING (transport and executor, no CUDA), for the table's footnote."""
        sides = self.sides.get("api")
        if sides is None:
            return None
        hv = sides["hvgpu"]
        try:
            ops, elapsed = pairs.window(lambda: hv.conn.call("PING"), seconds)
        except Exception as exc:  # a footnote, not a row: say so and go on
            print(f"PING failed: {type(exc).__name__}: {exc}", flush=True)
            return None
        return elapsed / ops * 1e6

    def close(self) -> None:
        for w in self.workers:
            w.close()
        api = self.sides.get("api")
        if api:
            try:
                api["hvgpu"].close()
            except Exception as exc:  # the run's figures are taken; closing is tidying up
                print(f"closing hvgpu's connection: {type(exc).__name__}: {exc}", flush=True)


def start_agent(local_region: int = 4 << 30):
    """An agent on a unix socket, the whole GPU: pinned 1 GiB buffers both ways and the
    staging slots fit in ``local_region`` of regions per connection."""
    from hvgpu.host.agent import Agent, AgentConfig

    tmp = Path(tempfile.mkdtemp(prefix="hvgpu-bench-"))
    address = f"unix://{tmp / 'agent.sock'}"
    agent = Agent(AgentConfig(listen=[address], vsock_port=None, cache_dir=str(tmp / "cache"),
                              log_level=os.environ.get("HVGPU_BENCH_LOG", "WARNING"),
                              local_region=local_region))
    agent.start()
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    return agent, address


def machine() -> dict:
    m = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import cupy as cp

        props = cp.cuda.runtime.getDeviceProperties(0)
        m.update(gpu=props["name"].decode(), driver=cp.cuda.runtime.driverGetVersion(),
                 cupy=cp.__version__)
    except Exception as exc:  # reported, not fatal: the figures say what ran
        m["gpu"] = f"unknown ({type(exc).__name__})"
    try:
        import cuda.bindings

        m["cuda_bindings"] = cuda.bindings.__version__
    except ImportError:
        m["cuda_bindings"] = None
    return m


def document(session: Session, results: dict, pairs_n: int, seconds: float, quick: bool,
             ping_us: float | None) -> dict:
    return {
        "benchmark": "data_lane",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "method": pairs.method(pairs_n, seconds, quick),
        "groups": {g: GROUPS[g] for g in GROUPS if g in session.groups},
        "front_ends": session.info["front_ends"],
        "connect_to_first_kernel_s": session.info.get("connect_to_first_kernel_s"),
        "hvgpu_ping_us": ping_us,
        "checks": session.checks,
        "problems": session.problems,
        "sync_target_us": SYNC_TARGET_US,
        "results": results,
    }


def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_lane.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "data_lane.md").write_text(table(doc))
    plot(doc, out / "data_lane.png")


def run(out: Path, figures: list[Figure], pairs_n: int, seconds: float, quick: bool) -> dict:
    logs = out / "logs"
    agent, address = start_agent()
    session = Session(address, figures, logs)
    try:
        session.start()
        session.start_in_process()
        session.wait_ready()
        session.first_kernel()
        print(f"data lane: {len(figures)} rows x {pairs_n} pairs x 2 windows of "
              f"{seconds:g} s", flush=True)
        results = session.measure(pairs_n, seconds)
        ping = session.ping_us(seconds)
    finally:
        session.close()
        agent.stop()
    doc = document(session, results, pairs_n, seconds, quick, ping)
    write(doc, out)
    print(table(doc), flush=True)
    return doc


def _target_cell(fig_row: pairs.Row, e: dict) -> str:
    if "target_us" in e:
        if "hvgpu" not in e or not isinstance(e["hvgpu"], (int, float)):
            return f"≤ {e['target_us']:.0f} µs"
        ok = "met" if e["hvgpu"] <= e["target_us"] else "missed"
        return f"hvgpu ≤ {e['target_us']:.0f} µs ({ok})"
    t = e.get("target")
    if not t:
        return ""
    if e["status"] == "ok":
        return f"≥ {t:.2f} ({'met' if e['ratio'] >= t else 'missed'})"
    return f"≥ {t:.2f}"


def table(doc: dict) -> str:
    """The page's table from a results file: figures by group, the footer with date, pairs,
    window and spread rule, what each side's front end was, and what was checked."""
    r = doc["results"]
    m = doc["method"]
    rows = [f"| figure | native | hvgpu | hvgpu / native (median of {m['pairs']} pairs, range) "
            f"| target |", "| --- | --- | --- | --- | --- |"]
    group_titles = {"api": "**Python API** (native: CuPy, cuda.core)",
                    "cupy": "**CuPy through the libcuda shim** (`hvgpu-guest run`)",
                    "shim": "**unmodified CUDA program through the libcuda shim** (static cudart)"}
    for group in GROUPS:
        figs = [f for f in FIGURES if f.group == group and f.row.name in r]
        if not figs:
            continue
        rows.append(f"| {group_titles[group]} | native | hvgpu | | |")
        for f in figs:
            e = r[f.row.name]
            rows.append(f"| {f.row.label} | {pairs.value_cell(e, 'native', f.row.fmt)} | "
                        f"{pairs.value_cell(e, 'hvgpu', f.row.fmt)} | {pairs.ratio_cell(e)} | "
                        f"{_target_cell(f.row, e)} |")
    mach = doc["machine"]
    notes = [f"{mach.get('gpu')}, driver {mach.get('driver')}, CuPy {mach.get('cupy')}, "
             f"cuda-bindings {mach.get('cuda_bindings')}, {mach.get('cpus')} CPUs.",
             pairs.footer(doc)]
    fe = doc.get("front_ends", {}).get("launch_rate")
    if fe and fe.get("native"):
        notes.append(f"Python API launches: {fe['native']} natively, {fe['hvgpu']} through hvgpu.")
    failed = [f"{g}/{side}: {p}" for g, by_side in doc.get("checks", {}).items()
              for side, found in by_side.items() for p in found.values() if p]
    checked = ", ".join(g for g in doc.get("checks", {}))
    if checked:
        notes.append("Odd-size copies at odd offsets, both ways, pageable and pinned, with "
                     f"guard bytes ({checked}): " +
                     ("all as sent." if not failed else "**failed**: " + "; ".join(failed)))
    extra = []
    if doc.get("hvgpu_ping_us") is not None:
        extra.append(f"hvgpu PING (transport and executor, no CUDA): "
                     f"{doc['hvgpu_ping_us']:.1f} µs")
    if doc.get("connect_to_first_kernel_s") is not None:
        extra.append(f"connect to first kernel done: {doc['connect_to_first_kernel_s']:.2f} s")
    if extra:
        notes.append("; ".join(extra) + ".")
    for rerun in doc.get("reruns", []):
        notes.append(f"Rows {', '.join(rerun['rows'])}: measured again at {rerun['when']} "
                     f"({rerun['why']}).")
    return "\n".join(rows) + "\n\n" + " ".join(notes) + "\n"


def plot(doc: dict, path: Path) -> None:
    """Each row's median ratio with its range; noisy rows grey, failed rows left out."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot")
        return
    names = [f.row.name for f in FIGURES if f.row.name in doc["results"] and
             doc["results"][f.row.name]["status"] in ("ok", "noisy")]
    if not names:
        return
    r = doc["results"]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(names) + 2), 4.5))
    for i, n in enumerate(names):
        e = r[n]
        color = "#4477aa" if e["status"] == "ok" else "#bbbbbb"
        ax.bar(i, e["ratio"], color=color)
        ax.errorbar(i, e["ratio"], yerr=[[e["ratio"] - e["min"]], [e["max"] - e["ratio"]]],
                    color="black", capsize=3, lw=1)
        if e.get("target"):
            ax.hlines(e["target"], i - 0.4, i + 0.4, colors="#cc3311", linestyles="dashed")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), [BY_NAME[n].row.label for n in names], rotation=60,
                  ha="right", fontsize=7)
    ax.set_ylabel("hvgpu / native (above 1: hvgpu better)")
    m = doc["method"]
    ax.set_title(f"hvgpu data lane on {doc['machine'].get('gpu')}, {doc['when']}: median of "
                 f"{m['pairs']} pairs, range; grey: noisy; dashed: target"
                 + (" (QUICK RUN)" if m["quick"] else ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_page(results: Path, page: Path) -> None:
    from bench.readme import publish

    doc = json.loads(results.read_text())
    why = pairs.unpublishable(doc)
    if why:
        raise SystemExit(f"{results} does not go into {page}: {why}")
    publish(page, "bench-table", table(doc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results and logs go here")
    ap.add_argument("--rows", nargs="+", default=["default"],
                    help="row names, groups (api, cupy, shim), 'default' or 'all'")
    pairs.arguments(ap)
    ap.add_argument("--render", nargs=2, type=Path, metavar=("JSON", "PAGE"),
                    help="rewrite the bench table of PAGE (docs/performance.md) and README's "
                         "headline table from a results file and exit")
    args = ap.parse_args()
    if args.render:
        render_page(*args.render)
        return 0
    if args.out is None:
        ap.error("--out DIR is needed (results and logs go there)")
    run(args.out, select(args.rows), args.pairs, pairs.window_seconds(args), args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
