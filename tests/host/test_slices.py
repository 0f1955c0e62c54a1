import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from hvgpu.errors import HvgpuError
from hvgpu.host.inventory import Gpu
from hvgpu.host.names import VgpuKey
from hvgpu.host.slices import NoRoom, SliceError, SliceManager, UnknownVm
from hvgpu.host.state import StateError, StateStore

G = 1 << 30


def gpus(*sizes):
    return lambda: [Gpu(i, f"GPU-{i}", "NVIDIA H200", size * G, 0, 0, False, True, "")
                    for i, size in enumerate(sizes)]


@pytest.fixture
def manager(tmp_path):
    return SliceManager(StateStore(tmp_path), gpus(80, 40))


def test_best_fit_picks_the_tightest_gpu(manager):
    assert manager.attach("vm1", 30 * G).added[0].gpu_index == 1  # fits both; GPU 1 is tighter
    assert manager.attach("vm2", 30 * G).added[0].gpu_index == 0  # GPU 1 has 10 GiB left
    assert manager.attach("vm3", 10 * G).added[0].gpu_index == 1


def test_over_commit_is_refused_with_what_is_free_where(manager):
    manager.attach("vm1", 70 * G)
    with pytest.raises(NoRoom) as info:
        manager.attach("vm2", 50 * G)
    assert "GPU 0 (NVIDIA H200) 10 GiB free" in str(info.value)
    assert "GPU 1 (NVIDIA H200) 40 GiB free" in str(info.value)


def test_compute_shares_cannot_exceed_the_gpu(manager):
    manager.attach("a", G, compute=75, gpu=0)
    with pytest.raises(NoRoom, match="25% compute free"):
        manager.attach("b", G, compute=50, gpu=0)
    assert manager.attach("b", G, compute=25, gpu=0).added[0].compute == 25


def test_named_gpu_by_index_or_uuid(manager):
    assert manager.attach("a", G, gpu="GPU-0").added[0].gpu_index == 0
    assert manager.attach("b", G, gpu=1).added[0].gpu_index == 1
    with pytest.raises(SliceError, match="no GPU '7'"):
        manager.attach("c", G, gpu="7")


def test_a_vm_and_a_cid_have_one_slice_each(manager):
    manager.attach("vm1", G, cid=5)
    with pytest.raises(SliceError, match="resize"):
        manager.attach("vm1", G)
    with pytest.raises(SliceError, match="CID 5 already belongs to 'vm1'"):
        manager.attach("vm2", G, cid=5)
    assert manager.by_cid(5).vm == "vm1"


def test_resize_grows_and_refuses_to_shrink_below_use(manager):
    manager.attach("vm1", 10 * G, gpu=1)
    assert manager.resize("vm1", mem=40 * G).now[0].mem == 40 * G
    with pytest.raises(NoRoom, match="cannot grow"):
        manager.resize("vm1", mem=41 * G)
    with pytest.raises(SliceError, match="its guest uses 6 GiB now"):
        manager.resize("vm1", mem=5 * G, in_use=6 * G)
    assert manager.resize("vm1", mem=6 * G, in_use=6 * G).now[0].mem == 6 * G


def test_detach_and_unknown_vms(manager):
    manager.attach("vm1", G)
    manager.detach("vm1")
    with pytest.raises(UnknownVm, match="no slice is attached to 'vm1'"):
        manager.detach("vm1")


def test_a_restarted_manager_restores_every_slice(tmp_path):
    first = SliceManager(StateStore(tmp_path), gpus(80))
    first.attach("vm1", 4 * G, compute=25, cid=3)
    first.attach("vm2", 8 * G)
    first.resize("vm2", mem=9 * G)
    again = SliceManager(StateStore(tmp_path), gpus(80))
    assert [(s.vm, s.mem, s.compute, s.cid) for s in again.list()] == [
        ("vm1", 4 * G, 25, 3), ("vm2", 9 * G, 0, None)]


