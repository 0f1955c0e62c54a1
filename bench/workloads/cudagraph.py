"""A launch-bound training step captured whole with torch.cuda.CUDAGraph and replayed:
an MLP of many narrow layers (dozens of small kernels forward, backward and in the
optimiser), so a step costs what its launches cost. Natively the replay is one
cudaGraphLaunch; through the shim it is one one-way frame."""

from __future__ import annotations

from bench.workloads import common


def main() -> None:
    args = common.arguments(__doc__, steps=200, warmup=3, batch=64)
    import torch

    common.torch_deterministic(torch)
    torch.manual_seed(args.seed)
    nn = torch.nn
    dev = torch.device("cuda")
    layers = []
    for _ in range(12):
        layers += [nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()]
    net = nn.Sequential(nn.Linear(64, 256), *layers, nn.Linear(256, 10)).to(dev)
    # capturable: the optimiser's step counter stays on the GPU, so the step can be captured
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=True)
    g = torch.Generator().manual_seed(args.seed)
    xs = torch.randn(8, args.batch, 64, generator=g).to(dev)
    teacher = torch.randn(64, 10, generator=g).to(dev)
    ys = (xs @ teacher).argmax(-1)
    static_x, static_y = xs[0].clone(), ys[0].clone()

    def train_step():
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(net(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    # Warm up on a side stream (cuBLAS workspaces, the optimiser's state), as PyTorch's
    # documentation asks before capturing.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = train_step()

    it = [0]

    def step():
        i = it[0] % 8
        it[0] += 1
        static_x.copy_(xs[i])
        static_y.copy_(ys[i])
        graph.replay()
        return static_loss.clone()

    common.run("cudagraph", "steps/s", 1, args, step, torch.cuda.synchronize,
               lambda v: float(v), weights=common.torch_weights(net),
               to_floats=common.torch_losses(torch))


if __name__ == "__main__":
    main()
