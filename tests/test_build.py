"""The C libraries that should build did build, and the wheel carries every package.

build_c.py marks every one optional, so that an install without a C compiler still
succeeds (the shim is then reported missing, the launch loop falls back to
Python). That must not hide a broken build: where a C compiler is present, each
library must exist and be newer than every source it is built from.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "hvgpu" / "guest" / "shim"
EXECUTOR = ROOT / "hvgpu" / "host" / "executor"
WIRE_HEADER = ROOT / "hvgpu" / "virtio" / "include" / "hvgpu_wire.h"
CC = shutil.which("cc") or shutil.which("gcc")

LIBRARIES = {
    "shim": (SHIM / "libcuda.so.1",
             sorted(SHIM.glob("*.c")) + sorted(SHIM.glob("*.h")) + sorted(SHIM.glob("*.def"))
             + [WIRE_HEADER]),
    "NVML library": (SHIM / "libnvidia-ml.so.1",
                     sorted((ROOT / "hvgpu" / "guest" / "nvml").glob("*.[ch]"))
                     + [ROOT / "hvgpu" / "guest" / "nvml" / "nvml_api.def", SHIM / "wire.c",
                        SHIM / "shim.h", WIRE_HEADER]),
    "client library": (SHIM / "libhvgpu-client.so.1",
                       [ROOT / "hvgpu" / "guest" / "clientlib" / "client.c", SHIM / "shim.h",
                        WIRE_HEADER] + [SHIM / s for s in ("wire.c", "region_lane.c", "region.c",
                                                            "pcopy.c")]),
    "launch loop": (EXECUTOR / "liblaunch_burst.so", [EXECUTOR / "launch_burst.c",
                                                      EXECUTOR / "launch_burst.h", WIRE_HEADER]),
}


def _setup_sources() -> list[str]:
    tree = ast.parse((ROOT / "build_c.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SOURCES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("build_c.py has no SOURCES list")


def test_setup_builds_every_shim_source():
    listed = _setup_sources()
    on_disk = sorted(p.name for p in SHIM.glob("*.c"))
    assert sorted(listed) == on_disk, "build_c.py's SOURCES and hvgpu/guest/shim/*.c differ"


@pytest.mark.skipif(CC is None, reason="no C compiler: the libraries are optional there")
@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_a_c_library_that_should_build_did(name):
    library, sources = LIBRARIES[name]
    rebuild = (
        "python setup.py build_ext --inplace, or pip install -e ., or (any setuptools, "
        "offline) python3 build_c.py; its output says why")
    assert library.exists(), f"the {name} ({library.name}) did not build: {rebuild}"
    built = library.stat().st_mtime
    stale = [str(s.relative_to(ROOT)) for s in sources if s.stat().st_mtime > built]
    assert not stale, f"the {name} ({library.name}) is older than {stale}: {rebuild}"


@pytest.mark.skipif(CC is None, reason="no C compiler: the libraries are optional there")
def test_build_c_as_a_script_builds_every_library_without_reading_pyproject(tmp_path):
    """`python3 build_c.py`: the in-place build for a machine whose setuptools cannot read
    pyproject.toml's metadata (older than 77) and cannot fetch a newer one."""
    import subprocess
    import sys

    for _, sources in LIBRARIES.values():
        for source in sources + [ROOT / "build_c.py"]:
            copy = tmp_path / source.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
    # metadata no setuptools accepts: a build that read it would fail
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nlicense = 7\n')
    done = subprocess.run([sys.executable, str(tmp_path / "build_c.py")], cwd="/",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for library, _ in LIBRARIES.values():
        assert (tmp_path / library.relative_to(ROOT)).exists(), library.name


def test_every_package_is_one_the_wheel_installs():
    """pyproject.toml names its packages one by one: a package left out is in a
    checkout and missing from an installed hvgpu."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for init in (ROOT / "hvgpu").rglob("__init__.py")}
    assert found - listed == set()