def test_a_write_torn_by_kill_9_leaves_the_previous_state(tmp_path):
    SliceManager(StateStore(tmp_path), gpus(80)).attach("vm1", 4 * G)
    # A writer killed inside an open transaction, after writing, before commit.
    code = f"""
import os, sqlite3, signal
db = sqlite3.connect({str(tmp_path / 'slices.db')!r}, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE vgpus SET mem = 1 WHERE vm = 'vm1'")
db.execute("INSERT INTO vgpus VALUES ('vm2',0,'GPU-0',0,1,0,NULL,0,0,0)")
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -signal.SIGKILL
    again = SliceManager(StateStore(tmp_path), gpus(80))
    assert [(s.vm, s.mem) for s in again.list()] == [("vm1", 4 * G)]


def test_state_of_the_one_slice_per_vm_release_is_kept_as_device_0(tmp_path):
    db = sqlite3.connect(tmp_path / "slices.db")
    db.execute("CREATE TABLE slices (vm TEXT PRIMARY KEY, gpu_uuid TEXT NOT NULL, gpu_index "
               "INTEGER NOT NULL, mem INTEGER NOT NULL, compute INTEGER NOT NULL, cid INTEGER "
               "UNIQUE, created REAL NOT NULL, updated REAL NOT NULL)")
    db.execute("INSERT INTO slices VALUES ('vm1', 'GPU-1', 1, 4096, 25, 7, 1.0, 2.0)")
    db.commit()
    db.close()
    m = SliceManager(StateStore(tmp_path), gpus(80, 40))
    assert [(s.vm, s.device, s.gpu_index, s.mem, s.compute, s.cid) for s in m.list()] == [
        ("vm1", 0, 1, 4096, 25, 7)]
    assert m.attach("vm1", G, add=True).added[0].gpu_index == 0  # its second vGPU: the other GPU


def test_count_places_a_vms_vgpus_on_distinct_gpus_all_or_none(manager):
    a, b = manager.attach("vm1", 30 * G, count=2, cid=4).added
    assert (a.device, b.device, {a.gpu_index, b.gpu_index}) == (0, 1, {0, 1})
    assert b.cid == 4 and manager.by_cid(4) is a
    with pytest.raises(NoRoom, match="3 vGPUs asked for, and this host has 2 GPUs: a VM's "
                       "vGPUs go to distinct GPUs unless one is named; attach with --gpu N"):
        manager.attach("vm2", G, count=3)
    assert manager.of_vm("vm2") == []  # none of the three was kept
    with pytest.raises(NoRoom, match="no GPU has room"):
        manager.attach("vm3", 35 * G, count=2)  # GPU 1 has 10 GiB left
    assert manager.of_vm("vm3") == []


def test_add_attaches_another_vgpu_and_detach_takes_the_last_first(manager):
    manager.attach("vm1", G)
    with pytest.raises(SliceError, match="--add for another"):
        manager.attach("vm1", G)
    second, = manager.attach("vm1", 2 * G, add=True).added
    assert second.device == 1 and second.key == VgpuKey("vm1", 1)
    third, = manager.attach("vm1", G, add=True, gpu=second.gpu_index).added  # named: may share a GPU
    assert third.gpu_index == second.gpu_index
    assert manager.resize("vm1", mem=3 * G, device=1).now[0].mem == 3 * G
    with pytest.raises(SliceError, match="detach vGPU 2 of 'vm1' first"):
        manager.detach("vm1", device=1)
    with pytest.raises(SliceError, match="has no vGPU 5; its devices are 0, 1, 2"):
        manager.get("vm1", 5)
    assert [s.key for s in manager.detach("vm1", device=2).removed] == [("vm1", 2)]
    assert [s.key for s in manager.detach("vm1").removed] == [("vm1", 0), ("vm1", 1)]
    assert manager.list() == []


def test_an_unreadable_state_file_is_reported_and_kept(tmp_path):
    (tmp_path / "slices.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match="left as it is"):
        StateStore(tmp_path)
    assert (tmp_path / "slices.db").read_bytes().startswith(b"this is not")


def _recorded_host(tmp_path, placement):
    """Two H200s as NVML reported them on the GPU machine (recorded answers)."""
    from hvgpu.host.inventory import read_gpus
    from tests.fake_nvml import H200, FakeNvml

    nvml = FakeNvml([dict(H200, uuid="GPU-aaaa"), dict(H200, uuid="GPU-bbbb")])
    return SliceManager(StateStore(tmp_path), lambda: read_gpus(nvml), placement)


@pytest.mark.parametrize("placement, expected", [
    ("best-fit", [0, 0, 0]),   # the tighter GPU each time: keep filling GPU 0
    ("pack", [0, 0, 0]),       # lowest index first
    ("spread", [0, 1, 0]),     # the emptier GPU each time
])
def test_placement_policies_on_a_two_gpu_host(tmp_path, placement, expected):
    m = _recorded_host(tmp_path, placement)
    placed = [m.attach(f"vm{i}", 20 * G).added[0].gpu_index for i in range(3)]
    assert placed == expected


def test_best_fit_and_pack_differ_where_a_later_gpu_is_tighter(tmp_path):
    m = SliceManager(StateStore(tmp_path), gpus(80, 40), "pack")
    assert m.attach("vm1", 30 * G).added[0].gpu_index == 0  # pack: GPU 0 first, though GPU 1 is tighter
    assert m.attach("vm2", 30 * G, placement="best-fit").added[0].gpu_index == 1  # per-attach override
    assert m.attach("vm3", 5 * G, placement="spread").added[0].gpu_index == 0  # 50 GiB free vs 10


def test_a_full_gpu_sends_the_next_vm_to_the_other(tmp_path):
    m = _recorded_host(tmp_path, "best-fit")
    assert m.attach("big", 130 * G).added[0].gpu_index == 0
    assert m.attach("next", 20 * G).added[0].gpu_index == 1  # GPU 0 has < 20 GiB left


def test_an_unknown_placement_is_refused_with_the_choices(tmp_path):
    with pytest.raises(SliceError, match="best-fit, pack, spread"):
        SliceManager(StateStore(tmp_path), gpus(80), "random")
    m = SliceManager(StateStore(tmp_path), gpus(80))
    with pytest.raises(SliceError, match="no placement policy 'first'"):
        m.attach("vm1", G, placement="first")


def test_a_vgpus_region_size_is_kept_resized_and_checked(tmp_path):
    m = SliceManager(StateStore(tmp_path), gpus(80))
    a, b = m.attach("vm1", 4 * G, count=2, gpu=0, region=1 << 30).added
    assert (a.region, b.region) == (1 << 30, 1 << 30)
    assert m.attach("vm2", G).added[0].region == 0  # no region unless asked for
    assert m.resize("vm1", device=1, region=2 << 20).now[0].region == 2 << 20
    assert m.resize("vm1", mem=5 * G).now[0].region == 1 << 30  # unchanged unless given
    with pytest.raises(HvgpuError, match="power of two from 1 MiB"):
        m.attach("vm3", G, region=3 << 20)
    with pytest.raises(HvgpuError, match="power of two from 1 MiB"):
        m.resize("vm1", region=1 << 19)
    assert m.of_vm("vm3") == [] and m.get("vm1").region == 1 << 30
    again = SliceManager(StateStore(tmp_path), gpus(80))
    assert [(s.vm, s.device, s.region) for s in again.list()] == [
        ("vm1", 0, 1 << 30), ("vm1", 1, 2 << 20), ("vm2", 0, 0)]
    assert again.store.problems == []


# vgpus as the release before the region lane created it, and its row sums
_BEFORE_REGIONS = """
CREATE TABLE vgpus (vm TEXT NOT NULL, device INTEGER NOT NULL, gpu_uuid TEXT NOT NULL,
    gpu_index INTEGER NOT NULL, mem INTEGER NOT NULL, compute INTEGER NOT NULL, cid INTEGER,
    created REAL NOT NULL, updated REAL NOT NULL, PRIMARY KEY (vm, device));
