"""The slice state cannot silently vanish or change.

Once, the WAL was never checkpointed (after kill -9 the slices lived only in
slices.db-wal), deleting it or emptying slices.db started the agent with no
slices and no word, a corrupt page gave a raw traceback, changed bytes
silently changed a quota, and a row with mem='lots' or mem=-5 was loaded and
later killed the agent or an executor. Each test below does one of those to
a real sqlite file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateError, StateStore
from hvgpu.virtio import protocol as P
from tests.conftest import FAKE_DEVICE, REPO, RunningAgent, fake_gpus

M = 1 << 20


def manager(directory) -> SliceManager:
    return SliceManager(StateStore(directory), fake_gpus)


def listed(directory) -> list[tuple]:
    m = manager(directory)
    try:
        return [(s.vm, s.device, s.mem, s.cid) for s in m.list()]
    finally:
        m.store.close()


def two_vms(directory) -> None:
    m = manager(directory)
    m.attach("vm1", 16 * M, cid=5)
    m.attach("vm2", 8 * M, cid=6)
    m.store.close()


def test_every_change_is_in_the_main_file_so_a_lost_wal_loses_nothing(tmp_path):
    code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateStore
from tests.conftest import fake_gpus
m = SliceManager(StateStore({str(tmp_path)!r}), fake_gpus)
m.attach("vm1", 16 << 20, cid=5)
m.attach("vm2", 8 << 20, cid=6)
m.resize("vm1", mem=32 << 20)
os._exit(0)  # as kill -9 would: no close, no last checkpoint
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    for extra in ("slices.db-wal", "slices.db-shm", "slices.json"):  # the file alone
        (tmp_path / extra).unlink(missing_ok=True)
    store = StateStore(tmp_path)
    assert [(s.vm, s.mem) for s in SliceManager(store, fake_gpus).list()] == [
        ("vm1", 32 * M), ("vm2", 8 * M)]
    assert store.problems == []


@pytest.mark.parametrize("how", ["truncated to 0", "deleted"])
def test_a_missing_or_emptied_database_is_detected_restored_and_said(tmp_path, how):
    two_vms(tmp_path)
    db = tmp_path / "slices.db"
    if how == "deleted":
        db.unlink()
    else:
        os.truncate(db, 0)
    store = StateStore(tmp_path)
    assert [(s.vm, s.mem, s.cid) for s in SliceManager(store, fake_gpus).list()] == [
        ("vm1", 16 * M, 5), ("vm2", 8 * M, 6)]
    (problem,) = store.problems
    assert "missing or empty" in problem and "restored 2 vGPU(s)" in problem
    assert "slices.json" in problem and "vm1, vm2" in problem


def test_a_database_older_than_its_last_change_is_detected_and_restored(tmp_path):
    m = manager(tmp_path)
    m.attach("vm1", 16 * M, cid=5)
    old = (tmp_path / "slices.db").read_bytes()
    m.attach("vm2", 8 * M, cid=6)
    m.store.close()
    (tmp_path / "slices.db").write_bytes(old)  # e.g. a file system that lost the last write
    store = StateStore(tmp_path)
    assert [s.vm for s in SliceManager(store, fake_gpus).list()] == ["vm1", "vm2"]
    assert "older than" in store.problems[0] and "lost changes" in store.problems[0]


def test_a_quota_changed_by_bytes_in_the_file_is_detected(tmp_path):
    m = manager(tmp_path)
    m.attach("vm1", 123456789, cid=5)
    m.attach("vm2", 8 * M, cid=6)
    m.store.close()
    db = tmp_path / "slices.db"
    data = db.read_bytes()
    assert b"\x07\x5b\xcd\x15" in data  # 123456789, as sqlite stores it
    db.write_bytes(data.replace(b"\x07\x5b\xcd\x15", b"\x07\x5b\xcd\x16"))
    store = StateStore(tmp_path)
    assert [s.vm for s in SliceManager(store, fake_gpus).list()] == ["vm2"]
    (problem,) = store.problems
    assert "VM 'vm1' device 0" in problem and "checksum" in problem
    assert b"\x07\x5b\xcd\x16" in db.read_bytes()  # reported, not repaired behind one's back


def test_a_damaged_page_is_a_one_line_error_and_the_file_is_kept(tmp_path):
    two_vms(tmp_path)
    db = tmp_path / "slices.db"
    data = bytearray(db.read_bytes())
    data[4096:4096 + 16] = b"\xff" * 16  # the header of the table's b-tree page
    db.write_bytes(bytes(data))
    with pytest.raises(StateError) as info:
        StateStore(tmp_path)
    assert "\n" not in str(info.value) and str(db) in str(info.value)
    assert db.read_bytes() == bytes(data)
    out = CliRunner().invoke(cli, ["--control", str(tmp_path / "c.sock"), "agent",
                                   "--state-dir", str(tmp_path), "--no-vsock",
                                   "--listen", f"unix://{tmp_path}/a.sock"])
    assert out.exit_code == 1
    assert "hvgpu: error: cannot read the slice state" in out.output
    assert "Traceback" not in out.output


BAD_ROWS = {
    "mem = 'lots'": "memory quota 'lots'",
    "mem = -5": "memory quota -5",
    "mem = 0": "memory quota 0",
    "compute = 101": "compute share 101",
    "cid = 2": "CID 2",
    "device = 9": "device 9",
    "gpu_uuid = ''": "GPU UUID ''",
    "vm = 'a/b'": "contains '/'",
    "region = 3145728": "3 MiB is not a size for a region",
    "region = -1": "-1 is not a size for a region",
}


@pytest.mark.parametrize("change", list(BAD_ROWS))
def test_a_bad_row_is_reported_with_its_vm_and_left_out_and_the_file_kept(tmp_path, change):
    two_vms(tmp_path)
    db = sqlite3.connect(tmp_path / "slices.db", isolation_level=None)
    db.execute(f"UPDATE vgpus SET {change} WHERE vm = 'vm1'")
    db.close()
    store = StateStore(tmp_path)
    assert [s.vm for s in SliceManager(store, fake_gpus).list()] == ["vm2"]
    (problem,) = store.problems
    assert BAD_ROWS[change] in problem and "left out" in problem
    assert "vm1" in problem or "a/b" in problem
    rows = sqlite3.connect(tmp_path / "slices.db").execute("SELECT count(*) FROM vgpus")
    assert rows.fetchone() == (2,)


def test_an_agent_with_bad_rows_serves_the_good_ones(tmp_path, caplog):
    two_vms(tmp_path / "state")
    db = sqlite3.connect(tmp_path / "state" / "slices.db", isolation_level=None)
    db.execute("UPDATE vgpus SET mem = 'lots' WHERE vm = 'vm2'")
    db.close()
    caplog.set_level(logging.WARNING, logger="hvgpu")
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    try:
        assert "VM 'vm2' device 0: the stored row is left out" in caplog.text
        out = CliRunner().invoke(cli, ["--control", running.control, "list"])
        assert out.exit_code == 0 and "vm1" in out.output and "vm2" not in out.output
        with pytest.raises(CudaError) as info:
            Connection(running.vm_address("vm2"))
        assert info.value.status == P.HV_NO_SLICE
        with Connection(running.vm_address("vm1")) as conn:
            Device(connection=conn).allocate(M).close()
    finally:
        running.stop()


def test_a_read_only_database_is_said_to_be_read_only(tmp_path):
    directory = Path(tempfile.mkdtemp(prefix="hvgpu-ro-"))  # reachable by another user
    try:
        two_vms(directory)
        os.chmod(directory, 0o777)  # the directory stays writable: only the file is not
        os.chmod(directory / "slices.db", 0o444)
        code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from hvgpu.host.state import StateError, StateStore
if os.geteuid() == 0:  # root writes any file: be someone else
    os.setgid(65534); os.setuid(65534)
try:
    StateStore({str(directory)!r})
except StateError as exc:
    print(exc)
"""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        assert "slices.db is read-only" in out and "move it aside" not in out
        assert not (directory / "slices.db-wal").exists() or \
            (directory / "slices.db-wal").stat().st_size == 0
    finally:
        subprocess.run(["rm", "-rf", str(directory)])


