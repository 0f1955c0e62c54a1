"""torch.distributed with the NCCL backend, world size 1: a DDP training step and an
all_reduce, as many training scripts run on one GPU."""
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

store = tempfile.NamedTemporaryFile(delete=False).name
dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1)).cuda()
ddp = DistributedDataParallel(model, device_ids=[0])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
x, y = torch.randn(128, 64, device="cuda"), torch.randn(128, 1, device="cuda")
for step in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.5f}")
t = torch.arange(8.0, device="cuda")
dist.all_reduce(t)
print("all_reduce", t.tolist())
dist.destroy_process_group()
sys.stdout.flush()
