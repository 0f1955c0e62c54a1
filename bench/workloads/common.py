"""What every workload shares: argument parsing, the timed loop and its one-line JSON report.

A workload gives a ``step()`` that runs one training step and returns the loss as a
device value, and a ``sync()``. The loop runs warm-up steps (compilation, autotuning,
allocator growth), then timed steps, reading each loss only after the timed section so
that reading it adds no synchronisation the program would not make anyway.

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
    return p.parse_args()


def torch_deterministic(torch) -> None:
    """Deterministic cuDNN and cuBLAS choices, so native and shim runs give the same loss
    trace bit for bit rather than two chaotic walks apart: cuDNN's default backward
    convolutions add with atomics, and a few steps of SGD make the order visible.
    Both sides of a comparison run with it, so the ratio is still like for like."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


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


def run(name: str, unit: str, per_step: int, args: argparse.Namespace,
        step: Callable[[], object], sync: Callable[[], None],
        to_float: Callable[[object], float]) -> dict:
    warm = [step() for _ in range(args.warmup)]
    sync()
    warm_losses = [to_float(v) for v in warm]
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
        "losses": warm_losses + [to_float(v) for v in losses],
        "round_trips_per_step": None if before is None else (after - before) / args.steps,
    }
    print(json.dumps(report), flush=True)
    return report


def fail(message: str) -> None:
    print(json.dumps({"error": message}), flush=True)
    sys.exit(1)
