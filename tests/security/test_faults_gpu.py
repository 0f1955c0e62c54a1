"""On the GPU: a faulting kernel in one guest program leaves the VM's later and
concurrent programs working, with and without MPS (``gpu`` marker)."""

from __future__ import annotations

import threading

import pytest

from hvgpu.host.demo import run_saxpy
from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from tests.conftest import RunningAgent

pytestmark = pytest.mark.gpu

FAULT = 'extern "C" __global__ void write_to(int* p) { *p = 1; }'


@pytest.fixture(params=[False, True], ids=["time-shared", "mps"])
def agent(request, tmp_path):
    from hvgpu.host.inventory import read_gpus

    running = RunningAgent(tmp_path, None, slices=True, vms=("vm1", "vm2"), gpus=read_gpus,
                           mps=request.param)
    running.api.attach("vm1", "2G")
    running.api.attach("vm2", "2G")
    yield running
    running.stop()


def test_a_fault_leaves_later_and_concurrent_programs_working(agent):
    address = agent.vm_address("vm1")
    with Connection(address) as faulty:
        dev = Device(connection=faulty)
        kernel = Program(FAULT, connection=faulty).compile().get_kernel("write_to")
        launch(kernel, LaunchConfig(grid=1, block=1), 16)  # an address nobody allocated
        with pytest.raises(CudaError) as info:
            dev.sync()
        print(f"\nfaulting program: {info.value}")
        assert info.value.status in (700, 719)
        errors = []

        def program():
            try:
                with Connection(address) as conn:
                    errors.append(run_saxpy(conn, 1 << 20))
            except CudaError as exc:
                errors.append(exc)

        program()  # a later program, while the faulting one is still connected
        threads = [threading.Thread(target=program) for _ in range(2)]  # and two at once
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        print(f"later programs' max errors: {errors}")
        assert len(errors) == 3 and all(isinstance(e, float) and e < 1e-6 for e in errors)
        with Connection(agent.vm_address("vm2")) as other:  # another VM, after the fault
            assert run_saxpy(other, 1 << 20) < 1e-6
    (st,) = [s for s in agent.api.status() if s["vm"] == "vm1"]
    print(f"vm1 executors after the fault: {st['executors']}")