CREATE TABLE sums (vm TEXT NOT NULL, device INTEGER NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (vm, device));
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def _old_row_crc(row):
    import json
    import zlib

    return zlib.crc32(json.dumps(list(row)).encode())


def test_rows_stored_before_region_existed_read_as_none_and_keep_their_sums(tmp_path):
    row = ("vm1", "GPU-0", 0, 4096, 25, 7, 1.0, 2.0, 0)  # that release's column order
    db = sqlite3.connect(tmp_path / "slices.db")
    db.executescript(_BEFORE_REGIONS)
    db.execute("INSERT INTO vgpus (vm, gpu_uuid, gpu_index, mem, compute, cid, created, "
               "updated, device) VALUES (?,?,?,?,?,?,?,?,?)", row)
    db.execute("INSERT INTO sums VALUES ('vm1', 0, ?)", (_old_row_crc(row),))
    db.commit()
    db.close()
    store = StateStore(tmp_path)
    m = SliceManager(store, gpus(80))
    (s,) = m.list()
    assert (s.vm, s.mem, s.cid, s.region) == ("vm1", 4096, 7, 0)
    assert store.problems == []  # its sum still holds: nothing reported as changed
    assert m.resize("vm1", region=1 << 20).now[0].region == 1 << 20
    store.close()
    again = SliceManager(StateStore(tmp_path), gpus(80))
    assert [(s.vm, s.region) for s in again.list()] == [("vm1", 1 << 20)]


