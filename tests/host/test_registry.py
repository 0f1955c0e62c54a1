"""The registry: one record per vGPU, made, changed and dropped only by apply(), from
what the slice store says it changed."""

from __future__ import annotations

import dataclasses

import pytest

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

    changes = registry.apply(slices.attach("vm2", 32 * M, cid=9))
    assert [r.key for r in changes.added] == [VgpuKey("vm2", 0)]
    changes = registry.apply(slices.resize("vm1", 128 * M))
    assert [(r.key, old.mem) for r, old in changes.changed] == [(VgpuKey("vm1", 0), 64 * M)]
    assert record.ledger.limit == 128 * M  # the same ledger: what guests hold stays counted
    assert registry.by_cid(9).key == VgpuKey("vm2", 0)

    changes = registry.apply(slices.detach("vm1"))
    assert changes.removed == [record] and registry.get(VgpuKey("vm1", 0)) is None
    assert not slices.resize("vm2", 32 * M)  # no change: nothing for anyone to apply


def test_slices_are_values_changed_only_by_the_store(tmp_path):
    slices = SliceManager(StateStore(str(tmp_path)), fake_gpus)
    (s,) = slices.attach("vm1", 64 * M).added
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.mem = 1  # a copy anywhere cannot drift from the store
    (before, after), = slices.resize("vm1", 128 * M).changed
    assert (before.mem, after.mem, slices.get("vm1").mem) == (64 * M, 128 * M, 128 * M)
