"""torch.compile (Inductor) of a small convolutional classifier's training step: Triton
kernels, launched by Triton's own launcher through the driver API."""

from __future__ import annotations

from bench.workloads import common


def main() -> None:
    args = common.arguments(__doc__, steps=40, warmup=6, batch=128)
    import torch

    common.torch_deterministic(torch)
    torch.manual_seed(args.seed)
    nn = torch.nn
    dev = torch.device("cuda")
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed)
    xs = torch.randn(8, args.batch, 3, 32, 32, generator=g).to(dev)
    # Labels a fixed random linear teacher gives: learnable, so the loss falls steadily and
    # two runs' traces stay comparable (random labels make training chaotic).
    teacher = torch.randn(3 * 32 * 32, 10, generator=g).to(dev)
    ys = (xs.flatten(2) @ teacher).argmax(-1)

    @torch.compile
    def train_step(x, y):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        return loss.detach()

    it = [0]

    def step():
        i = it[0] % 8
        it[0] += 1
        opt.zero_grad(set_to_none=True)
        loss = train_step(xs[i], ys[i])
        opt.step()
        return loss

    common.run("torch_compile", "img/s", args.batch, args, step, torch.cuda.synchronize,
               lambda v: float(v), weights=common.torch_weights(net),
               to_floats=common.torch_losses(torch))


if __name__ == "__main__":
    main()
