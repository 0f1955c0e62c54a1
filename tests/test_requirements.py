"""The Python versions the README's requirements table states are the ones each
distribution declares, and the host's admits no Python its code cannot run on."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _requires_python(pyproject: Path) -> SpecifierSet:
    return SpecifierSet(tomllib.loads(pyproject.read_text())["project"]["requires-python"])


def _readme_minimum(row: str) -> str:
    line = next(x for x in (ROOT / "README.md").read_text().splitlines()
                if x.startswith(f"| {row} |"))
    return re.search(r"\| (3\.\d+) or newer", line).group(1)


def _imports(package: Path) -> set[str]:
    names = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def test_the_host_distribution_admits_no_python_without_tomllib():
    spec = _requires_python(ROOT / "pyproject.toml")
    assert "tomllib" in _imports(ROOT / "hvgpu" / "host")  # the agent's configuration file
    assert "3.10.13" not in spec and "3.11.0" in spec


def test_the_readme_states_what_each_distribution_requires():
    host = _requires_python(ROOT / "pyproject.toml")
    guest = _requires_python(ROOT / "guest-dist" / "hvgpu-guest" / "pyproject.toml")
    for row, spec in (("Python on the host (`hvgpu`)", host),
                      ("Python in the VM (`hvgpu-guest`)", guest)):
        minimum = _readme_minimum(row)
        older = f"3.{int(minimum.split('.')[1]) - 1}.99"
        assert f"{minimum}.0" in spec and older not in spec, (row, minimum, str(spec))
