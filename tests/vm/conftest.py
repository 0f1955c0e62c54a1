"""One real guest boot for the VM tests (tests/vm/vm.py): built, booted and read back once
per session; each test then asserts on the steps the guest reported.

Skipped, in one line, only where the guest cannot be had here (vm.Unavailable: no
vhost-device-vsock from Debian unstable, no guest kernel)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.vm import vm


class GuestRun:
    """What one boot reported: its console lines, its steps, the host's actions."""

    def __init__(self, lines, steps, work, actions):
        self.lines, self.steps, self.work, self.actions = lines, steps, work, actions

    def step(self, name: str) -> tuple[int, str]:
        if name not in self.steps:
            tail = "\n".join(self.lines[-40:])
            pytest.fail(f"the guest never reported step {name!r}; its console ended:\n{tail}")
        rc, out = self.steps[name]
        return rc, "\n".join(out)


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
    for name, exe in vm.programs(work / "programs").items():
        shutil.copy(exe, overlay / "opt/programs" / name)
    shutil.copy(vm.HERE / "guest_api.py", overlay / "opt/tests")
    shutil.copy(vm.HERE / "guest_test.sh", overlay / "guest-test.sh")
    os.chmod(overlay / "guest-test.sh", 0o755)
    initrd = vm.initrd(cache, overlay, work / "initrd.cpio")
    actions = []
    with vm.Host(cache, work) as host:
        def on_line(line: str) -> None:
            if line == "VMWANT attach":
                done = host.hvgpu("attach", vm.VM, "--mem", "256M")
                actions.append(("attach", done.returncode, done.stdout + done.stderr))
            elif line == "VMWANT restart":
                host.stop_agent()
                host.start_agent()
                host.tell_guest(1235, "restarted")
                actions.append(("restart", 0, ""))
        lines = vm.boot(cache, initrd, host, work / "console.log", on_line)
    return GuestRun(lines, vm.results(lines), work, actions)
