"""A faulting kernel in one guest program leaves the VM's later programs working.

A kernel fault (an illegal address, CUDA's 700) poisons the whole executor
process, as it does any CUDA process (measured on the H200: every context of
the process, old or new, answers 700 from then on). The executor says so to
the agent, which retires it at once: the faulting program keeps its errors as
CUDA gives them, and the VM's next programs get a fresh executor.
"""

from __future__ import annotations

import threading
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from tests.host.test_agent import saxpy_works_at

FAULT = 'extern "C" __global__ void fault() {}'


def test_later_and_concurrent_programs_work_after_a_fault(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    address = agent.vm_address("vm1")
    faulty = Connection(address)
    try:
        dev = Device(connection=faulty)
        launch(Program(FAULT, connection=faulty).compile().get_kernel("fault"), LaunchConfig())
        with pytest.raises(CudaError) as info:
            dev.sync()
        assert info.value.status == 700
        with pytest.raises(CudaError):  # the faulting program keeps its error, as in CUDA
            dev.sync()
        # while the faulting program is still connected: a later program, and two at once
        assert saxpy_works_at(address)
        results = []
        threads = [threading.Thread(target=lambda: results.append(saxpy_works_at(address)))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [True, True]
        (st,) = control.call("status")
        assert any(e["retiring"] for e in st["executors"])
    finally:
        faulty.close()
    deadline = time.monotonic() + 20  # the poisoned executor ends with its last program
    while time.monotonic() < deadline and len(control.call("status")[0]["executors"]) > 1:
        time.sleep(0.05)
    assert len(control.call("status")[0]["executors"]) == 1
    assert saxpy_works_at(address)


def test_a_fault_in_one_vm_leaves_another_vm_alone(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    control.call("attach", vm="vm2", mem="64M")
    with Connection(agent.vm_address("vm1")) as faulty:
        launch(Program(FAULT, connection=faulty).compile().get_kernel("fault"), LaunchConfig())
        with pytest.raises(CudaError):
            Device(connection=faulty).sync()
        assert saxpy_works_at(agent.vm_address("vm2"))
