"""A sysfs tree of regular files standing in for a VM's PCI devices, for the guest's
region device lookup (the C client's region.c) and hvgpu-guest install.

Laid out as the kernel lays it out: the device's directory under
``devices/pci0000:00/``, a symlink to it in ``bus/pci/devices/``, ``vendor`` and
``device`` as hex lines, and ``resourceN`` files as long as the BAR (a regular file
maps as a BAR does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hvgpu.virtio import region as layout

REPO = Path(__file__).resolve().parents[2]

MiB = 1 << 20


def add_device(sysfs: Path, address: str, *, vendor: int = layout.PCI_VENDOR,
               device: int = layout.PCI_DEVICE, size: int = MiB, header: bytes | None = None,
               bars: tuple[int, ...] = (0, layout.PCI_BAR)) -> Path:
    """Adds a PCI device; returns its BAR 2 file (which may not exist, per ``bars``)."""
    real = sysfs / "devices" / "pci0000:00" / address
    real.mkdir(parents=True)
    (real / "vendor").write_text(f"{vendor:#06x}\n")
    (real / "device").write_text(f"{device:#06x}\n")
    for bar in bars:
        with open(real / f"resource{bar}", "wb") as f:
            f.truncate(size if bar == layout.PCI_BAR else 256)
            if bar == layout.PCI_BAR and header:
                f.write(header)
        os.chmod(real / f"resource{bar}", 0o600)  # as the kernel makes them: root's alone
    link = sysfs / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("../../..") / "devices" / "pci0000:00" / address)
    return link / f"resource{layout.PCI_BAR}"


def region_header(token: bytes, device: int = 0, size: int = MiB) -> bytes:
    return layout.pack_header(size, token, device)


NOBODY = 65534


def shared_dir() -> tempfile.TemporaryDirectory:
    """A directory another user can walk (pytest's tmp_path is root's alone)."""
    d = tempfile.TemporaryDirectory(prefix="hvgpu-sysfs-")
    os.chmod(d.name, 0o755)
    return d


def as_user(setup: str, body: str, args: list[str], *,
            groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Python ``setup`` (imports: the interpreter's own files are root's alone here),
    then ``body`` as an unprivileged user (nobody, when this is root) in ``groups``
    besides its own; ``args`` are its sys.argv[1:]."""
    if os.geteuid() != 0 and groups:
        raise RuntimeError("only root can run a test user with other groups")
    drop = (f"import os\nif os.geteuid() == 0:\n    os.setgroups({list(groups)!r})\n"
            f"    os.setgid({NOBODY}); os.setuid({NOBODY})\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", setup + "\n" + drop + body, *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
