"""The agent opens a VM's region file for its executor: only the file the
slice names, in the region directory, a regular file of the slice's size, never
through a link; anything else is refused with a reason and nothing stays open."""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.host.names import VgpuKey
from hvgpu.host.names import region_name
from hvgpu.host.regions import open_region
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from tests.conftest import FAKE_DEVICE, RunningAgent

MiB = 1 << 20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_slices_file_is_opened_read_write(tmp_path):
    (tmp_path / "hvgpu-vm1").write_bytes(b"\0" * MiB)
    fd, size = open_region(str(tmp_path), VgpuKey("vm1", 0), SimpleNamespace(region=MiB))
    try:
        assert size == MiB
        os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)


def test_the_file_of_vgpu_n_is_its_own(tmp_path):
    (tmp_path / region_name(VgpuKey("vm1", 2))).write_bytes(b"\0" * MiB)
    with pytest.raises(CudaError):  # device 0 has no file here
        open_region(str(tmp_path), VgpuKey("vm1", 0), SimpleNamespace(region=MiB))
    fd, _ = open_region(str(tmp_path), VgpuKey("vm1", 2), SimpleNamespace(region=MiB))
    os.close(fd)


@pytest.mark.parametrize("case", ["no-region", "missing", "symlink", "fifo", "wrong-size", "dir",
                                  "other-owner"])
def test_anything_else_is_refused_and_leaves_nothing_open(tmp_path, case):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * MiB)
    path = tmp_path / "hvgpu-vm1"
    region = MiB
    if case == "no-region":
        region = 0
    elif case == "symlink":
        path.symlink_to(target)  # e.g. to a host file the guest should never reach
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "wrong-size":
        path.write_bytes(b"\0" * (2 * MiB))
    elif case == "dir":
        path.mkdir()
    elif case == "other-owner":  # made first by another local user, to share the VM's memory
        path.write_bytes(b"\0" * MiB)
        os.chown(path, 65534, 65534)
    before = _fds()
    with pytest.raises(CudaError) as info:
        open_region(str(tmp_path), VgpuKey("vm1", 0), SimpleNamespace(region=region))
    assert info.value.status == P.CUDA_ERROR_NOT_SUPPORTED
    assert _fds() == before


def test_a_guest_asking_again_and_again_for_a_missing_region_is_logged_once(tmp_path, caplog):
    """Every REGION_ATTACH of the device region may reach the agent: a guest must not be
    able to write the host's log at the pace of its round trips."""
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        running.agent.config.region_dir = str(tmp_path)  # no file there
        running.api.attach("vm1", "64M", region="4M")
        with caplog.at_level(logging.DEBUG, logger="hvgpu.host.agent"), \
                Connection(running.vm_address("vm1")) as conn:
            for _ in range(20):
                with pytest.raises(CudaError) as info:
                    conn.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
                assert info.value.status == P.CUDA_ERROR_NOT_SUPPORTED
        said = [r for r in caplog.records if "no region" in r.getMessage()]
        assert len(said) == 20
        assert [r.levelno for r in said].count(logging.WARNING) == 1
    finally:
        running.stop()


def test_two_executors_of_one_vgpu_never_hand_out_rooms_of_its_region_at_once(tmp_path):
    """A resize under MPS (or a kernel fault) starts a newer executor for the vGPU's
    next programs while the older one serves its own: each keeps its own book of the
    region's rooms, so only one of them may have the region, or two programs of the
    VM would be given the same bytes for their DMA."""
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        running.agent.config.region_dir = str(tmp_path)
        running.api.attach("vm1", "64M", region="4M")
        with open(tmp_path / region_name(VgpuKey("vm1", 0)), "wb") as f:  # as QEMU makes it
            f.truncate(4 * MiB)
        with Connection(running.vm_address("vm1")) as old:
            region = old.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[0]
            (room,) = old.call("REGION_ALLOC", region, 0, 8192)
            record = running.agent.registry.get(VgpuKey("vm1", 0))
            running.agent.call("retire", lambda: running.agent.supervisor.retire(
                record, record.current))  # as a resize under MPS does
            with Connection(running.vm_address("vm1")) as new:  # on a newer executor
                try:
                    region_new = new.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[0]
                except CudaError as exc:
                    assert exc.status == P.CUDA_ERROR_NOT_SUPPORTED and "older" in str(exc)
                else:
                    assert new.call("REGION_ALLOC", region_new, 0, 8192)[0] != room
        deadline = time.monotonic() + 30
        while True:  # once the older executor has ended, the newer one may have it
            with Connection(running.vm_address("vm1")) as later:
                try:
                    later.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
                    break
                except CudaError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.1)
    finally:
        running.stop()


def test_libvirts_qemu_user_may_own_it(tmp_path):
    path = tmp_path / "hvgpu-vm1"
    path.write_bytes(b"\0" * MiB)
    os.chown(path, 64055, 107)
    fd, _ = open_region(str(tmp_path), VgpuKey("vm1", 0), SimpleNamespace(region=MiB),
                        frozenset({64055}))
    os.close(fd)
