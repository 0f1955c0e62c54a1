"""On the GPU, without MPS: another VM allocating and freeing a GiB over and over
while a VM loads a module of 40 MiB of `__device__` variables under a 64 MiB
quota. cuMemGetInfo is the device's, so without the shared device-memory lock
a load measured across the other VM's free looks free (charged 0) and one
measured across its allocation looks a GiB large (refused). Each load must be
charged its variables, and none refused (``gpu`` marker)."""

from __future__ import annotations

import threading
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, Program
from tests.conftest import RunningAgent

pytestmark = pytest.mark.gpu

M = 1 << 20
BIG = '__device__ char big[{n}];\nextern "C" __global__ void touch() {{ big[0] = 1; }}\n'
LOADS = 40


@pytest.fixture
def agent(tmp_path):
    from hvgpu.host.inventory import read_gpus

    running = RunningAgent(tmp_path, None, slices=True, vms=("vm1", "vm2"), gpus=read_gpus)
    running.api.attach("vm1", "64M")
    running.api.attach("vm2", "8G")
    yield running
    running.stop()


def test_another_vms_churn_neither_hides_nor_inflates_a_modules_charge(agent):
    stop = threading.Event()
    churned = []

    def churn():
        with Connection(agent.vm_address("vm2")) as conn:
            dev = Device(connection=conn)
            while not stop.is_set():
                dev.allocate(1 << 30).close()
                churned.append(1)

    other = threading.Thread(target=churn, daemon=True)
    charges, refused = [], []
    with Connection(agent.vm_address("vm1")) as conn:
        Program(BIG.format(n=M), connection=conn).compile().close()  # NVRTC warmed up
        other.start()
        time.sleep(0.5)
        for _ in range(LOADS):
            try:
                module = Program(BIG.format(n=40 * M), connection=conn).compile()
            except CudaError as exc:
                refused.append(str(exc))
                continue
            charges.append(conn.call("SLICE_INFO")[2])
            module.close()
        stop.set()
        other.join(60)
    print(f"\n{LOADS} loads beside {len(churned)} GiB allocations of another VM: charged "
          f"{sorted(set(c // M for c in charges))} MiB; refused {len(refused)}"
          + (f" (first: {refused[0]})" if refused else ""))
    assert len(churned) > LOADS  # the other VM churned all along
    assert refused == []
    assert charges and min(charges) >= 40 * M and max(charges) < 64 * M
