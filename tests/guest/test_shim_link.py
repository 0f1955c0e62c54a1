"""The JIT linker through the libcuda.so.1 shim, against the agent with the GPU test
double: cuda/link_ptx.c links PTX as NVIDIA's ptxjit sample does (six options, the
logs and wall time written back into its own buffers), from memory and from a file,
loads and launches the cubin, and sees a bad PTX's error log; in its `hostile` mode it
tries options that name host pointers, missing files, empty and unknown inputs."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build, run


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("link_ptx"), "link_ptx")


def test_ptx_links_loads_and_runs_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "linked: an ELF cubin, info log written, its size option the bytes filled\n"
        "wall time: given\n"
        "saxpy from the linked cubin: sum 12286\n"
        "linked: an ELF cubin, info log written, its size option the bytes filled\n"
        "saxpy from the linked cubin: sum 12286\n"
        "bad PTX: 218, error log written\n"
        "link_ptx: ok\n")


def test_hostile_links_are_refused(exe, fake_agent):
    out = run(exe, fake_agent.address, "hostile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("hostile: host-pointer options, missing files, "
                                           "empty and unknown inputs refused")
