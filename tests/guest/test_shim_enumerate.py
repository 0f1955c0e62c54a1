"""A module's and a library's functions found without their names, through the
libcuda.so.1 shim (cuda/enumerate_functions.c): the count, the names, a launch of a
function found that way, a short array refused, and the driver's private tools table
whose slot 7 cuFFT finds each of its kernels with; against the GPU test double here,
and natively against the shim line for line on a GPU."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build, run
from tests.guest.test_vmm_gpu import _native_env, _report, _run, _shim_env

EXPECTED = (
    "module functions: 2\n"
    "a short array: 1\n"
    "module: add_one set_seven\n"
    "add_one found by enumeration: 1\n"
    "a null module: 400\n"
    "tools table: add_one set_seven\n"
    "tools table returned 2\n"
    "add_one found by the tools table: 2\n"
    "library kernels: 2\n"
    "library: add_one set_seven\n"
    "enumerated kernel is cuLibraryGetKernel's: yes\n"
    "set_seven found by enumeration: 7\n"
    "enumerate: ok\n")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("enumerate"), "enumerate_functions")


def test_functions_are_found_by_enumeration_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == EXPECTED


@pytest.mark.gpu
def test_enumeration_prints_the_same_through_the_shim(exe, gpu_agent):
    native = _run(exe, _native_env())
    shimmed = _run(exe, _shim_env(gpu_agent.address))
    _report("enumerate_functions.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.stdout == native.stdout
