"""Real training steps, native against hvgpu's libcuda shim, side by side in one run.

    python3 bench/frameworks.py --out bench/results            # on a GPU host
    python3 bench/frameworks.py --render bench/results/frameworks.json README.md
    python3 bench/frameworks.py --only gpt --trace              # one workload, shim traced

Each workload in bench/workloads/ is run as its own process twice on the same GPU: once
on the real driver, once with hvgpu's libcuda.so.1 first on the library path, talking to
an agent started here (unix socket, the whole GPU). Reported per workload: throughput of
both, their ratio (target >= 0.90), the shim's synchronous round trips per timed step,
and whether the loss traces agree (every step within LOSS_RTOL of native, relative).
Writes frameworks.json and frameworks.md to --out.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOADS = {  # name: (module, label for the table)
    "resnet": ("bench.workloads.resnet", "ResNet-20 CIFAR, fp32, SGD, batch 128 (cuDNN)"),
    "gpt": ("bench.workloads.gpt", "GPT 4x384, bf16 autocast, SDPA, fused AdamW, 16x256 tokens"),
    "compiled": ("bench.workloads.compiled", "torch.compile (Inductor, Triton) CNN, batch 128"),
    "jax": ("bench.workloads.jax_mlp", "JAX jitted MLP step, batch 256"),
    "cupy": ("bench.workloads.cupy_work", "CuPy logistic regression, 4096x512"),
    "cudagraph": ("bench.workloads.cudagraph", "CUDA graph replay (torch.cuda.CUDAGraph) of a "
                  "launch-bound MLP step, Adam"),
    "reduce_overhead": ("bench.workloads.reduce_overhead", "torch.compile(mode=\"reduce-overhead\") "
                        "MLP step (cudagraph trees)"),
}
TARGET = 0.90
# Same GPU, same kernels, same seeds: the traces should agree closely, but cuDNN/cuBLAS may
# pick other algorithms from run to run and atomics reorder sums.
LOSS_RTOL = 2e-2


def start_agent() -> tuple[object, str]:
    from hvgpu.host.agent import Agent, AgentConfig

    tmp = Path(tempfile.mkdtemp(prefix="hvgpu-frameworks-"))
    address = f"unix://{tmp / 'agent.sock'}"
    agent = Agent(AgentConfig(listen=[address], vsock_port=None, cache_dir=str(tmp / "cache"),
                              log_level=os.environ.get("HVGPU_BENCH_LOG", "WARNING")))
    agent.start()
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    return agent, address


def shim_env(address: str, trace: bool) -> dict:
    from hvgpu.guest.shim import library

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(library().parent)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["HVGPU_AGENT"] = address
    env["HVGPU_SHIM_STATS"] = "1"
    if trace:
        env["HVGPU_SHIM_TRACE"] = "1"
    return env


def run_one(module: str, env: dict, extra: list[str], timeout: float,
            log: Path | None = None) -> dict:
    cmd = [sys.executable, "-X", "faulthandler", "-m", module, *extra]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {timeout:.0f} s",
                "stderr": (exc.stderr or b"")[-4000:].decode(errors="replace")
                if isinstance(exc.stderr, bytes) else (exc.stderr or "")[-4000:]}
    wall = time.perf_counter() - t0
    if log is not None:
        log.write_text(p.stdout + "\n---- stderr ----\n" + p.stderr)
    report = None
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                pass
    if p.returncode != 0 or report is None or "error" in report:
        return {"error": (report or {}).get("error") or f"exit status {p.returncode}",
                "stderr": p.stderr[-6000:]}
    report["wall_s"] = wall
    report["stderr"] = p.stderr[-3000:]
    return report


def compare(native: dict, hv: dict) -> dict:
    a, b = native["losses"], hv["losses"]
    n = min(len(a), len(b))
    worst = max((abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a[:n], b[:n])), default=0.0)
    return {"match": n == len(a) == len(b) and worst <= LOSS_RTOL, "max_rel_diff": worst}


def run(out: Path, only: list[str], trace: bool, steps: int | None, timeout: float,
        logs: Path | None = None) -> dict:
    agent, address = start_agent()
    native_env = dict(os.environ)
    hv_env = shim_env(address, trace)
    extra = ["--steps", str(steps)] if steps else []
    results = {}
    try:
        for name in only:
            module, label = WORKLOADS[name]
            print(f"== {name}: {label}", flush=True)
            if logs:
                logs.mkdir(parents=True, exist_ok=True)
            native = run_one(module, native_env, extra, timeout,
                             logs / f"{name}.native.log" if logs else None)
            hv = run_one(module, hv_env, extra, timeout, logs / f"{name}.hvgpu.log" if logs else None)
            row = {"label": label, "native": native, "hvgpu": hv}
            if "error" in native:
                print(f"   native failed: {native['error']}\n{native['stderr'][-1500:]}", flush=True)
            if "error" in hv:
                print(f"   hvgpu failed: {hv['error']}\n{hv['stderr'][-4000:]}", flush=True)
            if "error" not in native and "error" not in hv:
                row["ratio"] = hv["throughput"] / native["throughput"]
                row.update(compare(native, hv))
                print(f"   native {native['throughput']:10.1f} {native['unit']}  hvgpu "
                      f"{hv['throughput']:10.1f}  ratio {row['ratio']:.2f}  round trips/step "
                      f"{hv['round_trips_per_step']}  losses match: {row['match']} "
                      f"(max rel diff {row['max_rel_diff']:.2e})", flush=True)
                print("   shim: " + hv["stderr"][-1500:].replace("\n", "\n   "), flush=True)
            results[name] = row
    finally:
        agent.stop()
    doc = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
           "target": TARGET, "loss_rtol": LOSS_RTOL, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "frameworks.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "frameworks.md").write_text(table(doc))
    print(table(doc), flush=True)
    return doc


def machine() -> dict:
    m = {"cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        m["gpu"], m["driver"] = [s.strip() for s in out.splitlines()[0].split(",")]
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        m["gpu"], m["driver"] = "unknown", "unknown"
    for mod in ("torch", "jax", "cupy"):
        try:
            m[mod] = __import__(mod).__version__
        except Exception:  # a missing or broken framework is reported, not fatal
            m[mod] = None
    return m


def table(doc: dict) -> str:
    rows = ["| training step | native | hvgpu | hvgpu / native | round trips / step | "
            "losses match native |", "| --- | --- | --- | --- | --- | --- |"]
    for name, r in doc["results"].items():
        n, h = r["native"], r["hvgpu"]
        if "error" in n:
            rows.append(f"| {r['label']} | failed natively: {n['error']} | | | | |")
        elif "error" in h:
            rows.append(f"| {r['label']} | {n['throughput']:,.0f} {n['unit']} | fails: "
                        f"{h['error']} | | | |")
        else:
            ok = "yes" if r["match"] else "no"
            rt = h["round_trips_per_step"]
            rows.append(f"| {r['label']} | {n['throughput']:,.0f} {n['unit']} | "
                        f"{h['throughput']:,.0f} {h['unit']} | **{r['ratio']:.2f}** | "
                        f"{'n/a' if rt is None else f'{rt:.2f}'} | {ok} "
                        f"(max rel. diff {r['max_rel_diff']:.1e}) |")
    m = doc["machine"]
    rows.append("")
    rows.append(f"{m['gpu']}, driver {m['driver']}, PyTorch {m.get('torch')}, JAX {m.get('jax')}, "
                f"CuPy {m.get('cupy')}, {m['cpus']} CPUs, {doc['when']}. Target: every step "
                f"≥ {doc['target']:.2f} of native; losses match when every step is within "
                f"{doc['loss_rtol']:.0e} (relative) of native.")
    return "\n".join(rows) + "\n"


def render_readme(results: Path, readme: Path) -> None:
    from bench.readme import replace_table

    replace_table(readme, "frameworks-table", table(json.loads(results.read_text())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS),
                    help="workloads to run (default: all)")
    ap.add_argument("--steps", type=int, help="timed steps per workload (default: each one's)")
    ap.add_argument("--trace", action="store_true", help="HVGPU_SHIM_TRACE=1 for the shim runs")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per workload run")
    ap.add_argument("--logs", type=Path, help="keep each run's whole output in this folder")
    ap.add_argument("--render", nargs=2, type=Path, metavar=("JSON", "README"),
                    help="rewrite README's frameworks table from a results file and exit")
    args = ap.parse_args()
    if args.render:
        render_readme(*args.render)
        return 0
    run(args.out, args.only, args.trace, args.steps, args.timeout, args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
