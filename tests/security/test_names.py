"""VM names cannot stand for another VM or another VM's vGPU.

A VM once could be named 'vm1#1', the very string that keyed vm1's vGPU 1:
its slice then overwrote vm1's, vm1's port + 1 reached the other tenant's
executor, and `detach 'vm1#1'` failed with "list index out of range". Names
are now checked by libvirt's rules plus no '#', at every entry point, and a
vGPU is keyed by a (VM, device) pair.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.errors import HvgpuError
from hvgpu.guest import Connection
from hvgpu.host.agent import split_binding
from hvgpu.host.names import BadVmName, VgpuKey, check_vm_name
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateStore
from tests.conftest import FAKE_DEVICE, RunningAgent, fake_gpus

BAD = {"vm1#1": "'#'", "a/b": "'/'", "": "empty", "x" * 256: "256 bytes",
       "a\nb": "U+000A", "tab\there": "U+0009", "del\x7f": "U+007F", "nul\x00": "U+0000"}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_names_are_refused_saying_what_is_wrong(name):
    with pytest.raises(BadVmName) as info:
        check_vm_name(name)
    assert info.value.code == "bad-vm-name"
    assert BAD[name] in str(info.value)


@pytest.mark.parametrize("name", ["vm1", "web-01.example", "Ünïcode_vm", "x" * 255, "a b"])
def test_ordinary_names_pass(name):
    assert check_vm_name(name) == name


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm1#1", "vm2"))
    yield running
    running.stop()


def test_a_vm_named_like_another_vms_vgpu_is_refused_at_every_command(agent):
    api = agent.api
    api.attach("vm1", "16M", gpu=0)
    for call in (lambda: api.attach("vm1#1", "8M", cid=9),
                 lambda: api.attach("vm1#1", "8M", cid=9, add=True),
                 lambda: api.detach("vm1#1"),
                 lambda: api.resize("vm1#1", mem="8M"),
                 lambda: api.attach("a/b", "8M", cid=10)):
        with pytest.raises(HvgpuError) as info:
            call()
        assert info.value.code == "bad-vm-name" and "refused: it contains" in str(info.value)
    assert [(s["vm"], s["device"], s["mem"]) for s in api.list()] == [("vm1", 0, 16 << 20)]


def test_detach_of_such_a_name_on_the_command_line_is_a_clear_error(agent):
    out = CliRunner().invoke(cli, ["--control", agent.control, "detach", "vm1#1"])
    assert out.exit_code == 2  # refused by the same rule before the agent is asked
    assert "VM name 'vm1#1' is refused: it contains '#'" in out.output
    assert "index" not in out.output


def test_vm1s_vgpu_1_is_served_by_vm1s_own_executor_only(agent):
    api = agent.api
    api.attach("vm1", "16M", gpu=0, count=2)
    api.attach("vm2", "8M", gpu=0)
    with Connection(agent.vm_address("vm1#1")) as conn:  # the binding =vm1#1: vGPU 1 of vm1
        name, limit, _, _ = conn.call("SLICE_INFO")
        assert limit == 16 << 20
        status = {(s["vm"], s["device"]): s for s in api.status()}
        (ex,) = status[("vm1", 1)]["executors"]
        assert status[("vm1", 1)]["connections"] == 1
        assert not status[("vm2", 0)]["executors"] and not status[("vm1", 0)]["executors"]
        # the executor is told the VM and the device apart, never a joined string
        argv = Path(f"/proc/{ex['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--vm") + 1] == b"vm1"
        assert argv[argv.index(b"--vgpu") + 1] == b"1"
        assert b"--slice" not in argv


def test_bindings_parse_the_vgpu_number_once_and_check_the_name():
    assert split_binding("unix:///run/a.sock=vm1#1") == ("unix:///run/a.sock", VgpuKey("vm1", 1))
    assert split_binding("unix:///run/a.sock=vm1") == ("unix:///run/a.sock", VgpuKey("vm1", 0))
    assert split_binding("unix:///run/a.sock") == ("unix:///run/a.sock", None)
    for bad in ("vm1#x", "vm1#1#1", "vm1#8", "#1", "vm1#"):
        with pytest.raises(HvgpuError):
            split_binding(f"unix:///run/a.sock={bad}")


def test_an_agent_bound_to_a_bad_name_refuses_to_start(tmp_path):
    with pytest.raises(HvgpuError, match="vGPU number"):
        RunningAgent(tmp_path, FAKE_DEVICE, slices=True, extra_listen=[
            f"unix://{tmp_path}/x.sock=vm1#one"])
    assert not (tmp_path / "x.sock").exists()


def test_a_stored_row_with_such_a_name_is_left_out(tmp_path):
    manager = SliceManager(StateStore(tmp_path), fake_gpus)
    manager.attach("vm1", 16 << 20, cid=5)
    manager.store.close()
    db = sqlite3.connect(tmp_path / "slices.db", isolation_level=None)
    db.execute("UPDATE vgpus SET vm = 'vm1#1'")  # as an older release could have stored
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    store = StateStore(tmp_path)
    assert SliceManager(store, fake_gpus).list() == []
    assert any("vm1#1" in p and "'#'" in p for p in store.problems)
    assert sqlite3.connect(tmp_path / "slices.db").execute(
        "SELECT vm FROM vgpus").fetchall() == [("vm1#1",)]  # reported and kept, not deleted


HOSTILE = ["..", ".", "../../etc/passwd", "a/../../b", "/etc/shadow", "x\x00y", "vm\n1",
           "-rf", "*", " ", "a\\b", "x" * 255, "é" * 124, "vm1#1"]


@pytest.mark.parametrize("vm", HOSTILE)
@pytest.mark.parametrize("device", [0, 1, 7])
def test_a_region_file_is_always_one_name_directly_in_dev_shm(vm, device):
    from hvgpu.host.names import region_name, region_path

    try:
        path = region_path(VgpuKey(vm, device))
    except BadVmName:
        return  # refused: nothing to escape with
    name = region_name(VgpuKey(vm, device))
    assert path == "/dev/shm/" + name and "/" not in name and "\0" not in name
    assert name.startswith("hvgpu-") and len(name.encode()) <= 255
    assert Path(path).parent == Path("/dev/shm") and Path(path).resolve(strict=False).parent \
        == Path("/dev/shm").resolve()  # '..' stays a part of one name: no way out


def test_no_two_vgpus_of_any_vms_share_a_region_file():
    from hvgpu.host.names import region_name

    keys = [VgpuKey(vm, d) for vm in ("a", "a-1", "a-1-1", "a1", "hvgpu-a", "hvgpu-hvgpu-a")
            for d in range(8)]
    names = [region_name(k) for k in keys]
    assert len(set(names)) == len(names)
    assert region_name(VgpuKey("a-1")) != region_name(VgpuKey("a", 1))  # '-N' would make these meet


def test_a_name_too_long_for_a_file_is_refused_saying_how_long_it_may_be():
    from hvgpu.host.names import region_name

    assert region_name(VgpuKey("x" * 249)) == "hvgpu-" + "x" * 249  # 255 bytes: a file name
    with pytest.raises(BadVmName, match="at most 249 bytes"):
        region_name(VgpuKey("x" * 250))
    with pytest.raises(BadVmName, match="at most 247 bytes"):
        region_name(VgpuKey("x" * 248, 1))
