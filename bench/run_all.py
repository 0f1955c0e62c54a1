"""Every row of bench/data_lane.py and bench/frameworks.py in one run: the command to run
on the GPU machine, about six minutes on an H200.

    cd <checkout> && python3 setup.py -q build_ext --inplace      # the shim and C fast path
    python3 bench/run_all.py --out /tmp/hvgpu-quick --quick        # smoke run first, ~2.5 min
    python3 bench/run_all.py --out bench/results                   # the run to publish, ~6 min

then, if its tables say nothing failed:

    python3 bench/data_lane.py --render bench/results/data_lane.json docs/performance.md
    python3 bench/frameworks.py --render bench/results/frameworks.json docs/performance.md

(each puts its table on docs/performance.md and README's headline rows from it)

How the six minutes go: one agent starts; every training row's native and shim processes
start at once and warm up side by side (imports, torch.compile, XLA), untimed, while the
data lane is set up (nvcc builds bench/shim_bench.cu, the CuPy and shim workers start,
odd-size copy checks run). Once all of it is warm and idle: the data-lane rows, then the
training rows, each in ABBA pairs of windows of at least 2 s (bench/pairs.py), then
every training row's catch-up and weight check at once. Estimated, not yet measured:
warm-up 1-2 min, data lane 10 rows x ~14 s, training 9 rows x ~13 s, checks ~0.5 min,
so 5.5-7 min in all, most of the spread in the warm-up.

Writes data_lane.json, .md, .png and frameworks.json, .md to --out; every process's
log to --out/logs; and this run's whole output, the agent's and executors' included, to
--out/logs/run_all.log. --quick results say so and --render refuses them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import data_lane, frameworks, pairs  # noqa: E402
from bench.worker import READY_TIMEOUT  # noqa: E402

CHILD = "HVGPU_RUN_ALL_CHILD"


def logged(argv: list[str], log: Path) -> int:
    """Run this script again as a child whose stdout and stderr (and so its agent's and
    executors', which inherit them) are copied to the terminal and to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-u", __file__, *argv],
                             env=dict(os.environ, **{CHILD: "1"}), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace")
    with open(log, "w") as f:
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            f.write(line)
            f.flush()
    return child.wait()


def run(args) -> int:
    seconds = pairs.window_seconds(args)
    figures = data_lane.select(args.rows)
    names = args.only
    logs = args.out / "logs"
    t0 = time.monotonic()

    def stamp(what):
        print(f"[{time.monotonic() - t0:6.1f} s] {what}", flush=True)

    stamp(f"{len(figures)} data-lane rows and {len(names)} training rows, {args.pairs} pairs "
          f"of {seconds:g} s windows each{' (QUICK: not publishable)' if args.quick else ''}")
    agent, address = data_lane.start_agent()
    training = frameworks.start(names, address, logs, args.trace)
    session = data_lane.Session(address, figures, logs)
    try:
        stamp("training processes warming up; setting up the data lane")
        session.start()
        session.start_in_process()
        session.wait_ready()
        stamp("data lane ready; waiting for the training processes")
        frameworks.wait_ready(training, args.ready_timeout)
        stamp("all warm: measuring the data lane")
        session.first_kernel()
        results = session.measure(args.pairs, seconds)
        ping = session.ping_us(seconds)
        dl = data_lane.document(session, results, args.pairs, seconds, args.quick, ping)
        data_lane.write(dl, args.out)  # kept even if the training rows go wrong
        stamp("measuring the training rows")
        frameworks.measure(training, args.pairs, seconds)
        stamp("training rows done")
    finally:
        session.close()
        for row in training:
            row.close()
        agent.stop()
    fw = frameworks.document(training, args.pairs, seconds, args.quick)
    frameworks.write(fw, args.out)
    print("\n" + data_lane.table(dl) + "\n" + frameworks.table(fw), flush=True)
    bad = [f"{name}: {e['status']}" for doc in (dl, fw) for name, e in doc["results"].items()
           if e["status"] not in ("ok",)]
    stamp(f"written to {args.out}; rows not ok: {', '.join(bad) if bad else 'none'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True,
                    help="results here, every log under OUT/logs")
    ap.add_argument("--rows", nargs="+", default=["default"],
                    help="data-lane rows (see bench/data_lane.py --rows; default: 'default')")
    ap.add_argument("--only", nargs="+", default=frameworks.DEFAULT,
                    choices=sorted([*frameworks.WORKLOADS, *frameworks.VARIANTS]),
                    help="training rows (default: " + " ".join(frameworks.DEFAULT) + ")")
    pairs.arguments(ap)
    ap.add_argument("--trace", action="store_true", help="HVGPU_SHIM_TRACE=1 for the shim runs")
    ap.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT,
                    help="seconds a process may take to warm up")
    args = ap.parse_args()
    pairs.window_seconds(args)  # refuse what is not publishable without --quick, before anything
    data_lane.select(args.rows)
    if os.environ.get(CHILD) != "1":
        return logged(sys.argv[1:], args.out / "logs" / "run_all.log")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
