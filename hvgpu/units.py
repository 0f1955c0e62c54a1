"""Parse and print the sizes and shares operators type.

Sizes: ``4G``, ``4096M``, ``4GiB``, ``1.5G``, ``512MiB``, ``4096B``: a number and
a unit, always. Binary units throughout (K = KiB = 1024 bytes, M = MiB, G = GiB, T =
TiB), as nvidia-smi and virsh use them; a bare number is refused, because "4" read
as bytes gave a 4-byte slice to an operator who meant 4 GiB. Shares: ``25%`` or a
fraction below 1 (``0.25``); ``1`` and ``2`` are refused (is ``1`` all of the GPU or
1%?). A region's size is a size with QEMU's ivshmem rule on top (a
power of two). Python callers may pass sizes as ints (bytes). Pure functions; must
not import host or guest code.
"""

from __future__ import annotations

import re
from fractions import Fraction

from hvgpu.errors import HvgpuError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(?:([KMGT])(?:I?B)?|(B))\s*$", re.IGNORECASE)
SIZE_FORMS = ("a number and a unit: 512M, 4G, 4GiB or 1.5G (K, M, G, T and KiB, MiB, GiB, "
              "TiB are powers of 1024: 1G = 1024M; B is bytes)")


class BadValue(HvgpuError):
    code = "bad-value"


MAX_SIZE = 1 << 50  # 1024 TiB: more than any host's RAM or GPU's memory, by far
# A slice's smallest memory quota. Under MPS the driver enforces a quota given in whole
# MiB (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, mps.py), so a smaller one cannot be told to
# it; the agent's own accounting charges allocations as the driver takes them (512 B
# steps up to 1 MiB, then 2 MiB pages) and would hold any size, but the two would then
# disagree.
MIN_MEM = 1 << 20


def parse_size(text: str | int) -> int:
    """'4G' -> 4294967296; an int is bytes. Refuses a number without a unit, zero,
    negatives, unknown units and sizes beyond MAX_SIZE, saying what is accepted.
    Exact: '1.1G' is 1181116006 bytes (rounded down), never a float's approximation."""
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
        whole, _, decimals = m.group(1).partition(".")
        if len(whole.lstrip("0")) > 20:  # past MAX_SIZE in any unit: not worth a Fraction
            raise BadValue(f"{text!r} is more than {format_size(MAX_SIZE)}, more than any "
                           "host or GPU has")
        # decimals past the 20th are below a byte in any unit
        number = Fraction(f"{whole or 0}.{decimals[:20] or 0}")
        value = int(number * _UNITS[(m.group(2) or m.group(3)).upper()])
    if value <= 0:
        raise BadValue(f"{text!r}: a size must be more than zero")
    if value > MAX_SIZE:
        raise BadValue(f"{text!r} is more than {format_size(MAX_SIZE)}, more than any host "
                       "or GPU has")
    return value


def parse_mem(text: str | int) -> int:
    """A slice's memory quota: a size (parse_size) of at least MIN_MEM."""
    value = parse_size(text)
    if value < MIN_MEM:
        shown = text if isinstance(text, str) else value
        raise BadValue(f"{shown!r} is {format_size(value)}: a slice's memory quota is at least "
                       f"{format_size(MIN_MEM)} (the driver enforces it in whole MiB)")
    return value


MIN_REGION = 1 << 20  # libvirt sizes an ivshmem region in MiB
MAX_REGION = 1 << 40  # host RAM in /dev/shm: far beyond any host's, and within SQLite's integers
_REGION_FORMS = ("a power of two from 1 MiB to 1 TiB (1M, 2M, 4M, ... 512M, 1G, 2G, ...), as "
              "QEMU's ivshmem device maps it as one PCI BAR; or 0 for none")
_REGION_RULE = "is not a size for a region: it is " + _REGION_FORMS


def check_region_size(value) -> int:
    """``value`` when it is a region's size: 0 (no region), or a power of
    two from MIN_REGION to MAX_REGION (QEMU maps an ivshmem region as one PCI BAR, which is a
    power of two); else BadValue saying what is accepted."""
    if isinstance(value, int) and not isinstance(value, bool) and (
            value == 0 or (MIN_REGION <= value <= MAX_REGION and value & (value - 1) == 0)):
        return value
    shown = format_size(value) if isinstance(value, int) and value > 0 else repr(value)
    raise BadValue(f"{shown} {_REGION_RULE}")


def parse_region_size(text: str | int) -> int:
    """'1G' -> 1073741824; '0' -> 0 (no region); anything else that is not a power of two
    from 1 MiB to 1 TiB is refused, saying what is accepted."""
    if isinstance(text, str) and text.strip() == "0":
        return 0
    if isinstance(text, int) and not isinstance(text, bool):
        return check_region_size(text)
    try:
        value = parse_size(text)
    except BadValue as exc:
        raise BadValue(f"{exc}; a region is {_REGION_FORMS}") from None
    try:
        return check_region_size(value)
    except BadValue:
        raise BadValue(f"{text!r} ({format_size(value)}) {_REGION_RULE}") from None


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


_SHOWN = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _number(n: int, div: int) -> str:
    """n / div with one decimal, or none when whole; two when one would read whole and
    is not (511.96, not 512.0), none when two would too (the value is that close)."""
    if n % div == 0:
        return str(n // div)
    value = n / div
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = f"{value:.2f}"
        if text.endswith(".00"):
            text = text[:-3]
    return text


def format_size(n: int) -> str:
    """How every hvgpu command prints a size: in the largest binary unit it reaches
    (4 GiB, 1.5 TiB, 511.96 MiB; 100 B). Exact figures are in --json, in bytes."""
    for unit, div in _SHOWN:
        text = _number(n, div)
        if float(text) >= 1:
            return f"{text} {unit}"
    return f"{n} B"
