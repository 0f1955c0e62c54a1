"""Multi-tenant benchmark: guests sharing one GPU through slices, against native.

    python3 bench/multi_tenant.py --out bench/results        # on a GPU host with MPS

Every tenant is a separate guest process connected to its own VM's slice
(unix sockets bound to VM names, exactly as the agent routes hybrid-vsock
sockets) and runs the same compute-bound kernel, then a copy-heavy loop, for
a fixed time, all tenants at once. Reported per tenant: throughput relative to
one tenant running alone on a 100% slice, against its --compute share; and
the tenants' aggregate against one native CuPy process. While tenants run,
each slice's GPU utilisation is recorded over time from the agent's usage
snapshot (what `hvgpu agent --metrics` serves; NVML's per-process figures of
each slice's executor), so this needs no prometheus-client. Writes
multi_tenant.json, multi_tenant.png, multi_tenant_util.png (matplotlib, when
importable) and multi_tenant.md; --render JSON docs/performance.md publishes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BURN = r"""
extern "C" __global__ void burn(float* out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; ++i) { a = fmaf(a, b, 1e-7f); b = fmaf(b, 0.99999f, 1e-6f); }
    if (a == 12345.f) out[blockIdx.x] = a + b;
}
"""
ITERS = 2_000_000  # about 10 ms a launch on a whole H200: launch overhead is noise
COPY_BYTES = int(os.environ.get("HVGPU_BENCH_COPY_BYTES", 64 << 20))
SCENARIOS = [("alone", [100]), ("50/50", [50, 50]), ("75/25", [75, 25]),
             ("4x25", [25, 25, 25, 25])]
UTIL_EVERY = 0.5  # seconds between readings of the agent's usage snapshot


class UtilRecorder:
    """Reads the agent's latest usage snapshot every UTIL_EVERY seconds, in a thread:
    each slice's utilisation (None where the driver gives no per-process figure) and
    each GPU's, labelled with the scenario running."""

    def __init__(self, agent):
        self.agent, self.scenario, self.samples = agent, None, []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self):
        while not self._stop.wait(UTIL_EVERY):
            snap = self.agent.snapshot
            self.samples.append({
                "t": round(time.monotonic() - self.t0, 3), "scenario": self.scenario,
                "slices": {f"{v.vm}#{v.device}" if v.device else v.vm: v.util
                           for v in snap.vgpus},
                "compute": {f"{v.vm}#{v.device}" if v.device else v.vm: v.compute
                            for v in snap.vgpus},
                "gpus": {str(g.index): g.utilization for g in snap.gpus}})


def tenant_main(address: str | None, seconds: float, blocks: int) -> None:
    """One guest: wait for 'go' on stdin, then compute, then copy; print JSON.

    Every tenant launches the same grid (``blocks``, sized for the whole GPU by
    the native run): a slice's device reports only the SMs its share allows,
    so a grid sized from the slice's own count would be a smaller job.
    """
    import numpy as np

    if address is None:  # the native reference: CuPy in this process
        import cupy as cp

        kernel = cp.RawKernel(BURN, "burn")
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        blocks = blocks or sms * 8
        out = cp.zeros(blocks, dtype=cp.float32)
        dev_buf = cp.empty(COPY_BYTES, dtype=cp.uint8)

        def launch():
            kernel((blocks,), (256,), (out, np.int32(ITERS)))

        sync = cp.cuda.Device().synchronize

        def copy(host, back):
            cp.cuda.runtime.memcpy(dev_buf.data.ptr, host.ctypes.data, COPY_BYTES, 1)
            cp.cuda.runtime.memcpy(back.ctypes.data, dev_buf.data.ptr, COPY_BYTES, 2)
    else:
        from hvgpu.guest import Connection, Device, LaunchConfig, Program
        from hvgpu.guest import launch as hv_launch

        conn = Connection(address)
        dev = Device(connection=conn)
        sms = dev.multiprocessor_count  # the SMs this slice's share allows
        blocks = blocks or sms * 8
        kernel = Program(BURN, connection=conn).compile().get_kernel("burn")
        out = dev.allocate(blocks * 4)
        dev_buf = dev.allocate(COPY_BYTES)
        cfg = LaunchConfig(grid=blocks, block=256)

        def launch():
            hv_launch(kernel, cfg, out, ITERS)

        sync = dev.sync

        def copy(host, back):
            dev_buf.copy_from(host)
            dev_buf.copy_to(back)

    host = np.random.default_rng().integers(0, 255, COPY_BYTES, dtype=np.uint8)
    back = np.empty_like(host)
    launch()
    sync()
    copy(host, back)
    print("ready", flush=True)
    sys.stdin.readline()
    kernels = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        launch()
        launch()
        sync()
        kernels += 2
    compute_s = time.perf_counter() - t0
    copies = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        copy(host, back)
        copies += 1
    copy_s = time.perf_counter() - t0
    assert np.array_equal(host, back), "copy returned wrong bytes"
    print(json.dumps({"kernels_per_s": kernels / compute_s, "sms_seen": sms, "blocks": blocks,
                      "copy_gbps": 2 * copies * COPY_BYTES / copy_s / 1e9}), flush=True)


