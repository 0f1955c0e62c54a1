"""CuPy's own launch path, one timed window at a time: bench/data_lane.py runs it twice,
natively and under ``hvgpu-guest run`` (the libcuda shim), so that CuPy's RawKernel
launch rate is compared with CuPy's, not with another front end.

    python3 -m bench.cupy_launch        # speaks bench/worker.py's protocol on stdin/stdout

Rows: ``launch`` (batches of RawKernel launches of checks.TICK, the counter checked after
the window) and ``sync`` (cudaDeviceSynchronize on an idle GPU). Knows nothing of hvgpu:
the shim is whatever libcuda.so.1 the process finds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import checks, pairs, worker  # noqa: E402


def main() -> None:
    import cupy as cp
    import numpy as np

    kernel = cp.RawKernel(checks.TICK, "tick")
    count = cp.zeros(1, dtype=cp.uint32)
    one = np.int32(1)
    sync = cp.cuda.runtime.deviceSynchronize
    kernel((1,), (32,), (count, one))  # compiled and loaded before the first window
    sync()

    def batch():
        for _ in range(checks.LAUNCH_BATCH):
            kernel((1,), (32,), (count, one))
        return checks.LAUNCH_BATCH

    def window(row, seed, seconds):
        seed, seconds = int(seed), float(seconds)
        if row == "launch":
            start = checks.counter_start(seed)
            count.set(np.array([start], dtype=np.uint32))
            sync()
            ops, elapsed = pairs.window(batch, seconds, sync)
            got = int(count.get()[0])
            return {"ops": ops, "seconds": elapsed, "check": checks.counter(got, start, ops)}
        if row == "sync":
            ops, elapsed = pairs.window(sync, seconds)
            return {"ops": ops, "seconds": elapsed, "check": None}
        raise ValueError(f"unknown row {row!r}")

    worker.serve({"window": window}, {"cupy": cp.__version__,
                                      "shim": "HVGPU_AGENT" in os.environ})


if __name__ == "__main__":
    main()
