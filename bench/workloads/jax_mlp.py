"""A jitted JAX training step: a 4-layer MLP classifier with softmax cross-entropy and
plain SGD, XLA-compiled, its parameters updated in place (donated buffers)."""

from __future__ import annotations

import os

from bench.workloads import common

# XLA otherwise takes 75% of the device's memory at start (a slice's quota, through the
# shim) and runs some steps as CUDA graphs ("command buffers"), which the shim does not
# carry yet; both runs, native and through the shim, get the same settings.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_gpu_enable_command_buffer=").strip()


def main() -> None:
    args = common.arguments(__doc__, steps=60, warmup=5, batch=256)
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except ImportError as exc:
        common.fail(f"jax is not installed: {exc}")
    if not any(d.platform == "gpu" for d in jax.devices()):
        common.fail(f"JAX found no GPU: {jax.devices()}")

    key = jax.random.PRNGKey(args.seed)
    sizes = [784, 1024, 1024, 512, 10]
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (n_in, n_out)) * (2.0 / n_in) ** 0.5,
                       jnp.zeros(n_out)))
    key, kx, ky = jax.random.split(key, 3)
    xs = jax.random.normal(kx, (8, args.batch, 784))
    ys = jax.random.randint(ky, (8, args.batch), 0, 10)

    def loss_fn(p, x, y):
        for w, b in p[:-1]:
            x = jax.nn.relu(x @ w + b)
        logits = x @ p[-1][0] + p[-1][1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    @jax.jit
    def train(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.05 * g, p, grads), loss

    state = {"p": params, "i": 0}

    def step():
        i = state["i"] % 8
        state["i"] += 1
        state["p"], loss = train(state["p"], xs[i], ys[i])
        return loss

    def sync():
        jax.block_until_ready(state["p"])

    common.run("jax_mlp", "samples/s", args.batch, args, step, sync, lambda v: float(v),
               weights=lambda: [np.asarray(a) for a in jax.tree_util.tree_leaves(state["p"])],
               to_floats=lambda values: [float(v) for v in jax.device_get(values)])


if __name__ == "__main__":
    main()