# vgpus as the version before regions had one name created it: the column was shm
_BEFORE_THE_NAME = _BEFORE_REGIONS.replace(
    "updated REAL NOT NULL,", "updated REAL NOT NULL, shm INTEGER NOT NULL DEFAULT 0,")


def test_a_store_written_before_regions_had_their_name_keeps_them(tmp_path):
    import json

    row = ("vm1", "GPU-0", 0, 4096, 25, 7, 1.0, 2.0, 0, 1 << 20)  # its column order
    db = sqlite3.connect(tmp_path / "slices.db")
    db.executescript(_BEFORE_THE_NAME)
    db.execute("INSERT INTO vgpus (vm, gpu_uuid, gpu_index, mem, compute, cid, created, "
               "updated, device, shm) VALUES (?,?,?,?,?,?,?,?,?,?)", row)
    db.execute("INSERT INTO sums VALUES ('vm1', 0, ?)", (_old_row_crc(row),))
    db.commit()
    db.close()
    store = StateStore(tmp_path)
    m = SliceManager(store, gpus(80))
    assert [(s.vm, s.cid, s.region) for s in m.list()] == [("vm1", 7, 1 << 20)]
    assert store.problems == []  # its sum still holds: nothing reported as changed
    m.resize("vm1", mem=8192)
    store.close()
    columns = [r[1] for r in sqlite3.connect(tmp_path / "slices.db").execute(
        "PRAGMA table_info(vgpus)")]
    assert "region" in columns and "shm" not in columns  # renamed, not added beside it
    copy = json.loads((tmp_path / "slices.json").read_text())["vgpus"][0]
    assert copy["region"] == 1 << 20 and "shm" not in copy
    again = SliceManager(StateStore(tmp_path), gpus(80))
    assert [(s.vm, s.mem, s.region) for s in again.list()] == [("vm1", 8192, 1 << 20)]


def test_a_copy_written_before_regions_had_their_name_restores_them(tmp_path):
    import json

    row = dict(vm="vm1", gpu_uuid="GPU-0", gpu_index=0, mem=4096, compute=0, cid=7,
               created=1.0, updated=2.0, device=0, shm=1 << 20)  # as that version wrote it
    row["crc"] = _old_row_crc(tuple(v for k, v in row.items()))
    (tmp_path / "slices.json").write_text(json.dumps({"generation": 3, "vgpus": [row]}))
    store = StateStore(tmp_path)  # no slices.db: restored from the copy
    assert [(s.vm, s.cid, s.region) for s in SliceManager(store, gpus(80)).list()] == [
        ("vm1", 7, 1 << 20)]
    assert "restored 1 vGPU(s)" in store.problems[0] and len(store.problems) == 1


def test_a_copy_written_before_region_existed_restores_with_none(tmp_path):
    import json

    row = dict(vm="vm1", gpu_uuid="GPU-0", gpu_index=0, mem=4096, compute=0, cid=7,
               created=1.0, updated=2.0, device=0)
    row["crc"] = _old_row_crc(tuple(v for k, v in row.items()))
    (tmp_path / "slices.json").write_text(json.dumps({"generation": 3, "vgpus": [row]}))
    store = StateStore(tmp_path)  # no slices.db: restored from the copy
    assert [(s.vm, s.cid, s.region) for s in SliceManager(store, gpus(80)).list()] == [
        ("vm1", 7, 0)]
    assert "restored 1 vGPU(s)" in store.problems[0] and len(store.problems) == 1
