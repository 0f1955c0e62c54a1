"""Managed memory through the libcuda.so.1 shim, against the agent with the GPU test
double (issue 27): cuda/managed.c writes managed memory on the host, launches, reads it
back after each synchronisation, copies into and out of it, attaches it to a stream,
advises and prefetches it, and goes past the slice's quota with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.guest.test_shim_vmm import build, run

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("managed"), "managed", ())


def test_the_host_and_the_device_see_the_same_managed_bytes(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "managed memory 1, concurrent managed access 0\n"
        "after a launch and a synchronize: y[0] 4, y[n-1] 4\n"
        "host writes went to the device: y[0] 12, y[1] 6, y[n-1] 4\n"
        "copies: from y 12 6; into y, seen by the host: 7 8\n"
        "attached to a stream, synchronised by it: y[5] 3\n"
        "attributes: managed 1, plain 0; read mostly 1, preferred -1, last prefetch 0\n"
        "managed: ok\n")


def test_managed_memory_is_charged_to_the_slice_and_refused_past_it(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"), "quota")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "quota: past the slice refused; 1000 bytes take 2048 KiB of it\n"
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0
