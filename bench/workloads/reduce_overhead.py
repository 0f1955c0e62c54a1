"""torch.compile(mode="reduce-overhead") of a small classifier's training step: Inductor's
Triton kernels, replayed as CUDA graphs by its cudagraph trees."""

from __future__ import annotations

from bench.workloads import common


def main() -> None:
    args = common.arguments(__doc__, steps=100, warmup=6, batch=64)
    import torch

    common.torch_deterministic(torch)
    torch.manual_seed(args.seed)
    nn = torch.nn
    dev = torch.device("cuda")
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                        nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed)
    xs = torch.randn(8, args.batch, 64, generator=g).to(dev)
    teacher = torch.randn(64, 10, generator=g).to(dev)
    ys = (xs @ teacher).argmax(-1)

    @torch.compile(mode="reduce-overhead")
    def forward_backward(x, y):
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        return loss.detach()

    it = [0]

    def step():
        i = it[0] % 8
        it[0] += 1
        opt.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        loss = forward_backward(xs[i], ys[i]).clone()
        opt.step()
        return loss

    common.run("reduce_overhead", "img/s", args.batch, args, step, torch.cuda.synchronize,
               lambda v: float(v), weights=common.torch_weights(net),
               to_floats=common.torch_losses(torch))


if __name__ == "__main__":
    main()
