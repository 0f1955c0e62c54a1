"""libvirt has one owner in hvgpu: hvgpu/host/hypervisor.py. Every other module goes
through its Domain and Hypervisor: none may import libvirt or call a libvirt object."""
from __future__ import annotations

import ast
from pathlib import Path

import hvgpu

ROOT = Path(hvgpu.__file__).parent
OWNER = ROOT / "host" / "hypervisor.py"


def _libvirt(name: str | None) -> bool:
    # libvirt, libvirt_qemu, libvirt_lxc, libvirtmod...: all of libvirt-python
    return bool(name) and name.split(".")[0].startswith("libvirt")


def libvirt_imports(source: str) -> list[int]:
    """Lines of ``source`` that import libvirt, however spelt."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(_libvirt(a.name) for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _libvirt(node.module):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _libvirt(node.args[0].value) \
                and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                     or (isinstance(node.func, ast.Attribute)
                         and node.func.attr == "import_module")):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_every_way_of_importing_libvirt():
    source = ("import os, libvirt\nfrom libvirt import open\nimport libvirt_qemu as q\n"
              "importlib.import_module('libvirt')\n__import__('libvirt')\n"
              "from hvgpu.host import hypervisor\n")
    assert libvirt_imports(source) == [1, 2, 3, 4, 5]
    assert libvirt_imports("from hvgpu.host.libvirt_hook import main\n") == []


def test_only_hypervisor_py_imports_libvirt():
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == OWNER:
            continue
        lines = libvirt_imports(path.read_text())
        if lines:
            offenders[str(path.relative_to(ROOT.parent))] = lines
    assert offenders == {}, "libvirt belongs to hvgpu/host/hypervisor.py alone"
    assert libvirt_imports(OWNER.read_text())  # the scan sees the owner's own import


def _libvirt_methods() -> set[str]:
    """The camelCase methods of libvirt's connection and domain objects (names such as
    ``name`` or ``create`` are too common to tell anything)."""
    import pytest

    libvirt = pytest.importorskip("libvirt")
    return {m for cls in (libvirt.virConnect, libvirt.virDomain) for m in dir(cls)
            if not m.startswith("_") and m != m.lower()}


def test_no_other_module_calls_libvirt_objects():
    methods = _libvirt_methods()
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == OWNER:
            continue
        used = sorted({node.attr for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, ast.Attribute) and node.attr in methods})
        if used:
            offenders[str(path.relative_to(ROOT.parent))] = used
    assert offenders == {}, "only hypervisor.py touches libvirt objects: use its Domain"
