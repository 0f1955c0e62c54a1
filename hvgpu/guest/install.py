"""``hvgpu-guest install``: what lets the ordinary users of this VM map its
region device.

The device's memory is PCI BAR 2, mapped from sysfs ``resource2``, which the kernel
makes root's alone. The package ships a udev rule (``data/70-hvgpu-region.rules``)
giving group ``hvgpu`` read and write on that file whenever such a device appears
(at boot, or hot-plugged); installing it also creates the group
and gives it the devices already there, since udev applies a new rule only to
devices it sees afterwards.

It also lists the VM's ivshmem devices (``devices``, which ``hvgpu-guest info``
shows); finding and mapping the one an agent hands a token for is the C client's
(``hvgpu/guest/shim/region.c``), which the Python API uses.

Must not: touch anything but the rule file, the group and the ``resource2`` files
of ivshmem devices; map a device; change the running system when asked to install
into another root (an image being built, a test's directory).
"""

from __future__ import annotations

import dataclasses
import grp
import os
import shutil
import subprocess
from pathlib import Path

from hvgpu.errors import HvgpuError
from hvgpu.virtio import region as layout
from hvgpu.virtio import tuning as T

GROUP = "hvgpu"  # the group the packaged udev rule gives the device to
RULE = "/etc/udev/rules.d/70-hvgpu-region.rules"  # where `hvgpu-guest install` puts it
RULE_SOURCE = Path(__file__).resolve().parent / "data" / Path(RULE).name
# The same rule under the name earlier versions installed it by: replaced by RULE.
EARLIER_RULE = "/etc/udev/rules.d/70-hvgpu-shm.rules"


class InstallError(HvgpuError):
    code = "guest-install"


def sysfs_root(sysfs: str | os.PathLike | None = None) -> Path:
    """$HVGPU_SYSFS_ROOT or /sys (tests build a tree of regular files in its place; the
    C client's region.c reads the same)."""
    return Path(sysfs if sysfs is not None else os.environ.get(T.ENV_SYSFS_ROOT) or "/sys")


@dataclasses.dataclass(frozen=True)
class RegionDevice:
    """One ivshmem-plain device: its PCI address and the file that maps its memory."""

    address: str  # e.g. 0000:00:03.0
    resource: Path
    size: int

    def accessible(self) -> bool:
        """Whether this process may map it read/write."""
        return os.access(self.resource, os.R_OK | os.W_OK)


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def devices(sysfs: str | os.PathLike | None = None) -> list[RegionDevice]:
    """Every ivshmem-plain device of this VM (PCI 1af4:1110 with its memory BAR), by
    PCI address."""
    base = sysfs_root(sysfs) / "bus" / "pci" / "devices"
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []  # no PCI bus (or no sysfs): no device
    found = []
    for d in entries:
        if _hex(d / "vendor") != layout.PCI_VENDOR or _hex(d / "device") != layout.PCI_DEVICE:
            continue
        resource = d / f"resource{layout.PCI_BAR}"
        try:
            size = resource.stat().st_size
        except OSError:
            continue  # an ivshmem device without its memory BAR (not "plain")
        found.append(RegionDevice(d.name, resource, size))
    return found


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


def remove_earlier_rule(root: str | os.PathLike = "/") -> Path | None:
    """Removes the rule an earlier version installed as EARLIER_RULE (RULE replaces it);
    returns it, or None when there was none."""
    path = Path(root) / EARLIER_RULE.lstrip("/")
    try:
        path.unlink()
    except FileNotFoundError:
        return None
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


def grant(gid: int, sysfs: str | os.PathLike | None = None) -> list[RegionDevice]:
    """Gives group ``gid`` read and write on every region device there now, as
    the rule does for those that come later."""
    found = devices(sysfs)
    for dev in found:
        os.chown(dev.resource, -1, gid)
        os.chmod(dev.resource, 0o660)
    return found


def install(root: str | os.PathLike = "/") -> list[str]:
    """Installs the rule (and, on this system, the group and today's devices); returns
    what it did, one sentence each."""
    path = write_rule(root)
    said = [f"wrote {path}: udev gives group {GROUP} read and write on the VM's "
            "region device (resource2 of PCI 1af4:1110) whenever one appears"]
    earlier = remove_earlier_rule(root)
    if earlier is not None:
        said.append(f"removed {earlier}, the same rule under its earlier name")
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
        said.append("no region device in this VM now: the rule gives the next one "
                    "to the group when the host adds it")
    if shutil.which("udevadm"):
        subprocess.run(["udevadm", "control", "--reload"], capture_output=True)
        said.append("told udev to reload its rules")
    else:
        said.append("no udevadm here: udev reads the rule when it next starts")
    said.append(f"users who run CUDA programs need the group: usermod -aG {GROUP} USER "
                "(it applies from their next login)")
    return said
