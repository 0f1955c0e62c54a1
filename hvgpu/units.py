"""Parse and print the sizes and shares operators type.

Sizes: ``4G``, ``4096M``, ``4GiB``, ``0.5G``, ``512MiB``, plain bytes. Binary
units throughout (G = GiB), as nvidia-smi and virsh use them. Shares:
``25%`` or ``0.25``. A shared-memory region's size is a size with QEMU's
ivshmem rule on top (a power of two). Pure functions; must not import host or
guest code.
"""

from __future__ import annotations

import re

from hvgpu.errors import HvgpuError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


class BadValue(HvgpuError):
    code = "bad-value"


def parse_size(text: str | int) -> int:
    """'4G' -> 4294967296; refuses zero, negatives and unknown units."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise BadValue(f"{text!r} is not a size; use e.g. 4G, 4096M, 4GiB or 0.5G")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise BadValue(f"{text!r}: a size must be more than zero")
    return value


MIN_SHM = 1 << 20  # libvirt sizes an ivshmem region in MiB
MAX_SHM = 1 << 40  # host RAM in /dev/shm: far beyond any host's, and within SQLite's integers
_SHM_RULE = ("is not a size for a shared-memory region: it is a power of two from 1 MiB to "
             "1 TiB (1M, 2M, 4M, ... 512M, 1G, 2G, ...), as QEMU's ivshmem device maps it "
             "as one PCI BAR; or 0 for none")


def check_shm_size(value) -> int:
    """``value`` when it is a shared-memory region's size: 0 (no region), or a power of
    two from MIN_SHM to MAX_SHM (QEMU maps an ivshmem region as one PCI BAR, which is a
    power of two); else BadValue saying what is accepted."""
    if isinstance(value, int) and not isinstance(value, bool) and (
            value == 0 or (MIN_SHM <= value <= MAX_SHM and value & (value - 1) == 0)):
        return value
    shown = format_size(value) if isinstance(value, int) and value > 0 else repr(value)
    raise BadValue(f"{shown} {_SHM_RULE}")


def parse_shm_size(text: str | int) -> int:
    """'1G' -> 1073741824; '0' -> 0 (no region); anything else that is not a power of two
    from 1 MiB to 1 TiB is refused, saying what is accepted."""
    if isinstance(text, str) and text.strip() == "0":
        return 0
    if isinstance(text, int) and not isinstance(text, bool):
        return check_shm_size(text)
    value = parse_size(text)
    try:
        return check_shm_size(value)
    except BadValue:
        raise BadValue(f"{text!r} ({format_size(value)}) {_SHM_RULE}") from None


def parse_share(text: str | float) -> int:
    """'25%' or '0.25' -> 25 (percent of the GPU's compute, 1..100)."""
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            pct = float(raw[:-1])
        else:
            value = float(raw)
            pct = value * 100 if value <= 1 else value
    except ValueError:
        raise BadValue(f"{text!r} is not a share; use e.g. 25% or 0.25") from None
    if not 0 < pct <= 100 or pct != int(pct):
        raise BadValue(f"{text!r}: a compute share is a whole percentage from 1% to 100%")
    return int(pct)


def format_size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            value = n / div
            return f"{value:.1f} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{n} B"
