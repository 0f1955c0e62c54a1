"""A CuPy workload: logistic regression trained by hand-written gradient steps (matmuls,
elementwise kernels, reductions), the kind of array code people write without a
framework."""

from __future__ import annotations

from bench.workloads import common


def main() -> None:
    args = common.arguments(__doc__, steps=200, warmup=20, batch=4096)
    import cupy as cp

    rng = cp.random.RandomState(args.seed)
    features = 512
    x = rng.standard_normal((args.batch, features), dtype=cp.float32)
    true_w = rng.standard_normal((features,), dtype=cp.float32)
    y = (x @ true_w > 0).astype(cp.float32)
    w = cp.zeros(features, dtype=cp.float32)
    b = cp.zeros((), dtype=cp.float32)
    state = {"w": w, "b": b}

    def step():
        z = x @ state["w"] + state["b"]
        p = 1 / (1 + cp.exp(-z))
        loss = -cp.mean(y * cp.log(p + 1e-7) + (1 - y) * cp.log(1 - p + 1e-7))
        g = p - y
        state["w"] = state["w"] - 0.5 * (x.T @ g) / args.batch
        state["b"] = state["b"] - 0.5 * cp.mean(g)
        return loss

    common.run("cupy_logreg", "samples/s", args.batch, args, step,
               cp.cuda.runtime.deviceSynchronize, lambda v: float(v),
               weights=lambda: [cp.asnumpy(state["w"]), cp.asnumpy(state["b"])],
               to_floats=lambda values: cp.stack(values).get().tolist() if values else [])


if __name__ == "__main__":
    main()
