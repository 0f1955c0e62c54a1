"""Runs in the guest: hvgpu's Python API over AF_VSOCK (its default vsock://2:5170),
checked against what the GPU test double computes on the host. Prints one line per
check; exits 1 at the first that fails."""

import array
import sys

from hvgpu.errors import CudaError
from hvgpu.guest import Device, LaunchConfig, Program, launch


def check(what, ok):
    print(f"{what}: {'ok' if ok else 'FAILED'}", flush=True)
    if not ok:
        sys.exit(1)


dev = Device()
print(f"device: {dev.name}, {dev.total_memory >> 20} MiB", flush=True)
n = 1 << 14
x = array.array("f", (float(i) for i in range(n)))
y = array.array("f", [1.0]) * n
dx, dy = dev.allocate(4 * n), dev.allocate(4 * n)
dx.copy_from(x)
dy.copy_from(y)
back = array.array("f")
back.frombytes(dx.copy_to())
check("copies there and back", back == x)
saxpy = Program('extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
                ).compile().get_kernel("saxpy")
launch(saxpy, LaunchConfig(grid=n // 256, block=256), 2.0, dx, dy, n)
dev.sync()
out = array.array("f")
out.frombytes(dy.copy_to())
check("saxpy", all(out[i] == 2.0 * i + 1.0 for i in range(n)))
free, total = dev.mem_info()
check("memory in use is charged", total - free >= 8 * n)
# A kernel that faults: launches are one-way, so the error comes at the next sync.
fault = Program('extern "C" __global__ void fault() {}').compile().get_kernel("fault")
launch(fault, LaunchConfig(grid=1, block=1))
try:
    dev.sync()
    check("deferred error at the next sync", False)
except CudaError as e:
    print(f"deferred error: {e.status} {e}", flush=True)
    check("deferred error at the next sync", e.status == 700)
