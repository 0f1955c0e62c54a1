"""One real guest boot for the VM tests (tests/vm/vm.py): built, booted and read back once
per session; each test then asserts on the steps the guest reported.

Skipped, in one line, only where the guest cannot be had here (vm.Unavailable: no
vhost-device-vsock from Debian unstable, no guest kernel)."""

from __future__ import annotations

import os
import shutil

import pytest

from hvgpu.virtio import region as region_layout
from tests.vm import guest_region, vm


class GuestRun:
    """What one boot reported: its console lines, its steps, the host's actions, and
    the region as the host read it back after the guest was off."""

    def __init__(self, lines, steps, work, actions, region=None):
        self.lines, self.steps, self.work, self.actions = lines, steps, work, actions
        self.region = region

    def step(self, name: str) -> tuple[int, str]:
        if name not in self.steps:
            tail = "\n".join(self.lines[-40:])
            pytest.fail(f"the guest never reported step {name!r}; its console ended:\n{tail}")
        rc, out = self.steps[name]
        return rc, "\n".join(out)


def region_token(region: vm.RegionFile) -> bytes:
    """The token of the header the host writes before boot, for the steps that map the
    device before any slice is attached (tests/vm/guest_region.py). Once the guest's
    program attaches the region, the executor writes its own header and token
    (tests/vm/guest_region_api.py)."""
    token = os.urandom(region_layout.TOKEN_SIZE)
    region.write(0, region_layout.pack_header(region.size, token, 0))
    return token


def read_back(region: vm.RegionFile, token: bytes) -> dict:
    """What the guest left in the region (tests/vm/guest_region.py says where)."""
    tail = len(guest_region.TAIL_MARK)
    return {"token": token, "size": region.size,
            "header": region.read(0, region_layout.HEADER.size),
            "pattern": region.read(guest_region.PATTERN_OFFSET, guest_region.PATTERN_SIZE),
            "user": region.read(guest_region.USER_OFFSET, len(guest_region.USER_MARK)),
            "shim": region.read(guest_region.SHIM_OFFSET, len(guest_region.SHIM_MARK)),
            "tail": region.read(region.size - tail, tail)}


@pytest.fixture(scope="session")
def guest_run(tmp_path_factory) -> GuestRun:
    try:
        cache = vm.image(os.environ.get("HVGPU_VM_CACHE"))
    except vm.Unavailable as exc:
        pytest.skip(f"no real guest here: {exc}")
    work = tmp_path_factory.mktemp("vm")
    overlay = work / "overlay"
    for d in ("opt/wheels", "opt/programs", "opt/tests"):
        (overlay / d).mkdir(parents=True)
    shutil.copy(vm.wheel(work / "dist"), overlay / "opt/wheels")
    shutil.copy(vm.pip_wheel(work / "dist"), overlay / "opt/wheels/pip.whl")
    for dependency in vm.dependency_wheels(work / "deps"):
        shutil.copy(dependency, overlay / "opt/wheels")
    for name, exe in vm.programs(work / "programs").items():
        shutil.copy(exe, overlay / "opt/programs" / name)
    shutil.copy(vm.HERE / "guest_api.py", overlay / "opt/tests")
    shutil.copy(vm.HERE / "guest_region.py", overlay / "opt/tests")
    shutil.copy(vm.HERE / "guest_region_api.py", overlay / "opt/tests")
    shutil.copy(vm.HERE / "guest_test.sh", overlay / "guest-test.sh")
    os.chmod(overlay / "guest-test.sh", 0o755)
    actions = []
    with vm.RegionFile() as region:
        token = region_token(region)
        (overlay / "opt/tests/region-token").write_text(token.hex())
        initrd = vm.initrd(cache, overlay, work / "initrd.cpio")
        with vm.Host(cache, work, region_dir=region.dir) as host:
            def on_line(line: str) -> None:
                if line == "VMWANT attach":
                    done = host.hvgpu("attach", vm.VM, "--mem", "256M", "--region",
                                      f"{region.size >> 20}M")
                    actions.append(("attach", done.returncode, done.stdout + done.stderr))
                elif line == "VMWANT restart":
                    host.stop_agent()
                    host.start_agent()
                    host.tell_guest(1235, "restarted")
                    actions.append(("restart", 0, ""))
            lines = vm.boot(cache, initrd, host, work / "console.log", on_line, region=region)
        region = read_back(region, token)
    return GuestRun(lines, vm.results(lines), work, actions, region)
