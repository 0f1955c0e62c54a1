"""The C libraries that should build did build.

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
    rebuild = "python setup.py build_ext --inplace (or pip install -e .); its output says why"
    assert library.exists(), f"the {name} ({library.name}) did not build: {rebuild}"
    built = library.stat().st_mtime
    stale = [str(s.relative_to(ROOT)) for s in sources if s.stat().st_mtime > built]
    assert not stale, f"the {name} ({library.name}) is older than {stale}: {rebuild}"
