"""``hvgpu-guest install``: what lets the ordinary users of this VM map its
shared-memory device.

The device's memory is PCI BAR 2, mapped from sysfs ``resource2``, which the kernel
makes root's alone. The package ships a udev rule (``data/70-hvgpu-shm.rules``)
giving group ``hvgpu`` read and write on that file whenever such a device appears
(at boot, or hot-plugged); installing it also creates the group
and gives it the devices already there, since udev applies a new rule only to
devices it sees afterwards.

Must not: touch anything but the rule file, the group and the ``resource2`` files
of ivshmem devices; change the running system when asked to install into another
root (an image being built, a test's directory).
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
from pathlib import Path

from hvgpu.errors import HvgpuError
from hvgpu.guest import region
from hvgpu.guest.region import GROUP, RULE, SharedDevice

RULE_SOURCE = Path(__file__).resolve().parent / "data" / Path(RULE).name


class InstallError(HvgpuError):
    code = "guest-install"


def rule_text() -> str:
    return RULE_SOURCE.read_text()


def write_rule(root: str | os.PathLike = "/") -> Path:
    """The udev rule, written under ``root``; returns where."""
    path = Path(root) / RULE.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")  # udev must never read half a rule
    tmp.write_text(rule_text())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def ensure_group(name: str = GROUP) -> tuple[int, bool]:
    """(gid, whether it was created now): a system group, by the system's own tool."""
    try:
        return grp.getgrnam(name).gr_gid, False
    except KeyError:
        pass
    for cmd in (["groupadd", "--system", name], ["addgroup", "-S", name]):  # busybox: addgroup
        if shutil.which(cmd[0]):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                said = (done.stderr or done.stdout).strip()
                raise InstallError(f"{' '.join(cmd)} failed: {said}")
            break
    else:
        raise InstallError(f"cannot create group {name!r}: neither groupadd nor addgroup is here")
    try:
        return grp.getgrnam(name).gr_gid, True
    except KeyError:
        raise InstallError(f"group {name!r} is still missing after creating it") from None


def grant(gid: int, sysfs: str | os.PathLike | None = None) -> list[SharedDevice]:
    """Gives group ``gid`` read and write on every shared-memory device there now, as
    the rule does for those that come later."""
    found = region.devices(sysfs)
    for dev in found:
        os.chown(dev.resource, -1, gid)
        os.chmod(dev.resource, 0o660)
    return found


def install(root: str | os.PathLike = "/") -> list[str]:
    """Installs the rule (and, on this system, the group and today's devices); returns
    what it did, one sentence each."""
    path = write_rule(root)
    said = [f"wrote {path}: udev gives group {GROUP} read and write on the VM's "
            "shared-memory device (resource2 of PCI 1af4:1110) whenever one appears"]
    if Path(root).resolve() != Path("/"):
        said.append(f"{root} is not this system's root: its group {GROUP!r} and this "
                    "system's devices are left as they are")
        return said
    gid, created = ensure_group()
    said.append(f"{'created' if created else 'kept the existing'} group {GROUP} (gid {gid})")
    devs = grant(gid)
    for dev in devs:
        said.append(f"gave group {GROUP} read and write on {dev.resource} (device "
                    f"{dev.address}, {dev.size >> 20} MiB)")
    if not devs:
        said.append("no shared-memory device in this VM now: the rule gives the next one "
                    "to the group when the host adds it")
    if shutil.which("udevadm"):
        subprocess.run(["udevadm", "control", "--reload"], capture_output=True)
        said.append("told udev to reload its rules")
    else:
        said.append("no udevadm here: udev reads the rule when it next starts")
    said.append(f"users who run CUDA programs need the group: usermod -aG {GROUP} USER "
                "(it applies from their next login)")
    return said
