"""CIFAR-size ResNet-20 (He et al. 2016, the 3x3-stage CIFAR variant), fp32, SGD with
momentum and weight decay, cuDNN convolutions. Small batches make it launch-bound, which
is where a remoting layer shows its cost."""

from __future__ import annotations

from bench.workloads import common


def model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def main() -> None:
    args = common.arguments(__doc__, steps=40, warmup=10, batch=128)
    import torch

    common.torch_deterministic(torch)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    net = model(torch).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(args.seed)
    # A fixed set of batches, made on the host and copied once: the data pipeline is not
    # what is measured.
    xs = torch.randn(8, args.batch, 3, 32, 32, generator=g).to(dev)
    # Labels a fixed random linear teacher gives: learnable, so the loss falls steadily and
    # two runs' traces stay comparable (random labels make training chaotic).
    teacher = torch.randn(3 * 32 * 32, 10, generator=g).to(dev)
    ys = (xs.flatten(2) @ teacher).argmax(-1)
    it = [0]

    def step():
        i = it[0] % 8
        it[0] += 1
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(xs[i]), ys[i])
        loss.backward()
        opt.step()
        return loss.detach()

    common.run("resnet20", "img/s", args.batch, args, step, torch.cuda.synchronize,
               lambda v: float(v), weights=common.torch_weights(net),
               to_floats=common.torch_losses(torch))


if __name__ == "__main__":
    main()
