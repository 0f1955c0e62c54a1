"""Two VMs on one GPU, without MPS: the second frees (or takes) device memory while
the first loads a module, to make the load look free.

A module's `__device__` variables are charged what the load took of the GPU's
free memory, and that free memory is the device's, not the executor's. Before,
another VM's executor could give memory back between the two readings: a load
of 40 MiB of variables under a 64 MiB quota was then charged nothing, and
twelve such modules were held under that quota. Now every executor on the GPU
shares one device-memory lock: the other VM's release waits for the
measurement. The double here reports free memory device-wide, as the driver
does, and each of its module loads takes a second, so the release lands inside
the measurement unless something holds it off.
"""

from __future__ import annotations

import threading
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, Program
from hvgpu.host.control_grpc import ControlClient
from tests.conftest import FAKE_DEVICE, RunningAgent

M = 1 << 20
BIG = '__device__ char big[{n}];\nextern "C" __global__ void noop() {{}}\n'


@pytest.fixture
def two_vms(tmp_path):
    shared = tmp_path / "device-wide"
    shared.mkdir()
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"),
                           executor_write=[str(shared)])
    running.config.env.update(HVGPU_FAKE_DEVICE_WIDE=str(shared), HVGPU_FAKE_LOAD_SECONDS="1")
    client = ControlClient(running.control)
    client.call("attach", vm="vm1", mem="64M")
    client.call("attach", vm="vm2", mem="512M")
    yield running, client
    client.close()
    running.stop()


def _load_while(agent, other_acts) -> tuple[list, float, int, int]:
    """vm1 loads a module of 40 MiB of variables; ``other_acts`` runs in vm2's connection
    once the load is under way. Returns what the load gave, when vm2's act ended, and
    what each VM's ledger then holds (asked through its executor, whose charges travel
    to the agent ahead of the question)."""
    loaded: list = []
    with Connection(agent.vm_address("vm1")) as one, \
            Connection(agent.vm_address("vm2")) as two:
        Device(connection=one).mem_info()  # both executors up before the race
        prepared = other_acts(Device(connection=two), None)
        start = time.monotonic()

        def load():
            try:
                loaded.append(Program(BIG.format(n=40 * M), connection=one).compile())
            except CudaError as exc:
                loaded.append(exc)

        t = threading.Thread(target=load)
        t.start()
        time.sleep(0.4)  # inside the load's second
        other_acts(Device(connection=two), prepared)
        acted = time.monotonic() - start
        t.join(30)
        assert not t.is_alive()
        return loaded, acted, one.call("SLICE_INFO")[2], two.call("SLICE_INFO")[2]


def test_another_vms_release_cannot_make_a_module_look_free(two_vms):
    agent, client = two_vms

    def free_256(dev, prepared):
        if prepared is None:
            return dev.allocate(256 * M)
        prepared.close()

    loaded, acted, used_one, used_two = _load_while(agent, free_256)
    assert not isinstance(loaded[0], Exception), loaded
    assert used_one == 40 * M  # charged what its variables take
    assert used_two == 0
    assert acted >= 0.9  # vm2's free waited for the measurement, and was then done


def test_another_vms_allocation_is_not_charged_to_a_loading_module(two_vms):
    agent, client = two_vms
    held = []

    def take_256(dev, prepared):
        if prepared is None:
            return "ready"
        held.append(dev.allocate(256 * M))

    loaded, acted, used_one, used_two = _load_while(agent, take_256)
    assert not isinstance(loaded[0], Exception), loaded  # 40 + 256 MiB would refuse it
    assert used_one == 40 * M
    assert used_two == 256 * M
