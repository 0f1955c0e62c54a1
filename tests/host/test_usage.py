"""The usage snapshot: what it says of a vGPU's utilisation where NVML cannot say."""

from __future__ import annotations

import subprocess

from hvgpu.host.registry import Registry, SliceExecutor
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateStore
from hvgpu.host.usage import snapshot
from tests.conftest import fake_gpus


def test_an_mps_clients_utilisation_is_unknown_not_zero(tmp_path):
    """NVML counts an MPS client's work as the MPS server's: the client's pid is listed
    with no sample. Its vGPU must read as unknown, not as an idle 0%."""
    slices = SliceManager(StateStore(str(tmp_path)), fake_gpus)
    slices.attach("vm1", 1 << 26)
    slices.attach("vm2", 1 << 26)
    registry = Registry(slices)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        for vm, mps in (("vm1", True), ("vm2", False)):
            record = next(r for k, r in registry.records.items() if k.vm == vm)
            record.current = SliceExecutor(record.key, proc, None, 1, 1 << 26, 50, mps,
                                           record=record)
        snap = snapshot(registry, tuple(fake_gpus()))
        pids = {v.vm: v.pids for v in snap.vgpus}
        assert pids == {"vm1": (), "vm2": (proc.pid,)}  # the sampler looks up vm2's only
    finally:
        proc.kill()
        proc.wait()
