"""Graph features of NVIDIA's cuda-samples through the libcuda.so.1 shim.

cuda/graph_features.cu (nvcc, static cudart) calls them as the samples do: clones of
captured, split and hand-built graphs and the copies of nodes in them
(simpleCudaGraphs), kernel parameters set in instantiations that have guest-side
parts (jacobiCudaGraphs: a copy to pageable memory; a host node; a host function in
a capture); cudaGraphAddNode with conditional WHILE and IF nodes whose bodies
the program fills (graphConditionalNodes). Against the GPU test double, whose saxpy runs as the kernel does; on the
GPU machine the native and shim runs must print the same.
"""

from __future__ import annotations

import subprocess

import pytest

from bench import toolkit
from tests.guest.test_shim_cache import shim_stats
from tests.guest.test_shim_region_lane import _run

NVCC = toolkit.nvcc()
HERE = __import__("pathlib").Path(__file__).parent

EXPECTED = {
    "clone": """captured clone: 3 nodes, 3 in the clone, wrong 0
split clone: host function ran 2 times, wrong 0
built clone: copies are new nodes 1 1, a stranger: cudaErrorInvalidValue
built clone: host node ran 1 times, wrong 0
done: 0
""",
    "setparams": """built: a=1, wrong 0, host node ran 1 times
built: a=2, wrong 0, host node ran 2 times
built: a=3, wrong 0, host node ran 3 times
built: a node added after instantiating: cudaErrorInvalidValue
built: updated, a=7, wrong 0, host nodes ran 3 and 1 times
built: set after the update, a=8, wrong 0
built: updated from another shape: cudaErrorGraphExecUpdateFailure, result 1
captured: a=5, wrong 0, host function ran 1 times
done: 0
""",
    "conditional": """addnode: memset and kernel nodes, wrong 0
while: launch 1, 5 iterations in all, counter 0
while: launch 2, 10 iterations in all, counter 0
if: flag 1, y is 1.0
if: flag 0, y is 2.0
done: 0
""",
}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    exe = tmp_path_factory.mktemp("graph_features") / "graph_features"
    subprocess.run([NVCC, "-arch=sm_90", "-o", str(exe), str(HERE / "cuda/graph_features.cu")],
                   check=True, capture_output=True, timeout=300)
    return exe


@pytest.mark.parametrize("part", sorted(EXPECTED))
def test_graph_features_against_the_double(program, part, fake_agent):
    out = _run(program, fake_agent.address, part)
    assert out.stdout == EXPECTED[part]
    if part == "clone":
        stats = shim_stats(out.stderr)
        # the captured graph's one part, the split one's two, the built one's executor
        # graph: each cloned on the executor
        assert stats["GRAPH_CLONE"] == (4, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("part", sorted(EXPECTED))
def test_graph_features_print_the_same_natively_and_through_the_shim(program, part, gpu_agent):
    from tests.guest.test_shim_gpu import _native_env, _report, _shim_env

    cmd = [str(program), part]
    native = subprocess.run(cmd, capture_output=True, text=True, env=_native_env(), timeout=600)
    shimmed = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env=dict(_shim_env(gpu_agent), HVGPU_SHIM_STATS="1"))
    _report(f"graph_features_{part}.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert native.stdout == EXPECTED[part]
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
