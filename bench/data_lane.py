"""Data-lane benchmark: native CuPy against hvgpu, side by side, one run.

    python3 bench/data_lane.py --out bench/results          # on a GPU host
    python3 bench/data_lane.py --render results.json README.md

hvgpu's path is the full product path: guest API -> unix socket -> agent ->
executor process (own CUDA context) -> GPU. Native is CuPy in this process on
the same GPU. Each figure is measured for both in turn, in the same run, and
reported as a ratio. Writes data_lane.json, data_lane.png and data_lane.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NOOP = 'extern "C" __global__ void noop(float* x, int n) {}'

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

SIZES = [("4 KiB", 4 << 10, 2000), ("1 MiB", 1 << 20, 200), ("64 MiB", 64 << 20, 10),
         ("1 GiB", 1 << 30, 3)]
TARGETS = {"launch_rate": 0.50, "h2d_64 MiB": 0.90, "d2h_64 MiB": 0.90, "h2d_1 GiB": 0.90,
           "d2h_1 GiB": 0.90, "pinned_h2d_64 MiB": 0.80, "pinned_d2h_64 MiB": 0.80,
           "pinned_h2d_1 GiB": 0.80, "pinned_d2h_1 GiB": 0.80, "sgemm_4096": 0.95}
PINNED_SIZES = ("1 MiB", "64 MiB", "1 GiB")
SYNC_TARGET_US = 60.0


SHIM_TARGETS = {"shim_launch_rate": 0.50, "shim_sgemm_4096": 0.95,
                **{f"shim_{d}_{s}": 0.90 for d in ("h2d", "d2h") for s in ("64 MiB", "1 GiB")},
                **{f"shim_pinned_{d}_{s}": 0.80 for d in ("h2d", "d2h")
                   for s in ("64 MiB", "1 GiB")}}
SHIM_SIZES = ["4 KiB", "256 KiB", "4 MiB", "64 MiB", "1 GiB"]
SHIM_PINNED_SIZES = ["64 MiB", "1 GiB"]


def shim_figures(address: str, quick: bool, record, results: dict) -> None:
    """bench/shim_bench.cu built once (static cudart, cuBLAS), run natively and through the shim."""
    import subprocess

    from bench import toolkit
    from hvgpu.guest.shim import library

    nvcc, cublas = toolkit.nvcc(), toolkit.cublas()
    if nvcc is None or cublas is None:
        results["shim_skipped"] = "nvcc or cuBLAS not found"
        print("shim figures skipped: nvcc or cuBLAS not found", flush=True)
        return
    exe = Path(tempfile.mkdtemp(prefix="hvgpu-shim-bench-")) / "shim_bench"
    subprocess.run([nvcc, "-O2", "-arch=sm_90", "-o", str(exe), str(Path(__file__).parent /
                    "shim_bench.cu"), f"-I{cublas[0]}", f"-L{cublas[1]}", "-lcublas",
                    f"-Xlinker=-rpath={cublas[1]}"], check=True)
    env = dict(os.environ)
    env.pop("HVGPU_AGENT", None)
    args = [str(exe)] + (["quick"] if quick else [])
    native = json.loads(subprocess.run(args, env=env, capture_output=True, text=True,
                                       check=True).stdout)
    env["HVGPU_AGENT"] = address
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(library().parent),
                                              env.get("LD_LIBRARY_PATH", "")])
    run = subprocess.run(args, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        results["shim_failed"] = run.stderr[-2000:]
        print(f"shim run failed ({run.returncode}):\n{run.stderr[-2000:]}", flush=True)
        return
    shim = json.loads(run.stdout)
    notices = sorted({line for line in run.stderr.splitlines() if line.startswith("hvgpu:")})
    if notices:  # e.g. a driver call the shim does not implement, which the program needed
        results["shim_notices"] = notices
        print("shim said:\n" + "\n".join(notices), flush=True)
    record("shim_launch_rate", "launch/s", native["launch_rate"], shim["launch_rate"])
    record("shim_sgemm_4096", "TFLOP/s", native["sgemm_4096"], shim["sgemm_4096"])
    for direction in ("h2d", "d2h"):
        for label in SHIM_SIZES:
            key = f"{direction}_{label}"
            record(f"shim_{key}", "GB/s", native[key], shim[key])
        for label in SHIM_PINNED_SIZES:
            key = f"pinned_{direction}_{label}"
            if key in native and key in shim:
                record(f"shim_{key}", "GB/s", native[key], shim[key])


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Native:
    def __init__(self):
        import cupy as cp
        import cupyx

        self.cp, self.cupyx = cp, cupyx
        self.noop = cp.RawKernel(NOOP, "noop")
        self.sgemm = cp.RawKernel(SGEMM, "sgemm")
        self.scratch = cp.zeros(256, dtype=cp.float32)

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def launches(self, n):
        k, x, zero = self.noop, self.scratch, self.cp.int32(0)
        t0 = time.perf_counter()
        for _ in range(n):
            k((1,), (32,), (x, zero))
        self.sync()
        return n / (time.perf_counter() - t0)

    def h2d(self, host, dev):
        self.cp.cuda.runtime.memcpy(dev.data.ptr, host.ctypes.data, host.nbytes, 1)

    def d2h(self, dev, host):
        self.cp.cuda.runtime.memcpy(host.ctypes.data, dev.data.ptr, host.nbytes, 2)


class Hvgpu:
    def __init__(self, address):
        from hvgpu.guest import Connection, Device, Program

        self.conn = Connection(address)
        self.dev = Device(connection=self.conn)
        self.noop = Program(NOOP, connection=self.conn).compile().get_kernel("noop")
        self.sgemm = Program(SGEMM, connection=self.conn).compile().get_kernel("sgemm")
        self.scratch = self.dev.allocate(1024)

    def launches(self, n):
        # The public call, packing its arguments every time, as CuPy's kernel call does.
        import numpy as np

        from hvgpu.guest import LaunchConfig, launch

        k, x, zero, config = self.noop, self.scratch, np.int32(0), LaunchConfig(1, 32)
        t0 = time.perf_counter()
        for _ in range(n):
            launch(k, config, x, zero)
        self.dev.sync()
        return n / (time.perf_counter() - t0)


def run(out: Path, quick: bool) -> dict:
    import numpy as np

    from hvgpu.guest import Connection, LaunchConfig, launch
    from hvgpu.host.agent import Agent, AgentConfig

    tmp = Path(tempfile.mkdtemp(prefix="hvgpu-bench-"))
    address = f"unix://{tmp / 'agent.sock'}"
    # shared memory for the pinned 1 GiB buffers both ways and the staging slots
    agent = Agent(AgentConfig(listen=[address], vsock_port=None, cache_dir=str(tmp / "cache"),
                              log_level="WARNING", local_shm=4 << 30))
    agent.start()
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    results: dict = {}

    def record(name, unit, native, hv, higher_is_better=True):
        ratio = hv / native if higher_is_better else native / hv
        results[name] = {"unit": unit, "native": native, "hvgpu": hv, "ratio": ratio}
        print(f"{name:18s} native {native:12.3f} {unit:8s} hvgpu {hv:12.3f} {unit:8s} "
              f"ratio {ratio:6.2f}", flush=True)

    try:
        t0 = time.perf_counter()
        first = Connection(address)
        from hvgpu.guest import Device, Program
        k = Program(NOOP, connection=first).compile().get_kernel("noop")
        buf = Device(connection=first).allocate(64)
        launch(k, LaunchConfig(block=32), buf, 0)
        Device(connection=first).sync()
        connect_to_first_kernel = time.perf_counter() - t0
        first.close()

        native, hv = Native(), Hvgpu(address)
        import cupy as cp

        # launch throughput
        n_launch = 20_000 if quick else 100_000
        native.launches(1000)
        hv.launches(1000)
        rn = statistics.median(native.launches(n_launch) for _ in range(3))
        rh = statistics.median(hv.launches(n_launch) for _ in range(3))
        record("launch_rate", "launch/s", rn, rh)

        # synchronisation round trip on an idle GPU
        reps = 500 if quick else 3000
        sn = median_time(native.sync, reps) * 1e6
        sh = median_time(hv.dev.sync, reps) * 1e6
        ping = median_time(lambda: hv.conn.call("PING"), reps) * 1e6
        record("sync_roundtrip", "us", sn, sh, higher_is_better=False)
        results["sync_roundtrip"]["hvgpu_ping_us"] = ping

        # copies
        rng = np.random.default_rng(0)
        for label, size, reps in SIZES:
            if quick:
                reps = max(2, reps // 5)
            host = rng.integers(0, 255, size, dtype=np.uint8)
            back = np.empty_like(host)
            dn = cp.empty(size, dtype=cp.uint8)
            dh = hv.dev.allocate(size)
            pinned = native.cupyx.empty_pinned(size, dtype=np.uint8)
            pinned[:] = host

            def hv_h2d():
                dh.copy_from(host)
                hv.dev.sync()

            for _ in range(2):  # warm: staging, page tables
                native.h2d(host, dn), hv_h2d(), native.d2h(dn, back), dh.copy_to(back)
            tn = median_time(lambda: native.h2d(host, dn), reps)
            tp = median_time(lambda: native.h2d(pinned, dn), reps)
            th = median_time(hv_h2d, reps)
            record(f"h2d_{label}", "GB/s", size / tn / 1e9, size / th / 1e9)
            results[f"h2d_{label}"]["native_pinned"] = size / tp / 1e9
            tn = median_time(lambda: native.d2h(dn, back), reps)
            tp = median_time(lambda: native.d2h(dn, pinned), reps)
            th = median_time(lambda: dh.copy_to(back), reps)
            assert np.array_equal(back, host), "hvgpu D2H returned wrong bytes"
            record(f"d2h_{label}", "GB/s", size / tn / 1e9, size / th / 1e9)
            results[f"d2h_{label}"]["native_pinned"] = size / tp / 1e9
            if label in PINNED_SIZES:  # pinned against pinned: Device.pinned, CuPy's pinned
                hp = hv.dev.pinned(size)
                hview = np.frombuffer(hp.view, dtype=np.uint8)
                hview[:] = host

                def hv_pinned_h2d():
                    dh.copy_from(hview)
                    hv.dev.sync()

                hv_pinned_h2d(), dh.copy_to(hview)
                tp = median_time(lambda: native.h2d(pinned, dn), reps)
                th = median_time(hv_pinned_h2d, reps)
                record(f"pinned_h2d_{label}", "GB/s", size / tp / 1e9, size / th / 1e9)
                hview[:] = 0
                tp = median_time(lambda: native.d2h(dn, pinned), reps)
                th = median_time(lambda: dh.copy_to(hview), reps)
                assert np.array_equal(hview, host), "hvgpu pinned D2H returned wrong bytes"
                record(f"pinned_d2h_{label}", "GB/s", size / tp / 1e9, size / th / 1e9)
                del hview
                hp.close()
            dh.close()
            dn = pinned = None  # the GPU memory goes back before the next size
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()

        # sgemm 4096: the same kernel source both ways, wall time incl. launch
        n = 4096
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        an, bn, cn = cp.asarray(a), cp.asarray(b), cp.empty((n, n), dtype=cp.float32)
        ah, bh, ch = (hv.dev.allocate(a.nbytes) for _ in range(3))
        ah.copy_from(a)
        bh.copy_from(b)
        cfg = LaunchConfig(grid=(n // 64, n // 64), block=256)
        iters = 5 if quick else 20

        def native_sgemm():
            for _ in range(iters):
                native.sgemm((n // 64, n // 64), (256,), (an, bn, cn, cp.int32(n)))
            native.sync()

        def hv_sgemm():
            for _ in range(iters):
                launch(hv.sgemm, cfg, ah, bh, ch, n)
            hv.dev.sync()

        native_sgemm(), hv_sgemm()
        flop = 2 * n ** 3 * iters
        tn = median_time(native_sgemm, 3)
        th = median_time(hv_sgemm, 3)
        record("sgemm_4096", "TFLOP/s", flop / tn / 1e12, flop / th / 1e12)
        c = np.empty((n, n), dtype=np.float32)
        ch.copy_to(c)
        ref = cp.asnumpy(an @ bn)
        err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
        assert err < 1e-4, f"hvgpu sgemm is wrong: relative error {err}"
        results["sgemm_4096"]["relative_error_vs_cublas"] = err
        cp.cuda.Device().synchronize()
        t = median_time(lambda: (an @ bn, native.sync()), 3)
        results["sgemm_4096"]["cublas_tflops_for_reference"] = 2 * n ** 3 / t / 1e12
        hv.conn.close()
        shim_figures(address, quick, record, results)
    finally:
        agent.stop()

    import cuda.bindings
    props = cp.cuda.runtime.getDeviceProperties(0)
    doc = {
        "benchmark": "data_lane",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"gpu": props["name"].decode(), "driver": cp.cuda.runtime.driverGetVersion(),
                    "cupy": cp.__version__, "cuda_bindings": cuda.bindings.__version__,
                    "python": platform.python_version(), "cpus": os.cpu_count()},
        "path": "guest API -> unix socket -> agent -> executor process -> GPU",
        "quick": quick,
        "connect_to_first_kernel_s": connect_to_first_kernel,
        "results": results,
        "targets": {**TARGETS, **SHIM_TARGETS, "sync_roundtrip_us_max": SYNC_TARGET_US},
        "shim_path": "CUDA program (static cudart, cuBLAS) -> hvgpu libcuda.so.1 -> unix socket "
                     "-> agent -> executor process -> GPU",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_lane.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "data_lane.md").write_text(table(doc))
    plot(doc, out / "data_lane.png")
    print(table(doc))
    return doc


def table(doc: dict) -> str:
    r = doc["results"]
    rows = ["| figure | native | hvgpu | hvgpu / native | target |", "| --- | --- | --- | --- | --- |"]

    def row(name, label, fmt, target):
        e = r[name]
        rows.append(f"| {label} | {e['native']:{fmt}} {e['unit']} | {e['hvgpu']:{fmt}} "
                    f"{e['unit']} | {e['ratio']:.2f} | {target} |")

    row("launch_rate", "pipelined launches", ",.0f", "≥ 0.50")
    e = r["sync_roundtrip"]
    ok = "met" if e["hvgpu"] <= SYNC_TARGET_US else "missed"
    rows.append(f"| sync round trip (idle GPU) | {e['native']:.1f} µs | {e['hvgpu']:.1f} µs "
                f"| {e['ratio']:.2f} | ≤ {SYNC_TARGET_US:.0f} µs ({ok}) |")
    def target(name):
        t = doc["targets"].get(name)
        return f"≥ {t:.2f}" if t else ""

    for direction in ("h2d", "d2h"):
        for label, _, _ in SIZES:
            name = f"{direction}_{label}"
            row(name, f"{direction.upper()} {label} (pageable)", ".2f", target(name))
        for label in PINNED_SIZES:
            name = f"pinned_{direction}_{label}"
            if name in r:
                row(name, f"{direction.upper()} {label} (pinned)", ".2f", target(name))
    row("sgemm_4096", "sgemm 4096 (same kernel)", ".1f", "≥ 0.95")
    if "shim_launch_rate" in r:
        rows.append("| **unmodified CUDA program through the libcuda shim** (static cudart) | "
                    "native driver | shim | | |")
        row("shim_launch_rate", "pipelined launches (<<<>>>)", ",.0f", "≥ 0.50")
        row("shim_sgemm_4096", "cuBLAS sgemm 4096", ".1f", "≥ 0.95")
        for direction in ("h2d", "d2h"):
            for label in SHIM_SIZES:
                name = f"shim_{direction}_{label}"
                row(name, f"cudaMemcpy {direction.upper()} {label} (pageable)", ".2f",
                    target(name))
            for label in SHIM_PINNED_SIZES:
                name = f"shim_pinned_{direction}_{label}"
                if name in r:
                    row(name, f"cudaMemcpy {direction.upper()} {label} (cudaMallocHost)",
                        ".2f", target(name))
    m = doc["machine"]
    rows.append("")
    rows.append(f"{m['gpu']}, driver {m['driver']}, CuPy {m['cupy']}, cuda-bindings "
                f"{m['cuda_bindings']}, {m['cpus']} CPUs, {doc['when']}. hvgpu PING (transport "
                f"and executor, no CUDA): {r['sync_roundtrip']['hvgpu_ping_us']:.1f} µs; "
                f"connect to first kernel done: {doc['connect_to_first_kernel_s']:.2f} s.")
    return "\n".join(rows) + "\n"


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot")
        return
    r = doc["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["launch_rate", "sync_roundtrip", "h2d_64 MiB", "d2h_64 MiB", "sgemm_4096"]
    ratios = [r[n]["ratio"] for n in names]
    ax1.bar(range(len(names)), ratios, color="#4477aa")
    for i, n in enumerate(names):
        target = doc["targets"].get(n)
        if target:
            ax1.hlines(target, i - 0.4, i + 0.4, colors="#cc3311", linestyles="dashed")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xticks(range(len(names)), ["launches", "sync RTT", "H2D 64M", "D2H 64M", "sgemm"])
    ax1.set_ylabel("hvgpu / native (higher is better)")
    ax1.set_title("hvgpu relative to native (dashed: target)")
    sizes = [s for _, s, _ in SIZES]
    for direction, style in (("h2d", "-"), ("d2h", "--")):
        for who, color in (("native", "#228833"), ("hvgpu", "#4477aa")):
            ax2.plot(sizes, [r[f"{direction}_{label}"][who] for label, _, _ in SIZES], style,
                     marker="o", color=color, label=f"{who} {direction.upper()}")
        ax2.plot(sizes, [r[f"{direction}_{label}"]["native_pinned"] for label, _, _ in SIZES],
                 style, marker=".", color="#aaaaaa", label=f"native pinned {direction.upper()}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("copy size (bytes)")
    ax2.set_ylabel("GB/s")
    ax2.set_title("copy bandwidth (pageable host memory)")
    ax2.legend(fontsize=7)
    fig.suptitle(f"hvgpu data lane on {doc['machine']['gpu']} ({doc['when']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render_readme(results: Path, readme: Path) -> None:
    from bench.readme import replace_table

    replace_table(readme, "bench-table", table(json.loads(results.read_text())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--render", nargs=2, type=Path, metavar=("JSON", "README"),
                    help="rewrite README's bench table from a results file and exit")
    args = ap.parse_args()
    if args.render:
        render_readme(*args.render)
        return 0
    run(args.out, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
