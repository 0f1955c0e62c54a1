"""A small GPT-style decoder (pre-norm blocks, causal scaled_dot_product_attention, GELU
MLP), trained with bf16 autocast and fused AdamW: cuBLASLt GEMMs, flash/efficient
attention kernels, launches with attributes."""

from __future__ import annotations

from bench.workloads import common


def model(torch, vocab, d, heads, layers, seq):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.n2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, d // heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.n2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(1, seq, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos[:, :idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    return GPT()


def main() -> None:
    args = common.arguments(__doc__, steps=30, warmup=8, batch=16)
    import torch

    common.torch_deterministic(torch)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    vocab, seq = 4096, 256
    net = model(torch, vocab, d=384, heads=6, layers=4, seq=seq).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, fused=True)
    g = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, vocab, (8, args.batch, seq + 1), generator=g).to(dev)
    it = [0]

    def step():
        chunk = data[it[0] % 8]
        it[0] += 1
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(chunk[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab),
                                                     chunk[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    common.run("gpt", "tok/s", args.batch * seq, args, step, torch.cuda.synchronize,
               lambda v: float(v), weights=common.torch_weights(net),
               to_floats=common.torch_losses(torch))


if __name__ == "__main__":
    main()
