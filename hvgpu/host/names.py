"""VM names and vGPU keys: what a VM may be called, how one vGPU is named, and the
name of a vGPU's region.

A VM name reaches the host from the operator (attach, detach, resize), from
the agent's command line (``--listen ADDR=VM``), from libvirt and from the
state file; every one of those entry points checks it here, by the rules
below, so that no name can stand for another VM or for another VM's vGPU.
A vGPU is keyed by a typed pair (VM, device), never by a joined string.

A vGPU's region is the file ``/dev/shm/hvgpu-VM`` (device 0) or
``/dev/shm/hvgpu-VM#N`` (device N): '#' cannot be in a VM name, so no two
vGPUs of any VMs share a file (a '-' would let VM 'a-1' and vGPU 1 of VM 'a'
meet), and '/' cannot be either, so the name never leaves /dev/shm.

A VM's compile cache is the directory :func:`cache_dir_name` names: the VM's
name itself when it is plain, else ``vm-`` and the SHA-256 of the name. A
plain name never starts with ``vm-``, so the two kinds never meet (a short
hash once let VM 'tenant b' and VM 'vm-ecf32d4270d32a24' share a cache).

Must not know where names come from or touch any store: callers check.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import NamedTuple

from hvgpu.errors import HvgpuError
from hvgpu.virtio import protocol as P

MAX_VGPUS = P.MAX_VGPUS  # per VM: the guest reaches vGPU N at the data lane's port + N
MAX_NAME_BYTES = 255  # libvirt keeps a domain name in a path component
REGION_DIR = "/dev/shm"
REGION_PREFIX = "hvgpu-"
# '#' separates a VM from its vGPU number in bindings and in what people read
# ("vm1#1"); '/' would make a name a path (libvirt refuses it for that reason).
_RESERVED = {"#": "it separates a VM from its vGPU number (VM#N)",
             "/": "a name is used in paths"}


class BadVmName(HvgpuError):
    """A VM name that hvgpu refuses (see :func:`check_vm_name`)."""

    code = "bad-vm-name"


class BadDevice(HvgpuError):
    """A vGPU number outside 0..MAX_VGPUS-1."""

    code = "bad-device"


def check_vm_name(name) -> str:
    """``name`` when it is a VM name hvgpu accepts; else :class:`BadVmName` saying why.

    The rules are libvirt's for a domain name (not empty, no '/', no control
    characters, at most 255 bytes of UTF-8), plus no '#', which hvgpu uses to
    name a VM's vGPU N as VM#N.
    """
    if not isinstance(name, str):
        raise BadVmName(f"a VM name is text, not {type(name).__name__}")
    if not name:
        raise BadVmName("a VM name cannot be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadVmName(f"VM name {name!r} is not valid UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise BadVmName(f"VM name {name[:40]!r}... is {size} bytes long; a VM name has at "
                        f"most {MAX_NAME_BYTES}")
    for ch in name:
        if ch in _RESERVED:
            raise BadVmName(f"VM name {name!r} is refused: it contains {ch!r} "
                            f"({_RESERVED[ch]})")
        if unicodedata.category(ch) == "Cc":
            raise BadVmName(f"VM name {name!r} is refused: it contains the control "
                            f"character U+{ord(ch):04X}")
    return name


def check_device(device) -> int:
    if isinstance(device, bool) or not isinstance(device, int) or \
            not 0 <= device < MAX_VGPUS:
        raise BadDevice(f"no vGPU {device!r}: a VM's vGPUs are numbered 0..{MAX_VGPUS - 1}")
    return device


class VgpuKey(NamedTuple):
    """One vGPU: a VM and the guest's device number for it."""

    vm: str
    device: int = 0

    @classmethod
    def of(cls, vm, device=0) -> "VgpuKey":
        """A key from outside values, checked."""
        return cls(check_vm_name(vm), check_device(device))

    @classmethod
    def parse(cls, text: str) -> "VgpuKey":
        """'vm1' -> (vm1, 0); 'vm1#2' -> (vm1, 2): the one place '#' is read.

        Unambiguous because a VM name cannot contain '#'.
        """
        vm, sep, device = text.partition("#")
        if not sep:
            return cls.of(vm, 0)
        if not (device.isascii() and device.isdigit()):
            raise BadDevice(f"{text!r}: after '#' comes a vGPU number "
                            f"0..{MAX_VGPUS - 1}, not {device!r}")
        return cls.of(vm, int(device))

    def __str__(self) -> str:  # for people: logs and messages
        return self.vm if self.device == 0 else f"{self.vm}#{self.device}"


def region_name(key: VgpuKey) -> str:
    """The name of the vGPU's region: libvirt's ``<shmem name=...>``, and
    the file QEMU backs it with in /dev/shm. ``hvgpu-VM`` for device 0, ``hvgpu-VM#N``
    for device N; BadVmName when that would be longer than a file name may be."""
    key = VgpuKey.of(key.vm, key.device)  # the rules above: no '/', no control characters
    name = REGION_PREFIX + str(key)
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        longest = MAX_NAME_BYTES - len(name.encode("utf-8")) + len(key.vm.encode("utf-8"))
        raise BadVmName(f"VM name {key.vm[:40]!r}... is too long for a region: "
                        f"its file name {REGION_PREFIX}VM{'' if not key.device else '#N'} would "
                        f"be {size} bytes, more than a file name may have "
                        f"({MAX_NAME_BYTES}); such a VM's name has at most {longest} bytes")
    return name


_PLAIN = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")
_HASHED = "vm-"


def cache_dir_name(vm: str) -> str:
    """The name of the VM's compile-cache directory, one VM's alone: its name when that
    is plain (letters, digits and . _ + -, not starting with '.' or 'vm-'), else
    'vm-' and the whole SHA-256 of its name in hex. Never '.', '..' or a path."""
    if _PLAIN.fullmatch(vm) and not vm.startswith(_HASHED):
        return vm
    return _HASHED + hashlib.sha256(vm.encode("utf-8", "surrogatepass")).hexdigest()


def region_path(key: VgpuKey) -> str:
    """The file in /dev/shm that backs the vGPU's region."""
    return f"{REGION_DIR}/{region_name(key)}"
