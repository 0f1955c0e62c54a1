"""Page-locked host memory used where CUDA takes a device pointer (unified addressing),
through the libcuda.so.1 shim against the GPU test double: cuda/pinned_host.c memsets it
and copies to and from it, and reads back what the GPU would have written."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.guest.test_shim_vmm import HERE, cuda_include, library, run

EXPECTED = [
    "host: first=01020304 bytes4-9=abababababab byte10=02 u16@16=beef,beef last=cafef00d",
    "device: from host ok=1; host to host: 6 15; dtoh 30; htod 77",
]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    include = cuda_include()
    if include is None:
        pytest.skip("cuda.h (CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("pinned") / "pinned_host"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-o", str(out),
                    str(HERE / "cuda/pinned_host.c"), f"-I{include}", f"-L{library().parent}",
                    "-l:libcuda.so.1"], check=True, timeout=120)
    return out


def test_page_locked_host_memory_is_set_and_copied_where_a_device_pointer_goes(exe, tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE)
    try:
        out = run(exe, agent.address)
    finally:
        agent.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == EXPECTED


@pytest.mark.gpu
def test_page_locked_host_memory_prints_the_same_natively_and_through_the_shim(exe, gpu_agent):
    from tests.guest.test_vmm_gpu import _native_env, _run, _shim_env

    native = _run(exe, _native_env())
    shimmed = _run(exe, _shim_env(gpu_agent.address))
    print(f"pinned_host: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert native.stdout.splitlines() == EXPECTED == shimmed.stdout.splitlines()
