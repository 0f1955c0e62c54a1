"""Real training steps, native against hvgpu's libcuda shim, in alternating timed windows.

On the GPU machine, from the repository root (bench/run_all.py runs this together with
bench/data_lane.py; see there for the one command to run):

    python3 bench/frameworks.py --out /tmp/hvgpu-bench                 # default rows, ~4 min
    python3 bench/frameworks.py --out /tmp/hvgpu-bench --only gpt      # one row
    python3 bench/frameworks.py --out /tmp/hvgpu-quick --quick         # smoke run, ~2 min
    python3 bench/frameworks.py --render /tmp/hvgpu-bench/frameworks.json docs/performance.md

Each row is a workload of bench/workloads/ run as two processes on the same GPU: one on
the real driver, one with hvgpu's libcuda.so.1 first on the library path, talking to an
agent started here (unix socket, the whole GPU). Every row's processes start at once and
warm up (imports, compilation, autotuning) before any window is timed, then wait idle
for their turn. Row by row, the pair is asked for windows of at least 2 s of training
steps in ABBA order (bench/pairs.py): the ratio is the median of the per-pair
throughput ratios, with their spread; a row spread wider than ±10% says it was noisy.

After the windows, both sides are taken to the same number of steps (the one that ran
fewer catches up, untimed) and report every loss and a checksum of their final weights
(bench/workloads/common.py). Same seed, same data, same steps: a row fails when the
weights' relative difference exceeds WEIGHTS_RTOL or any step's loss differs by more
than LOSS_RTOL. Variants (VARIANTS) give both sides the same environment, e.g. PyTorch's
cudaMallocAsync allocator natively against the same allocator through the shim.

Writes frameworks.json and frameworks.md to --out and every process's log to
--out/logs. Must not write the docs or bench/results by itself: --render does that (the
table on docs/performance.md, README's headline rows from it; bench/readme.py), from a
results file that is not a quick run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import pairs  # noqa: E402
from bench.worker import READY_TIMEOUT, Worker, WorkerFailed  # noqa: E402

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
# name: (workload, environment of both sides, label). Like with like: the allocator or
# flag a variant is about is set natively as well as through the shim.
VARIANTS = {
    "resnet-cudamallocasync": ("resnet", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                               "ResNet-20 as above, PyTorch's cudaMallocAsync allocator on "
                               "both sides"),
    "gpt-cudamallocasync": ("gpt", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                            "GPT as above, PyTorch's cudaMallocAsync allocator on both sides"),
    "jax-autotune0": ("jax", {"XLA_FLAGS": "--xla_gpu_autotune_level=0"},
                      "JAX as above, XLA's autotuner off on both sides"),
}
DEFAULT = [*WORKLOADS, "resnet-cudamallocasync", "gpt-cudamallocasync"]
TARGET = 0.90
# Same GPU, same kernels, same seeds: the traces should agree closely, but cuDNN/cuBLAS may
# pick other algorithms from run to run and atomics reorder sums.
LOSS_RTOL = 2e-2
# The weights after the same steps from the same seed. PyTorch's runs pick deterministic
# algorithms on both sides and their loss traces have been bit-identical, so a difference
# near this is another computation, not rounding; the chaotic growth of a difference over
# a few thousand steps of SGD is what the margin is for.
WEIGHTS_RTOL = 1e-3
FINISH_TIMEOUT = 300.0  # a slow side catching up a fast one's steps


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


def weights_difference(native: dict | None, hvgpu: dict | None) -> float | None:
    """Relative distance of the two sides' final weights, from their checksums
    (bench/workloads/common.checksum); None where it cannot be told (missing, another
    number of weights, not finite)."""
    if not native or not hvgpu or native["count"] != hvgpu["count"]:
        return None
    a, b = native["projections"], hvgpu["projections"]
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    norm = math.sqrt(sum(x * x for x in a))
    rel = diff / norm if norm else (0.0 if diff == 0 else math.inf)
    return rel if math.isfinite(rel) else None


def spec(name: str) -> tuple[str, dict, str]:
    """(module, environment of both sides, label) of a row."""
    if name in WORKLOADS:
        module, label = WORKLOADS[name]
        return module, {}, label
    base, env, label = VARIANTS[name]
    return WORKLOADS[base][0], env, label


class Training:
    """One row: a workload's native and hvgpu processes, and what they answered."""

    def __init__(self, name: str, module: str, label: str, native_env: dict, hvgpu_env: dict,
                 logs: Path, env: dict | None = None, extra: list[str] | None = None):
        self.name, self.label, self.env = name, label, env or {}
        cmd = [sys.executable, "-X", "faulthandler", "-m", module, "--serve", *(extra or [])]
        self.workers = {side: Worker(f"{name}-{side}", cmd, env=e, cwd=ROOT,
                                     log=logs / f"frameworks-{name}-{side}.log")
                        for side, e in (("native", native_env), ("hvgpu", hvgpu_env))}
        self.failures: list[str] = []
        self.ready: dict = {}
        self.windows: dict | None = None
        self.finished: dict = {}

    @classmethod
    def of(cls, name: str, address: str, logs: Path, trace: bool = False,
           extra: list[str] | None = None) -> "Training":
        module, env, label = spec(name)
        return cls(name, module, label, dict(os.environ, **env),
                   dict(shim_env(address, trace), **env), logs, env, extra)

    def start(self) -> "Training":
        for w in self.workers.values():
            w.start()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        for side, w in self.workers.items():
            try:
                self.ready[side] = w.ready(max(1.0, deadline - time.monotonic()))
            except WorkerFailed as exc:
                self.failures.append(f"{side} failed to start: {exc}"[:3000])

    def measure(self, index: int, pairs_n: int, seconds: float) -> None:
        if self.failures:
            return
        base = 1000 * (index + 1)
        try:
            self.windows = pairs.run_pairs(
                lambda side, pair: self.workers[side].window(
                    "step", base + 2 * pair + pairs.SIDES.index(side), seconds), pairs_n)
        except WorkerFailed as exc:
            self.failures.append(str(exc)[:3000])

    def steps(self) -> dict:
        return {side: sum(w["ops"] for w in self.windows[side]) for side in pairs.SIDES}

    def finish(self) -> None:
        """Both sides to the same number of steps, at once; their losses and weights."""
        if self.windows is None:
            return
        total = max(self.steps().values())

        def ask(side):
            try:
                self.finished[side] = self.workers[side].ask(f"finish {total}", FINISH_TIMEOUT)
            except WorkerFailed as exc:
                self.failures.append(f"{side} could not finish: {exc}"[:3000])

        threads = [threading.Thread(target=ask, args=(side,)) for side in pairs.SIDES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def entry(self) -> dict:
        info = self.ready.get("native") or self.ready.get("hvgpu") or {}
        row = pairs.Row(self.name, self.label, info.get("unit", "steps/s"),
                        scale=info.get("per_step", 1), target=TARGET, fmt=",.0f")
        failures = list(self.failures)
        extra: dict = {}
        if len(self.finished) == 2:
            n, h = self.finished["native"], self.finished["hvgpu"]
            losses = compare(n, h)
            rel = weights_difference(n.get("checksum"), h.get("checksum"))
            if rel is None or rel > WEIGHTS_RTOL:
                failures.append("final weights differ from native: " +
                                (f"rel. diff {rel:.2e} (allowed {WEIGHTS_RTOL:.0e})"
                                 if rel is not None else "their checksums cannot be compared"))
            if not losses["match"]:
                failures.append(f"losses differ from native: {len(n['losses'])} against "
                                f"{len(h['losses'])} steps, max rel. diff "
                                f"{losses['max_rel_diff']:.2e} (allowed {LOSS_RTOL:.0e})")
            extra = {"steps": {"warmup": n.get("warmup"), "after_warmup": n["steps"],
                               "in_windows": self.steps()},
                     "losses": {"match": losses["match"], "max_rel_diff": losses["max_rel_diff"],
                                "count": len(n["losses"]), "native_first": n["losses"][:3],
                                "native_last": n["losses"][-3:], "hvgpu_last": h["losses"][-3:]},
                     "weights": {"rel_diff": rel, "count": (n.get("checksum") or {}).get("count")}}
        elif self.windows is not None and not failures:
            failures.append("no final weights to compare")
        e = pairs.entry(row, self.windows, failures)
        e.update(extra)
        e["env"] = self.env
        rts = [w["round_trips"] / w["ops"] for w in (self.windows or {}).get("hvgpu", [])
               if w.get("round_trips") is not None]
        e["round_trips_per_step"] = statistics.median(rts) if rts else None
        return e


def start(names: list[str], address: str, logs: Path, trace: bool = False) -> list[Training]:
    """Every row's processes, started at once: they warm up side by side, untimed."""
    rows = []
    for name in names:
        try:
            rows.append(Training.of(name, address, logs, trace).start())
        except Exception as exc:  # e.g. the shim not built: the row fails, the run goes on
            row = Training(name, "-", spec(name)[2], {}, {}, logs)
            row.failures.append(f"{type(exc).__name__}: {exc}")
            rows.append(row)
    return rows


def wait_ready(rows: list[Training], timeout: float = READY_TIMEOUT) -> None:
    """Until every row is warm, or ``timeout`` after this call for all of them together
    (they warm up at once, so one that is not ready by then is stuck, not slow)."""
    deadline = time.monotonic() + timeout
    for row in rows:
        if not row.failures:
            row.wait_ready(max(1.0, deadline - time.monotonic()))
            print(f"== {row.name}: " + ("ready" if not row.failures else row.failures[0][:400]),
                  flush=True)


def measure(rows: list[Training], pairs_n: int, seconds: float) -> None:
    """Each row's windows in turn (the others idle), then every row's finish at once:
    catching up and checksumming are not timed, so they may share the GPU."""
    for index, row in enumerate(rows):
        row.measure(index, pairs_n, seconds)
        if row.windows:
            print(f"== {row.name}: steps per window native "
                  f"{[w['ops'] for w in row.windows['native']]}, hvgpu "
                  f"{[w['ops'] for w in row.windows['hvgpu']]}", flush=True)
    threads = [threading.Thread(target=row.finish) for row in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def document(rows: list[Training], pairs_n: int, seconds: float, quick: bool) -> dict:
    results = {row.name: row.entry() for row in rows}
    for name, e in results.items():
        print(f"{name:24s} {e['status']:8s} {pairs.value_cell(e, 'native', ',.0f'):>22s} "
              f"{pairs.value_cell(e, 'hvgpu', ',.0f'):>22s}  {pairs.ratio_cell(e)}", flush=True)
    return {"benchmark": "frameworks", "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(), "method": pairs.method(pairs_n, seconds, quick),
            "target": TARGET, "loss_rtol": LOSS_RTOL, "weights_rtol": WEIGHTS_RTOL,
            "results": results}


def write(doc: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "frameworks.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "frameworks.md").write_text(table(doc))


def run(out: Path, names: list[str], pairs_n: int, seconds: float, quick: bool,
        trace: bool = False, ready_timeout: float = READY_TIMEOUT) -> dict:
    agent, address = start_agent()
    rows = start(names, address, out / "logs", trace)
    try:
        wait_ready(rows, ready_timeout)
        print(f"frameworks: {len(rows)} rows x {pairs_n} pairs x 2 windows of {seconds:g} s",
              flush=True)
        measure(rows, pairs_n, seconds)
    finally:
        for row in rows:
            row.close()
        agent.stop()
    doc = document(rows, pairs_n, seconds, quick)
    write(doc, out)
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
    """The page's table from a results file: each row's median ratio and range, round trips
    per step, whether the final weights and losses matched native, and the method."""
    m = doc["method"]
    rows = [f"| training step | native | hvgpu | hvgpu / native (median of {m['pairs']} pairs, "
            "range) | round trips / step | same weights and losses as native |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, e in doc["results"].items():
        rt = e.get("round_trips_per_step")
        same = ""
        if "weights" in e:
            w, lo = e["weights"]["rel_diff"], e["losses"]
            ok = w is not None and w <= doc["weights_rtol"] and lo["match"]
            same = (f"{'yes' if ok else '**no**'} (weights "
                    f"{'?' if w is None else f'{w:.1e}'}, losses {lo['max_rel_diff']:.1e})")
        rows.append(f"| {e['label']} | {pairs.value_cell(e, 'native', ',.0f')} | "
                    f"{pairs.value_cell(e, 'hvgpu', ',.0f')} | {pairs.ratio_cell(e)} | "
                    f"{'' if rt is None else f'{rt:.2f}'} | {same} |")
    mach = doc["machine"]
    notes = [f"{mach.get('gpu')}, driver {mach.get('driver')}, PyTorch {mach.get('torch')}, "
             f"JAX {mach.get('jax')}, CuPy {mach.get('cupy')}, {mach.get('cpus')} CPUs.",
             pairs.footer(doc),
             f"Target: ≥ {doc['target']:.2f} of native. Both sides run the same warm-up and "
             f"then the same number of steps in all (the one that ran fewer in its windows "
             f"catches up, untimed); their final weights must agree within "
             f"{doc['weights_rtol']:.0e} (relative distance, from random projections of all "
             f"weights) and every step's loss within {doc['loss_rtol']:.0e} (relative). A "
             f"variant sets the same environment on both sides."]
    return "\n".join(rows) + "\n\n" + " ".join(notes) + "\n"


def render_page(results: Path, page: Path) -> None:
    from bench.readme import publish

    doc = json.loads(results.read_text())
    why = pairs.unpublishable(doc)
    if why:
        raise SystemExit(f"{results} does not go into {page}: {why}")
    publish(page, "frameworks-table", table(doc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="results and logs go here")
    ap.add_argument("--only", nargs="+", choices=sorted([*WORKLOADS, *VARIANTS]),
                    default=DEFAULT, help=f"rows to run (default: {' '.join(DEFAULT)})")
    pairs.arguments(ap)
    ap.add_argument("--trace", action="store_true", help="HVGPU_SHIM_TRACE=1 for the shim runs")
    ap.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT,
                    help="seconds a workload may take to warm up")
    ap.add_argument("--render", nargs=2, type=Path, metavar=("JSON", "PAGE"),
                    help="rewrite the frameworks table of PAGE (docs/performance.md) and "
                         "README's headline table from a results file and exit")
    args = ap.parse_args()
    if args.render:
        render_page(*args.render)
        return 0
    if args.out is None:
        ap.error("--out DIR is needed (results and logs go there)")
    run(args.out, args.only, args.pairs, pairs.window_seconds(args), args.quick, args.trace,
        args.ready_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
