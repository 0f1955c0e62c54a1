"""The VM's shared-memory device as the guest sees it: found in sysfs, mapped from
its PCI BAR.

An ``ivshmem-plain`` device (PCI 1af4:1110) needs no kernel driver: its memory is
BAR 2, which a process maps from ``/sys/bus/pci/devices/ADDR/resource2``. The
executor writes a header (hvgpu/virtio/region.py) at the start of the VM's region
and hands the guest its token in SHM_ATTACH's reply; :func:`find_device_region`
maps each ivshmem device in turn and keeps the one whose header carries that
token, so a VM with several such devices (another program's, a second vGPU's)
picks the right one.

The sysfs root is ``$HVGPU_SYSFS_ROOT`` or ``/sys`` (tests build a tree of regular
files in its place; the C shim's region.c reads the same). This is the guest's only
Python code that opens sysfs or PCI resources. It must not talk to the agent (the
caller has the token) and must not trust the header for more than picking the
device: the executor checks every offset a guest names.
"""

from __future__ import annotations

import ctypes
import dataclasses
import grp
import mmap
import os
from pathlib import Path

from hvgpu.errors import HvgpuError
from hvgpu.virtio import region as layout
from hvgpu.virtio import tuning as T

GROUP = "hvgpu"  # the group the packaged udev rule gives the device to
RULE = "/etc/udev/rules.d/70-hvgpu-shm.rules"  # where `hvgpu-guest install` puts it


class RegionError(HvgpuError):
    """A shared-memory device is there but cannot be mapped."""

    code = "shm-device"


def sysfs_root(sysfs: str | os.PathLike | None = None) -> Path:
    return Path(sysfs if sysfs is not None else os.environ.get(T.ENV_SYSFS_ROOT) or "/sys")


@dataclasses.dataclass(frozen=True)
class SharedDevice:
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


def devices(sysfs: str | os.PathLike | None = None) -> list[SharedDevice]:
    """Every ivshmem-plain device of this VM, by PCI address."""
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
        found.append(SharedDevice(d.name, resource, size))
    return found


class MappedRegion:
    """A device's memory mapped shared and read/write into this process.

    ``address`` is where the mapping starts in this process (for the C shim and
    ctypes views); it and any view of ``mmap`` are invalid after :meth:`close`.
    """

    def __init__(self, device: SharedDevice, mapping: mmap.mmap):
        self.device = device
        self.mmap = mapping
        self.size = len(mapping)
        anchor = ctypes.c_char.from_buffer(mapping)
        self.address = ctypes.addressof(anchor)
        del anchor  # holding it would keep the mapping exported, and close() would fail

    def header(self) -> tuple[int, bytes, int] | None:
        """(region size, token, vGPU device) from the region's header, or None."""
        return layout.unpack_header(self.mmap[:layout.HEADER.size])

    def close(self) -> None:
        self.mmap.close()

    def __enter__(self) -> "MappedRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MappedRegion {self.device.address} {self.size} bytes at {self.address:#x}>"


def _permission_advice(resource: Path) -> str:
    join = (f"as root, usermod -aG {GROUP} USER; it applies to the user's processes from "
            "its next login")
    try:
        given = grp.getgrgid(os.stat(resource).st_gid).gr_name == GROUP
    except (KeyError, OSError):
        given = False
    if given:
        return f"the file belongs to group {GROUP!r}, which this process is not in ({join})"
    return (f"as root, run `hvgpu-guest install`: it installs the udev rule {RULE}, which "
            f"gives group {GROUP!r} read and write on that file; the user must be in that "
            f"group ({join})")


def map_device(device: SharedDevice) -> MappedRegion:
    """Maps ``device``'s BAR; RegionError, saying what to do, where it cannot be."""
    try:
        fd = os.open(device.resource, os.O_RDWR | os.O_CLOEXEC)
    except PermissionError:
        raise RegionError(
            f"the VM's shared-memory device {device.address} is there, but this user "
            f"(uid {os.geteuid()}) may not open {device.resource} for reading and writing: "
            f"{_permission_advice(device.resource)}", code="shm-permission") from None
    except OSError as exc:
        raise RegionError(f"cannot open {device.resource} (shared-memory device "
                          f"{device.address}): {exc.strerror}") from None
    try:
        if device.size < layout.DATA_OFFSET:
            raise RegionError(f"{device.resource} is {device.size} bytes: too small for an "
                              f"hvgpu region (its header alone takes {layout.DATA_OFFSET})")
        try:
            mapping = mmap.mmap(fd, device.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise RegionError(f"cannot map {device.resource} (shared-memory device "
                              f"{device.address}): {exc.strerror}") from None
    finally:
        os.close(fd)  # the mapping stays
    return MappedRegion(device, mapping)


def find_device_region(token: bytes, device: int,
                       sysfs: str | os.PathLike | None = None) -> MappedRegion | None:
    """The ivshmem region whose header carries ``token`` for vGPU ``device``, mapped;
    None where no device carries it. Every other device mapped on the way is unmapped.

    A device that cannot be mapped is passed over while another may still carry the
    token; when none does, the first such failure is raised (RegionError), since the
    region may well be the one this user may not open.
    """
    token = bytes(token)
    if len(token) != layout.TOKEN_SIZE:
        raise ValueError(f"a region token is {layout.TOKEN_SIZE} bytes, not {len(token)}")
    failures: list[RegionError] = []
    for candidate in devices(sysfs):
        try:
            mapped = map_device(candidate)
        except RegionError as exc:
            failures.append(exc)
            continue
        header = mapped.header()
        if header is not None and header[1] == token and header[2] == device:
            return mapped
        mapped.close()
    if failures:
        raise failures[0]
    return None
