"""Graph memory nodes through the libcuda.so.1 shim, against the agent with the GPU test
double: cuda/graph_memory.c (driver API, built with gcc against cuda.h) adds allocation
and free nodes by hand and by stream capture, launches them, uses a live allocation as
device memory, relaunches it unfreed and with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
and reads and resets the graph memory figures; `hostile` tries absurd sizes and
locations and free nodes of memory that is no graph's; `quota` instantiates an
allocation past the slice's 64 MiB."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_compressible import _idle
from tests.guest.test_shim_vmm import build, run

EXPECTED = """alloc node: type 10, 4194304 bytes, the same address yes, on device 0
memset node: type 2
instantiated: used grew no
a second instantiation refused: yes
a clone refused: yes
launched: used at least 4 MiB yes, high at least used yes
live: byte 0x5a, memory type 2
written outside the graph: 0x11
relaunched unfreed: 1
freed: used kept yes
trimmed: used 0
free node: type 11, the same address yes
freed twice in one graph: 1
a free node of cuMemAlloc memory: 1
alloc, memset, copy, free: launched twice, 0x5a
captured: 4 nodes, first type 10, last type 11, the same address yes
captured: launched twice, 0x07
auto free on launch: 3 launches, 0 failed
reset: used high 0, reserved high 0
setting the current figure: 1
graph_memory: ok
"""


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("graph_memory"), "graph_memory")


def test_graph_memory_runs_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == EXPECTED


def test_hostile_graph_memory_is_refused(exe, fake_agent):
    out = run(exe, fake_agent.address, "hostile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("hostile: absurd sizes, other devices, host memory "
                                           "and strangers' frees refused")


def test_an_allocation_node_past_the_slice_is_refused_at_instantiation(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"), "quota", "100")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "quota: instantiating 100 MiB: 2\n"  # CUDA_ERROR_OUT_OF_MEMORY
    out = run(exe, sliced.vm_address("vm1"), "quota", "16")
    assert out.stdout == "quota: instantiating 16 MiB: 0\n"
    assert _idle(sliced) == 0  # its charge went with its instantiation
