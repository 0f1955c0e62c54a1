"""Stream attributes, the JIT linker, compressible memory and graph memory nodes on a GPU:
each program (cuda/stream_attributes.c, cuda/link_ptx.c, cuda/compressible.c,
cuda/graph_memory.c, driver API only, built with gcc against cuda.h) prints the same
natively and through the shim, line for line.
HVGPU_SHIM_REPORT=DIR keeps what each run printed."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build
from tests.guest.test_vmm_gpu import _native_env, _report, _shim_env, _run

pytestmark = pytest.mark.gpu
PROGRAMS = ["stream_attributes", "link_ptx", "compressible", "graph_memory"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("streams_link")
    return {name: build(out, name) for name in PROGRAMS}


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_prints_the_same_through_the_shim(built, program, gpu_agent):
    native = _run(built[program], _native_env())
    shimmed = _run(built[program], _shim_env(gpu_agent.address))
    _report(f"{program}.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
