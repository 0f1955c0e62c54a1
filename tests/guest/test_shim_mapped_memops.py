"""Pinned memory a kernel reaches through the program's own pointer, and stream memory
operations, through the libcuda.so.1 shim against the GPU test double: cuda/mapped_memops.c
hands cuMemHostAlloc memory to a kernel by its host pointer and by
cuMemHostGetDevicePointer (the double's kernels read and write the bytes the program
sees), and releases a stream's wait from another stream and from the host."""

from __future__ import annotations

import pytest

from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.guest.test_shim_vmm import build, run

EXPECTED = [
    "attributes: map host memory 1, unified addressing 1, mem ops v1 0, 64-bit 1, nor 1",
    "flags: 3 2; device pointers are the host's: 1 1",
    "pointer attributes: type 1, device pointer ok 1, host pointer ok 1",
    "kernel wrote the host's bytes: y[0]=1 y[999]=1999 sum=1000000",
    "and read them: x[0]=4.5 x[999]=7996.5 sum=4000500",
    "wait and write between streams: d[0]=abcd flag=1,2",
    "64-bit: flag[3]=99",
    "host-released wait, batch: d[8]=77 d[9]=7 flag[5]=8",
]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("mapped"), "mapped_memops")


def test_kernels_reach_pinned_memory_and_streams_wait_for_values(exe, tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE)
    try:
        out = run(exe, agent.address, "hostile")
    finally:
        agent.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == EXPECTED + [
        "hostile: foreign addresses, registered memory and bad operations refused", "done"]


def test_without_a_region_pinned_memory_is_not_device_mapped_and_says_so(exe, tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, local_region=0)
    try:
        out = run(exe, agent.address)
    finally:
        agent.stop()
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        "attributes: map host memory 0, unified addressing 1, mem ops v1 0, 64-bit 1, nor 1",
        "cuMemHostGetDevicePointer(&dx, x, 0): 801, not 0"]
    assert "is not implemented by the hvgpu shim" in out.stderr
