"""The guest side of hvgpu inside a real Linux guest (QEMU under TCG), over real AF_VSOCK
to the agent on the host, which runs the GPU test double: installed from the wheel as a
user installs it, refused while the VM has no slice, then the CLI, the Python API, an
unmodified nvcc-built program, and an agent restart under a running program; and the
VM's region device (QEMU's ivshmem-plain) found by its region's token and
mapped from its PCI BAR, by root and by a user of group hvgpu.

Run alone: ``pytest -m vm tests/vm``. What the guest printed is read back from its
serial console (tests/vm/vm.py); nothing is assumed."""

from __future__ import annotations

import re

import pytest

from hvgpu.virtio import region as layout
from tests.vm import guest_region

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]


def test_the_wheel_installs_in_the_guest_as_a_user_installs_it(guest_run):
    rc, out = guest_run.step("install")
    assert rc == 0, out
    assert re.search(r"Successfully installed .*click-", out), out  # from /opt/wheels: no index


def test_a_vm_without_a_slice_is_refused_clearly(guest_run):
    rc, out = guest_run.step("noslice")
    assert rc != 0
    assert "no GPU slice is attached to VM 'vm1'" in out, out
    assert "on the host: hvgpu attach vm1 --mem SIZE" in out, out  # what to do about it
    assert "Traceback" not in out, out


def test_attach_by_name_serves_the_running_guest(guest_run):
    assert [a[:2] for a in guest_run.actions][:1] == [("attach", 0)], guest_run.actions
    rc, out = guest_run.step("info")
    assert rc == 0, out
    assert "hvgpu fake GPU" in out and "vsock://2:5170" in out, out
    rc, out = guest_run.step("smi")
    assert rc == 0, out
    assert "256" in out, out  # the slice's 256 MiB quota is what the guest sees


def test_the_python_api_computes_and_reports_a_deferred_error(guest_run):
    rc, out = guest_run.step("api")
    assert rc == 0, out
    for check in ("copies there and back: ok", "saxpy: ok", "memory in use is charged: ok",
                  "deferred error at the next sync: ok"):
        assert check in out, out


def test_an_unmodified_cuda_program_runs_through_the_shim(guest_run):
    rc, out = guest_run.step("cuda")
    if rc == 127 or "not found" in out and "saxpy_static" in out:
        pytest.skip("nvcc was not there to build the program")
    assert rc == 0, out
    assert "copy back: no error" in out, out
    got, want = out.split("sum ")[1].split(" (expect ")
    assert got == want.split(")")[0], out


def test_an_agent_restart_fails_the_running_program_and_the_next_one_works(guest_run):
    assert ("restart", 0, "") in guest_run.actions
    rc, out = guest_run.step("restarted")
    assert rc == 0 and "restarted" in out, out
    rc, out = guest_run.step("loss")
    assert "first: 0" in out, out
    assert "second: 46 CUDA_ERROR_DEVICE_UNAVAILABLE" in out, out
    assert "exit 0" in out, out  # an error, not a signal
    rc, out = guest_run.step("after")
    assert rc == 0 and "copy back: no error" in out, out


def test_the_guest_maps_the_region_device_by_its_token_and_the_host_sees_its_writes(
        guest_run):
    rc, out = guest_run.step("region")
    assert rc == 0, out
    region = guest_run.region
    assert (f"header size {region['size']}, vGPU 0, token matches, mapped {region['size']} bytes"
            in out), out
    assert "read back the same" in out, out
    # Read back from the host's /dev/shm file after the guest was off, not assumed:
    assert region["pattern"] == guest_region.pattern(region["token"])
    assert region["tail"] == guest_region.TAIL_MARK  # the whole BAR is the file
    rc, out = guest_run.step("info")
    assert re.search(rf"region: device [0-9a-f:.]+, {region['size'] >> 20} MiB, readable "
                     r"and writable by this user", out), out


def test_the_shims_own_lookup_maps_the_same_device(guest_run):
    rc, out = guest_run.step("region_shim")
    assert rc == 0, out
    assert (f"hvgpu_region_find: 0\nmapped {guest_run.region['size']} bytes; header carries "
            "the token") in out, out
    assert guest_run.region["shim"] == guest_region.SHIM_MARK


def test_an_ordinary_user_maps_the_device_once_hvgpu_guest_install_has_run(guest_run):
    rc, out = guest_run.step("region_denied")
    assert rc == 1, out
    assert "RegionError region-permission" in out and "resource2" in out, out
    assert "hvgpu-guest install" in out and "Traceback" not in out, out
    rc, out = guest_run.step("region_install")
    assert rc == 0, out
    assert "kept the existing group hvgpu (gid 990)" in out, out
    assert re.search(r"gave group hvgpu read and write on /sys/bus/pci/devices/[0-9a-f:.]+/"
                     r"resource2", out), out
    rc, out = guest_run.step("region_user")
    assert rc == 0, out
    assert "as uid 1000, groups [990, 1000]" in out and "token matches" in out, out
    assert guest_run.region["user"] == guest_region.USER_MARK


def test_a_program_copies_through_its_vms_region_served_by_the_executor(guest_run):
    """Attached with --region, the executor writes the header with its own token when the
    program asks for the region; the program finds the device by it and its pinned and
    staged copies name offsets (no bytes on the vsock)."""
    rc, out = guest_run.step("region_api")
    assert rc == 0, out
    assert "region: device" in out, out
    assert "pinned round trip: same bytes" in out and "staged round trip: same bytes" in out, out
    token = re.search(r"token ([0-9a-f]{32})", out).group(1)
    # read back from the host's file after the guest was off: the executor's header
    header = layout.unpack_header(guest_run.region["header"])
    assert header == (guest_run.region["size"], bytes.fromhex(token), 0)
    assert "copies by op: MEMCPY_DTOH_REGION" in out and "MEMCPY_HTOD_REGION" in out, out
