"""Wheels of the guest's dependencies (click), for installs that have no package index:
the empty venvs of the packaging tests (``pip install --no-index``) and the real guest
of tests/vm, which has no network.

Each wheel is made from the distribution this interpreter has installed (the one the
tests themselves run with), so nothing is downloaded. Only a pure-Python distribution
installed with a dist-info directory (click's, by pip or a distribution's package) can
be made this way; anything else is refused (CannotMake).
Must not: write outside the directory it is given.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import re
import zipfile
from pathlib import Path

# What the guest needs outside the standard library, as both pyproject.toml files say
GUEST_DEPENDENCIES = ("click",)
# Written by the installer, not part of the wheel
_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


class CannotMake(Exception):
    """The installed distribution cannot be made into a wheel (said in one line)."""


def installed_wheel(name: str, out: Path) -> Path:
    """A wheel of ``name`` as this interpreter has it installed, written under ``out``."""
    dist = importlib.metadata.distribution(name)
    files = [f for f in dist.files or () if f.parts[0] != ".."
             and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    infos = {f.parts[0] for f in files if f.parts[0].endswith(".dist-info")}
    meta = dist.read_text("WHEEL")
    if len(infos) != 1 or (meta is not None and "Root-Is-Purelib: true" not in meta) \
            or any(f.suffix in (".so", ".pyd", ".dylib") for f in files):
        raise CannotMake(f"{name} {dist.version} is not installed as pure Python with a "
                         "dist-info directory: put its wheel in the directory by hand")
    info = infos.pop()
    stem = re.sub(r"[-_.]+", "_", dist.metadata["Name"]).lower()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{stem}-{dist.version}-py3-none-any.whl"
    rows = []

    def add(z: zipfile.ZipFile, path: str, data: bytes) -> None:
        z.writestr(path, data)
        rows.append([path, _digest(data), str(len(data))])

    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            if f.parts[0] == info and f.name in _INSTALLER_FILES | {"WHEEL"}:
                continue
            add(z, f.as_posix(), f.locate().read_bytes())
        # a distribution's packager may drop WHEEL: the wheel needs one
        add(z, f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: hvgpu tests/wheels.py\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(rows + [[f"{info}/RECORD", "", ""]])
        z.writestr(f"{info}/RECORD", record.getvalue())
    return wheel


def guest_dependency_wheels(out: Path) -> list[Path]:
    """A wheel of each of the guest's dependencies, under ``out``: give pip
    ``--find-links`` that directory."""
    return [installed_wheel(name, out) for name in GUEST_DEPENDENCIES]
