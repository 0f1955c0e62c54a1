"""Device memory a guest makes the driver take is charged to its slice.

Allocations are charged as the driver takes them (its granularity, not the
bytes asked for), and a module's `__device__` variables are charged at load
(they take device memory with no cuMemAlloc), so many tiny allocations or a
module with a huge array cannot go past the quota, with or without MPS; and
the guest's cuMemGetInfo says what the ledger says.
"""

from __future__ import annotations

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, Program
from hvgpu.host.executor.cuda_device import driver_footprint

M = 1 << 20
BIG = '__device__ char big[{n}];\nextern "C" __global__ void noop() {{}}\n'


def test_footprint_follows_the_driver():
    # as measured on the H200: small ones share pages in 512-byte steps, larger ones
    # take whole 2 MiB pages
    assert driver_footprint(1) == 512 and driver_footprint(513) == 1024
    assert driver_footprint(1 << 20) == 1 << 20
    assert driver_footprint((1 << 20) + 1) == 2 * M and driver_footprint(2 * M + 1) == 4 * M


def test_many_tiny_allocations_cannot_pass_the_quota(agent, control):
    control.call("attach", vm="vm1", mem="1M")
    with Connection(agent.vm_address("vm1")) as conn:
        held = []
        with pytest.raises(CudaError) as info:
            for _ in range(4096):
                held.append(conn.call("MEM_ALLOC", 1)[0])
        assert info.value.status == 2  # CUDA_ERROR_OUT_OF_MEMORY
        assert len(held) == (1 << 20) // 512  # not 1 MiB of one-byte allocations
        (st,) = control.call("status")
        assert st["mem_used"] == 1 << 20
        for ptr in held:
            conn.call("MEM_FREE", ptr)
        assert control.call("status")[0]["mem_used"] == 0


def test_a_module_with_a_huge_device_array_is_refused(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        with pytest.raises(CudaError) as info:
            Program(BIG.format(n=512 * M), connection=conn).compile()
        assert info.value.status == 2 and "variables" in str(info.value)
        assert control.call("status")[0]["mem_used"] == 0
        dev = Device(connection=conn)
        dev.allocate(8 * M)  # the guest is still served


def test_module_variables_count_against_the_quota_and_in_mem_info(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        module = Program(BIG.format(n=40 * M), connection=conn).compile()
        assert control.call("status")[0]["mem_used"] == 40 * M
        assert dev.mem_info() == (24 * M, 64 * M)
        with pytest.raises(CudaError) as info:
            dev.allocate(32 * M)  # 40 + 32 > 64
        assert info.value.status == 2
        module.close()
        assert control.call("status")[0]["mem_used"] == 0
        dev.allocate(32 * M)


def test_a_disconnect_returns_everything_charged(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        Program(BIG.format(n=10 * M), connection=conn).compile()
        Device(connection=conn).allocate(3 * M)
    import time
    deadline = time.monotonic() + 20
    while control.call("status")[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.call("status")[0]["mem_used"] == 0
