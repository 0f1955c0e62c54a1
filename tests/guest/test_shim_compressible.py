"""Compressible memory through the libcuda.so.1 shim, against the agent with the GPU
test double: cuda/compressible.c does what NVIDIA's cudaCompressibleMemory does (the
device attribute, the granularity of compressible memory, cuMemCreate with
CU_MEM_ALLOCATION_COMP_GENERIC, the handle's properties, a kernel through the mapping),
and on a slice its charge is exact: refused past the quota, given back at release."""

from __future__ import annotations

import time

import pytest

from tests.guest.test_shim_vmm import build, run


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("compressible"), "compressible")


def test_compressible_memory_runs_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "generic compression supported: 1, vmm 1\n"
        "granularity: a multiple of the plain one yes, recommended a multiple yes\n"
        "compression granted: 1 1\n"
        "saxpy on compressible memory: sum 6291450\n"
        "compressible: ok\n")


def _idle(agent) -> int:
    deadline = time.monotonic() + 20
    while agent.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return agent.api.status()[0]["mem_used"]


def test_compressible_memory_is_charged_exactly_to_the_slice(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"), "quota", "128")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "quota: 128 MiB of compressible memory: 2"
    out = run(exe, sliced.vm_address("vm1"), "quota", "32")
    assert out.stdout.splitlines()[-1] == "quota: 32 MiB of compressible memory: 0"
    assert _idle(sliced) == 0
