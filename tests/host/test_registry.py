"""The registry: one record per vGPU, made, changed and dropped only by sync()."""

from __future__ import annotations

from hvgpu.host.names import VgpuKey
from hvgpu.host.registry import Registry
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateStore
from tests.conftest import fake_gpus

M = 1 << 20


def test_records_follow_the_slice_manager_ledgers_included(tmp_path):
    slices = SliceManager(StateStore(str(tmp_path)), fake_gpus)
    slices.attach("vm1", 64 * M)
    registry = Registry(slices)
    record = registry.get(VgpuKey("vm1", 0))
    assert record.ledger.limit == 64 * M and registry.keys_of("vm1") == [VgpuKey("vm1", 0)]

    slices.attach("vm2", 32 * M, cid=9)
    slices.resize("vm1", 128 * M)
    changes = registry.sync()
    assert [r.key for r in changes.added] == [VgpuKey("vm2", 0)]
    assert [(r.key, old.mem) for r, old in changes.changed] == [(VgpuKey("vm1", 0), 64 * M)]
    assert record.ledger.limit == 128 * M  # the same ledger: what guests hold stays counted
    assert registry.by_cid(9).key == VgpuKey("vm2", 0)

    slices.detach("vm1")
    changes = registry.sync()
    assert changes.removed == [record] and registry.get(VgpuKey("vm1", 0)) is None
    assert registry.sync().added == registry.sync().removed == []  # nothing more to do
