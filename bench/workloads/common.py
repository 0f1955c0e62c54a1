"""What every workload shares: argument parsing, the timed loop, its JSON report, and the
checksum of the weights a run ends with.

A workload gives a ``step()`` that runs one training step and returns the loss as a
device value, a ``sync()``, and ``weights()``, its parameters as host arrays. The loop
runs warm-up steps (compilation, autotuning, allocator growth), then timed steps,
reading each loss only after the timed section so that reading it adds no
synchronisation the program would not make anyway.

Two ways to run: alone (``--steps N``: warm-up, N timed steps, one JSON line), or with
``--serve`` for bench/frameworks.py, which asks for one timed window at a time
(bench/worker.py's protocol) so that native and shim windows alternate, then for
``finish STEPS``: the steps a window did not reach (the side that ran fewer catches
up, untimed), every loss, and checksum() of the weights, which must then match the
other side's.

Must not import torch, jax or cupy itself: each workload imports its own framework.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Callable


def arguments(description: str, steps: int, warmup: int, batch: int) -> argparse.Namespace:
    # cuBLAS reads it when its first handle is made: before any framework is imported.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="timed training steps")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed steps before them")
    p.add_argument("--batch", type=int, default=batch, help="samples per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve", action="store_true",
                   help="after warm-up, answer bench/worker.py's commands on stdin")
    return p.parse_args()


def torch_deterministic(torch) -> None:
    """Deterministic cuDNN and cuBLAS choices, so native and shim runs give the same loss
    trace bit for bit rather than two chaotic walks apart: cuDNN's default backward
    convolutions add with atomics, and a few steps of SGD make the order visible.
    Both sides of a comparison run with it, so the ratio is still like for like."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def torch_losses(torch) -> Callable[[list], list[float]]:
    """Losses (0-d tensors) read in one copy rather than one synchronising read each."""
    return lambda values: torch.stack(values).float().cpu().tolist() if values else []


def torch_weights(module) -> Callable[[], list]:
    """A module's parameters as host arrays, in their fixed order, for checksum()."""
    return lambda: [p.detach().double().cpu().numpy() for p in module.parameters()]


def shim_round_trips() -> int | None:
    """Synchronous round trips the hvgpu shim has made so far; None when not under the shim."""
    try:
        # dlopen needs RTLD_NOW or RTLD_LAZY besides RTLD_NOLOAD, or it refuses the mode.
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        fn = lib.hvgpu_shim_round_trips
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_uint64
    return int(fn())


def checksum(arrays, projections: int = 4, seed: int = 0) -> dict:
    """A few fixed random projections of all the weights together, and their count.

    For two runs' weights w and v, |P(w) - P(v)| / |P(w)| estimates |w - v| / |w|, the
    relative distance of the whole weight vectors, without moving them between
    processes; both sides draw the same projections (same seed, same order of arrays).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    proj = np.zeros(projections)
    count = 0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64).ravel()
        proj += rng.standard_normal((projections, a.size)) @ a
        count += a.size
    return {"count": count, "projections": proj.tolist()}


def run(name: str, unit: str, per_step: int, args: argparse.Namespace,
        step: Callable[[], object], sync: Callable[[], None],
        to_float: Callable[[object], float],
        weights: Callable[[], list] | None = None,
        to_floats: Callable[[list], list[float]] | None = None) -> dict | None:
    """``to_floats`` reads a list of losses at once (one copy instead of one per step)."""
    to_floats = to_floats or (lambda values: [to_float(v) for v in values])
    if args.serve:
        serve(name, unit, per_step, args, step, sync, to_floats, weights)
        return None
    warm = [step() for _ in range(args.warmup)]
    sync()
    warm_losses = to_floats(warm)
    before = shim_round_trips()
    t0 = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    sync()
    elapsed = time.perf_counter() - t0
    after = shim_round_trips()
    report = {
        "workload": name,
        "unit": unit,
        "throughput": per_step * args.steps / elapsed,
        "step_ms": 1000 * elapsed / args.steps,
        "losses": warm_losses + to_floats(losses),
        "round_trips_per_step": None if before is None else (after - before) / args.steps,
    }
    if weights is not None:
        report["checksum"] = checksum(weights())
    print(json.dumps(report), flush=True)
    return report


def serve(name: str, unit: str, per_step: int, args: argparse.Namespace,
          step: Callable[[], object], sync: Callable[[], None],
          to_floats: Callable[[list], list[float]], weights: Callable[[], list] | None) -> None:
    """Warm up, then answer ``window ROW SEED SECONDS`` (steps until SECONDS have passed,
    the closing sync timed) and ``finish STEPS`` (see the module's docstring)."""
    from bench import pairs, worker

    warm = [step() for _ in range(args.warmup)]
    sync()
    state = {"losses": to_floats(warm), "steps": 0}  # steps: after the warm-up

    def window(row, seed, seconds):
        pending = []
        before = shim_round_trips()
        ops, elapsed = pairs.window(lambda: pending.append(step()), float(seconds), sync)
        after = shim_round_trips()
        state["losses"] += to_floats(pending)
        state["steps"] += ops
        return {"ops": ops, "seconds": elapsed, "check": None,
                "round_trips": None if before is None else after - before}

    def finish(total):
        total = int(total)
        if total < state["steps"]:
            raise ValueError(f"asked to finish at step {total}, already at {state['steps']}")
        pending = [step() for _ in range(total - state["steps"])]
        sync()
        state["losses"] += to_floats(pending)
        state["steps"] = total
        return {"steps": total, "warmup": args.warmup, "losses": state["losses"],
                "checksum": None if weights is None else checksum(weights())}

    worker.serve({"window": window, "finish": finish},
                 {"workload": name, "unit": unit, "per_step": per_step, "warmup": args.warmup})


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    sys.exit(1)
