"""Parse and print the sizes and shares operators type.

Sizes: ``4G``, ``4096M``, ``4GiB``, ``1.5G``, ``512MiB``, ``4096B``: a number and
a unit, always. Binary units throughout (K = KiB = 1024 bytes, M = MiB, G = GiB, T =
TiB), as nvidia-smi and virsh use them; a bare number is refused, because "4" read
as bytes gave a 4-byte slice to an operator who meant 4 GiB. Shares: ``25%`` or a
fraction below 1 (``0.25``); ``1`` and ``2`` are refused (is ``1`` all of the GPU or
1%?). A shared-memory region's size is a size with QEMU's ivshmem rule on top (a
power of two). Python callers may pass sizes as ints (bytes). Pure functions; must
not import host or guest code.
"""

from __future__ import annotations

import re

from hvgpu.errors import HvgpuError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:([KMGT])(?:I?B)?|(B))\s*$", re.IGNORECASE)
SIZE_FORMS = ("a number and a unit: 512M, 4G, 4GiB or 1.5G (K, M, G, T and KiB, MiB, GiB, "
              "TiB are powers of 1024: 1G = 1024M; B is bytes)")


class BadValue(HvgpuError):
    code = "bad-value"


def parse_size(text: str | int) -> int:
    """'4G' -> 4294967296; an int is bytes. Refuses a number without a unit, zero,
    negatives and unknown units, saying what is accepted."""
    if isinstance(text, bool):
        raise BadValue(f"{text!r} is not a size; write {SIZE_FORMS}")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            bare = re.match(r"^\s*[-+]?(\d+(?:\.\d*)?|\.\d+)\s*$", str(text))
            why = "has no unit" if bare else "is not a size"
            raise BadValue(f"{text!r} {why}; write {SIZE_FORMS}")
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or m.group(3)).upper()])
    if value <= 0:
        raise BadValue(f"{text!r}: a size must be more than zero")
    return value


MIN_SHM = 1 << 20  # libvirt sizes an ivshmem region in MiB
MAX_SHM = 1 << 40  # host RAM in /dev/shm: far beyond any host's, and within SQLite's integers
_SHM_FORMS = ("a power of two from 1 MiB to 1 TiB (1M, 2M, 4M, ... 512M, 1G, 2G, ...), as "
              "QEMU's ivshmem device maps it as one PCI BAR; or 0 for none")
_SHM_RULE = "is not a size for a shared-memory region: it is " + _SHM_FORMS


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
    try:
        value = parse_size(text)
    except BadValue as exc:
        raise BadValue(f"{exc}; a shared-memory region is {_SHM_FORMS}") from None
    try:
        return check_shm_size(value)
    except BadValue:
        raise BadValue(f"{text!r} ({format_size(value)}) {_SHM_RULE}") from None


SHARE_FORMS = "a percentage, 25% (1% to 100%), or a fraction below 1, 0.25"


def parse_share(text: str | float) -> int:
    """'25%' or '0.25' -> 25 (percent of the GPU's compute, 1..100). A number without
    '%' must be a fraction below 1: '1' (all? 1%?) and '2' are refused."""
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            pct = float(raw[:-1])
        else:
            value = float(raw)
            if not 0 < value < 1:
                raise BadValue(f"{text!r} is not a share: write {SHARE_FORMS} "
                               f"(for all of the GPU, 100%)")
            pct = round(value * 100, 6)
    except ValueError:
        raise BadValue(f"{text!r} is not a share; write {SHARE_FORMS}") from None
    if not 0 < pct <= 100 or pct != int(pct):
        raise BadValue(f"{text!r}: a compute share is a whole percentage from 1% to 100%; "
                       f"write {SHARE_FORMS}")
    return int(pct)


def format_size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            value = n / div
            return f"{value:.1f} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{n} B"