@pytest.mark.parametrize("directory_mode, file_mode, named", [
    (0o777, 0o644, "slices.db is read-only for this process"),  # another user's file
    (0o555, 0o666, "is read-only for this process"),  # the directory: no -wal, -shm there
    (0o555, None, "is read-only for this process"),  # nothing there yet
])
def test_a_state_this_user_cannot_write_says_so_and_what_to_do(directory_mode, file_mode, named):
    directory = Path(tempfile.mkdtemp(prefix="hvgpu-ro-"))  # reachable by another user
    try:
        if file_mode is not None:
            two_vms(directory)
            os.chmod(directory / "slices.db", file_mode)
        os.chmod(directory, directory_mode)
        code = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from hvgpu.host.state import StateError, StateStore
if os.geteuid() == 0:  # root writes any file: be someone else
    os.setgid(65534); os.setuid(65534)
try:
    StateStore({str(directory)!r})
except StateError as exc:
    print(exc)
"""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        assert named in out, out
        assert "move it aside" not in out  # what a damaged file is told, not this one
        assert "Fix its permissions" in out and "run the agent as its owner" in out
        assert "belongs to uid 0" in out
    finally:
        subprocess.run(["rm", "-rf", str(directory)])


def test_a_lost_state_is_rebuilt_from_libvirt_metadata_saying_so(tmp_path, caplog):
    pytest.importorskip("libvirt")
    from hvgpu.host import hypervisor
    from tests.host.test_libvirt_slices import define, vsock_domain

    hypervisor.start_event_loop()
    first = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, connect="test:///default")
    first.defined = []
    try:
        dom = define(first, vsock_domain("lv-state"))
        first.api.attach("lv-state", "32M", "50%", allow_time_shared=True)
    finally:
        first.stop()
    for name in ("slices.db", "slices.json"):  # the whole state is gone
        (tmp_path / "state" / name).unlink()
    caplog.set_level(logging.INFO, logger="hvgpu")
    again = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, connect="test:///default")
    try:
        (s,) = again.api.list()
        assert (s["vm"], s["mem"], s["compute"]) == ("lv-state", 32 * M, 50)
        assert "lv-state: slice restored from the domain's metadata" in caplog.text
    finally:
        again.stop()
        dom.destroy()
        dom.undefine()
