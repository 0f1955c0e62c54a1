"""A VM's region device region served end to end, without a VM: the agent
opens the slice's region file for its executor, the executor writes the header,
and the guest API finds the "device" by its token in a sysfs whose BAR 2 is that
same file (as QEMU's ivshmem-plain makes it in a real guest: tests/vm covers that).
The VM's programs share the region but not their rooms."""

from __future__ import annotations

import os

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device
from hvgpu.host.names import VgpuKey, region_name
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.guest.fake_sysfs import add_device

MiB = 1 << 20


@pytest.fixture
def vm_with_region(tmp_path, monkeypatch):
    region_dir = tmp_path / "region"
    region_dir.mkdir()
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    running.agent.config.region_dir = str(region_dir)
    running.api.attach("vm1", "256M", region="32M")
    region = region_dir / region_name(VgpuKey("vm1", 0))
    with open(region, "wb") as f:  # as QEMU makes it for the device
        f.truncate(32 * MiB)
    sysfs = tmp_path / "sysfs"
    add_device(sysfs, "0000:00:05.0", size=MiB)  # another device, not this VM's region
    bar = add_device(sysfs, "0000:00:06.0", size=32 * MiB)
    os.unlink(bar.resolve())
    os.link(region, bar.resolve())  # the guest's BAR 2 is the host's file
    monkeypatch.setenv("HVGPU_SYSFS_ROOT", str(sysfs))
    yield running, region
    running.stop()


def test_the_guest_maps_its_vms_region_and_copies_by_offset(vm_with_region):
    running, region = vm_with_region
    conn = Connection(running.vm_address("vm1"))
    assert conn.caps & P.CAP_REGION_DEVICE
    dev = Device(connection=conn)
    pinned = dev.pinned(3 * MiB)
    assert conn.lane()[0] == "device"  # the device region, not a memfd
    pinned.view[:] = bytes(range(256)) * (3 * MiB // 256)
    buf = dev.allocate(3 * MiB)
    buf.copy_from(pinned.view)
    staged = os.urandom(5 * MiB)  # pageable: staged through the same region
    big = dev.allocate(5 * MiB)
    big.copy_from(staged)
    assert bytes(big.copy_to()) == staged
    back = dev.pinned(3 * MiB)
    buf.copy_to(back.view)
    assert bytes(back.view) == bytes(pinned.view)
    with open(region, "rb") as f:  # the executor's header, as the guest found it
        size, token, device = R.unpack_header(f.read(R.HEADER.size))
    assert (size, device) == (32 * MiB, 0)
    conn.close()


def test_two_programs_of_the_vm_get_separate_rooms(vm_with_region):
    running, _ = vm_with_region
    a, b = (Connection(running.vm_address("vm1")) for _ in range(2))
    pa, pb = Device(connection=a).pinned(MiB), Device(connection=b).pinned(MiB)
    assert pa.offset != pb.offset
    # a's copy naming b's room is refused by the executor
    buf = Device(connection=a).allocate(MiB)
    assert pa.region == pb.region  # the VM's one region
    a.post("MEMCPY_DTOH_REGION", pa.region, 0, pb.offset, buf.ptr, MiB, 0)
    with pytest.raises(CudaError) as info:
        a.call("CTX_SYNCHRONIZE")
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE
    a.close()
    b.close()


def test_without_the_file_the_guest_falls_back_and_is_told_why(vm_with_region):
    running, region = vm_with_region
    os.unlink(region)
    conn = Connection(running.vm_address("vm1"))
    dev = Device(connection=conn)
    buf = dev.allocate(4 * MiB)
    data = os.urandom(4 * MiB)
    buf.copy_from(data)  # on a unix socket: a memfd instead
    assert bytes(buf.copy_to()) == data
    assert conn.lane()[:2] == ("memfd", True)
    conn.close()
