"""Pinned memory kernels reach through the program's pointer, and stream memory
operations, on a GPU: cuda/mapped_memops.c (driver API only, built with gcc against
cuda.h) prints the same natively and through the shim, line for line; through the shim
its hostile part too (what the shim refuses at the call). HVGPU_SHIM_REPORT=DIR keeps
what each run printed."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build
from tests.guest.test_vmm_gpu import _native_env, _report, _run, _shim_env

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("mapped_gpu"), "mapped_memops")


def test_mapped_pinned_memory_and_stream_memops_print_the_same_through_the_shim(exe, gpu_agent):
    native = _run(exe, _native_env())
    shimmed = _run(exe, _shim_env(gpu_agent.address))
    _report("mapped_memops.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
    assert "kernel wrote the host's bytes: y[0]=1 y[999]=1999" in native.stdout


def test_the_shim_refuses_what_the_device_cannot_reach_on_a_gpu(exe, gpu_agent):
    shimmed = _run(exe, _shim_env(gpu_agent.address), "hostile")
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert "hostile: foreign addresses, registered memory and bad operations refused" \
        in shimmed.stdout