def run_tenants(addresses: list[str | None], seconds: float, blocks: int = 0) -> list[dict]:
    procs = []
    for address in addresses:
        cmd = [sys.executable, __file__, "--tenant", address or "native", "--seconds", str(seconds),
               "--blocks", str(blocks)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True))
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"tenant failed to start: {line!r}")
    for p in procs:  # as close to together as a loop gets
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds * 4 + 60)
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run(out: Path, seconds: float, slice_mem: str = "4G", placement: str | None = None) -> dict:
    from hvgpu.host.agent import Agent, AgentConfig
    from hvgpu.host.control_api import ControlAPI
    from hvgpu.host.inventory import read_gpus

    tmp = Path(tempfile.mkdtemp(prefix="hvgpu-mt-"))
    vms = [f"t{i}" for i in range(4)]
    agent = Agent(AgentConfig(listen=[f"unix://{tmp}/{vm}.sock={vm}" for vm in vms],
                              vsock_port=None, cache_dir=str(tmp / "cache"),
                              state_dir=str(tmp / "state"), mps=True, log_level="WARNING",
                              sample_seconds=1.0),
                  gpus=read_gpus)
    agent.start()
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    api = agent.commands(ControlAPI(agent, read_gpus), who="bench/multi_tenant.py")
    doc: dict = {"benchmark": "multi_tenant", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime()),
                 "seconds": seconds, "mps": agent.mps.running, "mps_reason": agent.mps.reason,
                 "gpu": read_gpus()[0].name, "gpus": len(read_gpus()),
                 "placement": placement or "best-fit", "scenarios": {}}
    recorder = UtilRecorder(agent).start()
    try:
        native = run_tenants([None], seconds)[0]
        doc["native"] = native
        print(f"native: {native['kernels_per_s']:.1f} kernels/s, {native['copy_gbps']:.2f} GB/s",
              flush=True)
        alone = None
        for name, shares in SCENARIOS:
            placed = [api.attach(vm, slice_mem, f"{share}%", placement=placement,
                                 allow_time_shared=not agent.mps.running)["gpu_index"]
                      for vm, share in zip(vms, shares)]
            recorder.scenario = name
            try:
                results = run_tenants([f"unix://{tmp}/{vm}.sock" for vm in vms[:len(shares)]],
                                      seconds, native["blocks"])
            finally:
                time.sleep(2)  # the last utilisation readings of this scenario
                recorder.scenario = None
                for vm in vms[:len(shares)]:
                    api.detach(vm)
                time.sleep(0.5)  # executors end with their slices
            if alone is None:
                alone = results[0]
            tenants = []
            for share, gpu, r in zip(shares, placed, results):
                rel = r["kernels_per_s"] / alone["kernels_per_s"]
                tenants.append({"share": share, "gpu_index": gpu, **r, "relative_to_alone": rel,
                                "sm_fraction_seen": r["sms_seen"] / native["sms_seen"],
                                "points_from_share": 100 * rel - share})
            agg = sum(r["kernels_per_s"] for r in results)
            doc["scenarios"][name] = {
                "tenants": tenants,
                "aggregate_kernels_per_s": agg,
                "aggregate_vs_native": agg / native["kernels_per_s"],
                "aggregate_copy_gbps": sum(r["copy_gbps"] for r in results),
            }
            print(f"{name}: " + ", ".join(
                f"{t['share']}% -> {100 * t['relative_to_alone']:.1f}%" for t in tenants)
                + f"; aggregate {agg / native['kernels_per_s']:.2f} of native", flush=True)
    finally:
        recorder.stop()
        agent.stop()
    doc["utilization"] = {"every": UTIL_EVERY, "samples": recorder.samples,
                          "mean": mean_util(recorder.samples)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "multi_tenant.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "multi_tenant.md").write_text(table(doc))
    plot(doc, out / "multi_tenant.png")
    plot_util(doc, out / "multi_tenant_util.png")
    print(table(doc))
    return doc


def table(doc: dict) -> str:
    rows = ["| scenario | tenant shares | each tenant vs alone (points from share) | "
            "aggregate vs native | aggregate copy GB/s |", "| --- | --- | --- | --- | --- |"]
    for name, sc in doc["scenarios"].items():
        on = any(t.get("gpu_index", 0) for t in sc["tenants"])  # several GPUs: say which
        shares = "/".join(str(t["share"]) + (f" (GPU {t['gpu_index']})" if on else "")
                          for t in sc["tenants"])
        each = ", ".join(f"{100 * t['relative_to_alone']:.0f}% ({t['points_from_share']:+.0f})"
                         for t in sc["tenants"])
        rows.append(f"| {name} | {shares} | {each} | {sc['aggregate_vs_native']:.2f} | "
                    f"{sc['aggregate_copy_gbps']:.1f} |")
    n = doc["native"]
    rows.append("")
    rows.append(f"{doc['gpu']}, MPS {'on' if doc['mps'] else 'off: ' + doc['mps_reason']}, "
                f"{doc['seconds']:.0f} s per phase, {doc['when']}. Native (one CuPy process): "
                f"{n['kernels_per_s']:.1f} kernels/s, {n['copy_gbps']:.2f} GB/s copies.")
    return "\n".join(rows) + "\n"


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    x = 0
    ticks, labels = [], []
    for name, sc in doc["scenarios"].items():
        for i, t in enumerate(sc["tenants"]):
            ax.bar(x, 100 * t["relative_to_alone"], color="#4477aa")
            ax.hlines(t["share"], x - 0.4, x + 0.4, colors="#cc3311", linestyles="dashed")
            ticks.append(x)
            labels.append(f"{name}\n#{i}")
            x += 1
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("% of the throughput alone (dashed: --compute share)")
    ax.set_title(f"tenants sharing one {doc['gpu']} through hvgpu slices")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mean_util(samples: list[dict]) -> dict:
    """{scenario: {slice: mean utilisation while it ran, or None: no figure}}."""
    sums: dict = {}
    for s in samples:
        if s["scenario"] is None:
            continue
        for name, util in s["slices"].items():
            if util is not None:
                entry = sums.setdefault(s["scenario"], {}).setdefault(name, [0, 0])
                entry[0] += util
                entry[1] += 1
    return {sc: {name: round(total / n, 1) for name, (total, n) in d.items()}
            for sc, d in sums.items()}


def plot_util(doc: dict, path: Path) -> bool:
    """Each slice's GPU utilisation over time (solid), the GPU's (dashed grey), the
    scenarios shaded; False (and why, printed) where it cannot be drawn."""
    samples = doc.get("utilization", {}).get("samples", [])
    if not any(u is not None for s in samples for u in s["slices"].values()):
        print("no per-slice utilisation plot: the driver gave no per-process utilisation "
              "for the executors (the GPU's is in multi_tenant.json)", flush=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no utilisation plot: matplotlib is not installed", flush=True)
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    names = sorted({n for s in samples for n in s["slices"]})
    for name in names:
        ts = [s["t"] for s in samples]
        ys = [s["slices"].get(name) for s in samples]
        measured = any(y is not None for y in ys)
        line, = ax.plot(ts, [float("nan") if y is None else y for y in ys],
                        label=f"slice {name}" + ("" if measured else " (no per-process figure)"))
        shares = [s.get("compute", {}).get(name) for s in samples]
        ax.plot(ts, [float("nan") if y is None else y for y in shares], ":",
                color=line.get_color(), linewidth=1.5, label=f"share of {name}")
    for gpu in sorted({g for s in samples for g in s["gpus"]}):
        ys = [s["gpus"].get(gpu) for s in samples]
        ax.plot([s["t"] for s in samples], [float("nan") if y is None else y for y in ys],
                "--", color="grey", linewidth=1, label=f"GPU {gpu}")
    start = None
    for i, s in enumerate(samples + [{"scenario": None, "t": None}]):
        prev = samples[i - 1]["scenario"] if i else None
        if s["scenario"] != prev:
            if prev is not None:
                end = samples[i - 1]["t"]
                ax.axvspan(start, end, color="#eeeeee", zorder=0)
                ax.text((start + end) / 2, 103, prev, ha="center", fontsize=8)
            start = s["t"]
    ax.set_ylim(0, 110)
    ax.set_xlabel("seconds")
    ax.set_ylabel("% (solid: NVML per process; dotted: --compute share)")
    ax.set_title(f"each slice's utilisation while tenants share one {doc['gpu']}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    ap.add_argument("--slice-mem", default="4G", help="memory quota of each tenant's slice")
    ap.add_argument("--placement", choices=["best-fit", "pack", "spread"], default=None,
                    help="how tenants' slices are placed on a host with several GPUs "
                         "(spread: tenants on all of them) [default: best-fit]")
    ap.add_argument("--tenant", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--render", nargs=2, type=Path, metavar=("JSON", "PAGE"),
                    help="rewrite the multi-tenant table of PAGE (docs/performance.md) and "
                         "README's headline table from a results file and exit")
    args = ap.parse_args()
    if args.render:
        from bench.readme import publish

        publish(args.render[1], "multi-tenant-table",
                table(json.loads(args.render[0].read_text())))
        return 0
    if args.tenant:
        tenant_main(None if args.tenant == "native" else args.tenant, args.seconds, args.blocks)
        return 0
    run(args.out, args.seconds, args.slice_mem, args.placement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
