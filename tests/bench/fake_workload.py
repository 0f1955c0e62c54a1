"""A training workload with no framework and no GPU, for tests/bench/test_frameworks.py:
NumPy linear regression behind bench/workloads/common.py, as the real workloads are.

FAKE_SLOW=SECONDS sleeps in every step (a slower side); FAKE_DRIFT=X adds X to every
gradient (a side that computes something else)."""

from __future__ import annotations

import os
import time

from bench.workloads import common


def main() -> None:
    args = common.arguments(__doc__, steps=5, warmup=2, batch=32)
    import numpy as np

    rng = np.random.default_rng(args.seed)
    xs = rng.standard_normal((8, args.batch, 16))
    ys = xs @ rng.standard_normal(16)
    state = {"w": np.zeros(16), "i": 0}
    slow = float(os.environ.get("FAKE_SLOW", 0))
    drift = float(os.environ.get("FAKE_DRIFT", 0))

    def step():
        i = state["i"] % 8
        state["i"] += 1
        err = xs[i] @ state["w"] - ys[i]
        state["w"] = state["w"] - 0.05 * (xs[i].T @ err / args.batch + drift)
        if slow:
            time.sleep(slow)
        return float(np.mean(err ** 2))

    common.run("fake", "samples/s", args.batch, args, step, lambda: None, float,
               weights=lambda: [state["w"]])


if __name__ == "__main__":
    main()
