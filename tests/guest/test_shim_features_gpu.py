"""Issue 27's driver features on a GPU: programs print the same natively and through
the shim (context creation parameters, context limits, cooperative launches, managed
memory). Each is built with nvcc (static and shared cudart) and compared line for line,
as test_shim_gpu.py does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hvgpu.guest.shim import library
from tests.guest.test_shim_gpu import NVCC, _native_env, _report, _run, _shim_env

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent / "cuda"
PROGRAMS = ["limits_cooperative", "managed_memory"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    out = tmp_path_factory.mktemp("features")
    exes = {}
    for name in PROGRAMS:
        for cudart in ("static", "shared"):
            exe = out / f"{name}_{cudart}"
            flags = ["-cudart=shared"] if cudart == "shared" else []
            subprocess.run([NVCC, "-arch=sm_90", "-rdc=true", *flags, "-o", str(exe),
                            str(HERE / f"{name}.cu"), "-Xcompiler", "-fopenmp",
                            # by name: natively the real driver answers it
                            f"-L{library().parent}", "-l:libcuda.so.1"],
                           check=True, timeout=600)
            exes[f"{name}_{cudart}"] = exe
    return exes


@pytest.mark.parametrize("program", [f"{p}_{c}" for p in PROGRAMS for c in ("static", "shared")])
def test_feature_prints_the_same_through_the_shim(built, program, gpu_agent):
    args = [str(built[program])]
    native = _run(args, _native_env())
    shimmed = _run(args, _shim_env(gpu_agent))
    _report(f"{program}.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
