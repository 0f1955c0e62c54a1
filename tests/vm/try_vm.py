"""Try hvgpu in a real Linux guest on a machine without KVM, by hand: the same guest and
host side as the VM tests (tests/vm/vm.py), with a shell on the guest's console.

    .venv/bin/python -m tests.vm.try_vm [--mem-slice 1G] [--cache DIR] [--work DIR]

It builds (or reuses) the guest image, builds hvgpu's wheel from this checkout, starts
vhost-device-vsock and an agent with the GPU test double listening for the guest as
VM ``vm1``, attaches a slice with ``hvgpu attach``, and boots the guest under QEMU
(TCG). In the guest, hvgpu is installed from the wheel (and click's, beside it) into
/opt/hvgpu (a venv) and on PATH; try ``hvgpu-guest info``, ``hvgpu-guest smi``,
``python3``'s ``from hvgpu.guest import Device``, or ``hvgpu-guest run --
/opt/programs/saxpy_static``.
``exit`` (or Ctrl-a x) powers the guest off and stops everything. The GPU test double
computes on the host CPU: what works and what is refused is real, speed is not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.vm import vm

GUEST_SHELL = """#!/bin/sh
echo "[try] installing hvgpu from its wheel into /opt/hvgpu (about 20 s under TCG)"
python3 -m venv --without-pip /opt/hvgpu &&
/opt/hvgpu/bin/python /opt/wheels/pip.whl/pip install -q --no-index --find-links /opt/wheels \\
    --no-cache-dir --disable-pip-version-check --root-user-action=ignore /opt/wheels/hvgpu-*.whl
export PATH=/opt/hvgpu/bin:$PATH
echo "[try] ready: hvgpu-guest info | hvgpu-guest smi | hvgpu-guest run -- /opt/programs/saxpy_static"
echo "[try] exit powers the guest off"
setsid cttyhack sh
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mem-slice", default="1G", help="the slice's memory quota (hvgpu attach --mem)")
    ap.add_argument("--cache", help="guest image cache (default: $HVGPU_VM_CACHE or "
                                    "~/.cache/hvgpu-vm)")
    ap.add_argument("--work", help="where the run's files and logs go (default: a new "
                                   "temporary directory, kept)")
    args = ap.parse_args()
    try:
        print("[try] guest image ...", flush=True)
        cache = vm.image(args.cache or os.environ.get("HVGPU_VM_CACHE"))
    except vm.Unavailable as exc:
        print(f"[try] cannot boot a guest here: {exc}", file=sys.stderr)
        return 3
    work = Path(args.work or tempfile.mkdtemp(prefix="hvgpu-try-vm-")).resolve()
    overlay = work / "overlay"
    shutil.rmtree(overlay, ignore_errors=True)
    for d in ("opt/wheels", "opt/programs"):
        (overlay / d).mkdir(parents=True)
    print("[try] building hvgpu's wheel and the example programs ...", flush=True)
    shutil.copy(vm.wheel(work / "dist"), overlay / "opt/wheels")
    shutil.copy(vm.pip_wheel(work / "dist"), overlay / "opt/wheels/pip.whl")
    for dependency in vm.dependency_wheels(work / "deps"):
        shutil.copy(dependency, overlay / "opt/wheels")
    for name, exe in vm.programs(work / "programs").items():
        shutil.copy(exe, overlay / "opt/programs" / name)
    (overlay / "guest-test.sh").write_text(GUEST_SHELL)
    os.chmod(overlay / "guest-test.sh", 0o755)
    initrd = vm.initrd(cache, overlay, work / "initrd.cpio")
    with vm.Host(cache, work) as host:
        done = host.hvgpu("attach", vm.VM, "--mem", args.mem_slice)
        print(f"[try] {done.stdout.strip() or done.stderr.strip()}", flush=True)
        print(f"[try] booting; logs in {work}", flush=True)
        subprocess.run(vm.qemu_command(cache, initrd, host))
    print(f"[try] the guest is off; the agent's log: {work}/agent-1.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
