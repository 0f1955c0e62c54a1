"""A VM that faults and reconnects in a loop cannot multiply its executors.

Each kernel fault poisons its executor, which retires with the connections that saw
it; the VM's next connection gets a new one. A hostile guest that faults, keeps the
connection and reconnects would otherwise start an executor (a process, a CUDA
context on the GPU) per round: the agent keeps at most MAX_RETIRING of a vGPU's
executors ending, and after the second fault in quick succession a new executor
waits, twice as long after each further fault.
"""

from __future__ import annotations

import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.host import agent as agent_module
from hvgpu.virtio import protocol as P
from tests.host.test_agent import saxpy_works_at

FAULT = 'extern "C" __global__ void fault() {}'


def _fault_and_keep(address: str) -> Connection:
    conn = Connection(address)
    launch(Program(FAULT, connection=conn).compile().get_kernel("fault"), LaunchConfig())
    with pytest.raises(CudaError) as info:
        Device(connection=conn).sync()
    assert info.value.status == P.CUDA_ERROR_ILLEGAL_ADDRESS
    return conn


def _executors(control) -> int:
    return len(control.call("status")[0]["executors"])


def test_faulted_executors_kept_open_are_bounded_and_the_next_is_refused_with_why(
        agent, control, monkeypatch):
    monkeypatch.setattr(agent_module, "RESTART_BACKOFF", 0.0)  # the bound alone here
    control.call("attach", vm="vm1", mem="64M")
    address = agent.vm_address("vm1")
    kept = []
    try:
        for _ in range(agent_module.MAX_RETIRING):
            kept.append(_fault_and_keep(address))
        assert _executors(control) == agent_module.MAX_RETIRING
        with pytest.raises(CudaError) as refused:  # a fifth would need a fifth executor
            _fault_and_keep(address)
        assert refused.value.status == P.HV_TOO_MANY_CONNECTIONS
        assert "executors still ending" in str(refused.value)
        assert _executors(control) == agent_module.MAX_RETIRING
        # another VM is served meanwhile
        control.call("attach", vm="vm2", mem="64M")
        assert saxpy_works_at(agent.vm_address("vm2"))
    finally:
        for conn in kept:
            conn.close()
    # once the connections that saw the faults close, the VM is served again
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if saxpy_works_at(address):
                break
        except CudaError:
            time.sleep(0.1)
    assert saxpy_works_at(address)


def test_faults_in_quick_succession_slow_the_next_executor_down(agent, control, monkeypatch):
    monkeypatch.setattr(agent_module, "RESTART_BACKOFF", 2.0)
    control.call("attach", vm="vm1", mem="64M")
    address = agent.vm_address("vm1")
    _fault_and_keep(address).close()  # the first restarts at once
    _fault_and_keep(address).close()  # the second: the next executor waits 2 s
    with pytest.raises(CudaError) as refused:
        Connection(address).close()
    assert refused.value.status == P.HV_TOO_MANY_CONNECTIONS
    assert "2 faults in quick succession" in str(refused.value)
    time.sleep(2.1)
    assert saxpy_works_at(address)
