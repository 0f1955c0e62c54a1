"""Stream capture and CUDA graphs through the libcuda.so.1 shim.

cuda/graphs.cu (nvcc's static and shared cudart) captures a graph across two streams
that an event forks and joins, copying from pinned memory to the device and back into
pinned memory, and replays it three times with new input; it prints what capture
queries answered and what a capture refused; then it builds a graph node by node,
changes its kernel node's parameters in the instantiation and updates the
instantiation from a graph of the same shape, and builds one with a host node. Against the GPU test double (which
records captured work and replays it) in its "nokernel" form; on the GPU machine the
native and shim runs must print the same.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bench import toolkit
from hvgpu.guest.shim import library
from tests.conftest import RunningAgent
from tests.guest.test_shim_cache import shim_stats
from tests.guest.test_shim_region_lane import _run

HERE = Path(__file__).parent
NVCC = toolkit.nvcc()

EXPECTED = """before: capturing 0
during: origin 1, joined 1, same capture 1
after: capturing 0 0
nodes: counted 1, listed 1, past the end null 1
captured work ran before launch: 0 bytes
pageable copy in a capture: cudaSuccess, end: cudaSuccess, graph made
synchronize in a capture: cudaErrorStreamCaptureUnsupported, end: cudaErrorStreamCaptureInvalidated, graph none
pageable and a host function: 1 nodes, host function ran 3 times with 0 wrong bytes, 0 wrong after
built: 7 nodes, update cudaSuccess, wrong 0
host node: 5 nodes, ran 2 times, saw 0 wrong bytes, 0 wrong after
graphs: wrong=0
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("graphs")
    built = {}
    for cudart in ("static", "shared"):
        exe = out / f"graphs_{cudart}"
        subprocess.run([NVCC, "-arch=sm_90", *(["-cudart=shared"] if cudart == "shared" else []),
                        "-o", str(exe), str(HERE / "cuda/graphs.cu")], check=True,
                       capture_output=True, timeout=300)
        built[cudart] = exe
    return built


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_a_captured_graph_replays_with_new_pinned_input_each_time(programs, cudart, fake_agent):
    out = _run(programs[cudart], fake_agent.address, "nokernel")
    assert out.stdout == EXPECTED
    stats = shim_stats(out.stderr)
    # four captures (the pageable copy's, the one a synchronisation invalidated, and the
    # one a host function split in two: begun and ended twice); the first graph's three
    # replays, the split graph's three (two parts each), the built graph's two, the host
    # node's graph's two (two parts each: before and after the host node)
    assert stats["STREAM_BEGIN_CAPTURE"] == (5, 0)
    assert stats["STREAM_END_CAPTURE"] == (5, 0)
    assert stats["GRAPH_LAUNCH"] == (0, 15)
    assert stats["GRAPH_INSTANTIATE"] == (6, 0)  # two for each graph cut in two parts
    # pinned in/out, and a room of the region for each pageable copy in a graph (one in
    # the capture made of it alone, three in the split one), given back with its graph
    assert stats["REGION_ATTACH"] == (6, 0) and stats["REGION_DETACH"] == (6, 0)
    # the two built graphs and the host node's, whose two parts are built again from it
    assert stats["GRAPH_CREATE"] == (5, 0)
    assert stats["GRAPH_ADD_MEMCPY_NODE"] == (10, 0) and stats["GRAPH_ADD_MEMSET_NODE"] == (6, 0)
    assert stats["GRAPH_ADD_EMPTY_NODE"] == (4, 0) and stats["GRAPH_ADD_EVENT_NODE"] == (2, 0)
    assert stats["GRAPH_ADD_DEPENDENCIES"] == (2, 0) and stats["GRAPH_EXEC_UPDATE"] == (1, 0)
    # every copy in a graph named offsets in the region: pinned memory, or a pageable
    # copy's room
    assert stats["MEMCPY_HTOD_REGION"] == (0, 3) and stats["MEMCPY_DTOH_REGION"] == (0, 4)
    assert "MEMCPY_HTOD" not in stats and "MEMCPY_DTOH" not in stats


def test_without_a_capture_queries_make_no_round_trip(programs, fake_agent):
    out = _run(programs["static"], fake_agent.address, "nokernel")
    stats = shim_stats(out.stderr)
    # the executor answered the two queries during the first capture, and one for each
    # pageable copy and host function in a capture (it knows which capture a stream is
    # in); the four made with no capture under way were answered in the guest
    assert stats["STREAM_CAPTURE_INFO"] == (7, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_graphs_print_the_same_natively_and_through_the_shim(programs, cudart, gpu_agent):
    from tests.guest.test_shim_gpu import _native_env, _report, _shim_env

    cmd = [str(programs[cudart]), "kernel"]
    native = subprocess.run(cmd, capture_output=True, text=True, env=_native_env(), timeout=600)
    shimmed = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env=dict(_shim_env(gpu_agent), HVGPU_SHIM_STATS="1"))
    _report(f"graphs_{cudart}.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"graphs {cudart}: native:\n{native.stdout}shim:\n{shimmed.stdout}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout


def _graphs_on_a_slice(tmp_path, program, mode, device, gpus, base_env):
    """Runs the program on vm1's 2 GiB slice, with its region device (a file
    standing for QEMU's, found through a sysfs as in a guest); returns its output once
    nothing is charged to the slice any more."""
    from hvgpu.host.names import VgpuKey, region_name
    from tests.guest.fake_sysfs import add_device

    region_dir = tmp_path / "region"
    region_dir.mkdir()
    kw = {"gpus": gpus} if gpus else {}
    agent = RunningAgent(tmp_path, device, slices=True, vms=("vm1",), **kw)
    try:
        agent.agent.config.region_dir = str(region_dir)
        agent.api.attach("vm1", "512M", "100%", region="256M", allow_time_shared=True)
        region = region_dir / region_name(VgpuKey("vm1", 0))
        with open(region, "wb") as f:  # as QEMU makes it for the device
            f.truncate(256 << 20)
        bar = add_device(tmp_path / "sysfs", "0000:00:06.0", size=256 << 20)
        os.unlink(bar.resolve())
        os.link(region, bar.resolve())  # the guest's BAR 2 is the host's file
        env = dict(base_env, HVGPU_AGENT=agent.vm_address("vm1"),
                   LD_LIBRARY_PATH=os.pathsep.join(
                       [str(library().parent), base_env.get("LD_LIBRARY_PATH", "")]),
                   HVGPU_SYSFS_ROOT=str(tmp_path / "sysfs"))
        out = subprocess.run([str(program), mode], capture_output=True, text=True,
                             timeout=600, env=env)
        print(f"graphs on a slice (rc {out.returncode}):\n{out.stdout}{out.stderr[-2000:]}")
        assert out.returncode == 0, out.stdout + out.stderr
        for _ in range(100):  # the executor sees the disconnect a moment after the exit
            (vm1,) = agent.api.status()
            if vm1["mem_used"] == 0:
                break
            time.sleep(0.1)
        assert vm1["mem_used"] == 0, "memory is still charged to the slice"
        return out.stdout
    finally:
        agent.stop()


def test_graphs_on_a_slice_are_charged_to_it_and_given_back(programs, tmp_path):
    """With a quota, each instantiation is uploaded and what it took of device memory is
    charged to the slice (the double charges a fixed size); all is given back at exit."""
    from tests.conftest import FAKE_DEVICE

    out = _graphs_on_a_slice(tmp_path, programs["static"], "nokernel", FAKE_DEVICE, None,
                             dict(os.environ))
    assert out == EXPECTED


@pytest.mark.gpu
def test_graphs_on_a_slice_print_what_they_print_natively(programs, tmp_path):
    from hvgpu.host.inventory import read_gpus
    from tests.guest.test_shim_gpu import _native_env

    out = _graphs_on_a_slice(tmp_path, programs["static"], "kernel", None, read_gpus,
                             _native_env())
    assert out == EXPECTED


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    """cuda/capture_edges.c: captures that end where the program does not end them."""
    exe = tmp_path_factory.mktemp("capture_edges") / "capture_edges"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-o", str(exe),
                    str(HERE / "cuda/capture_edges.c"), f"-L{library().parent}",
                    "-l:libcuda.so.1", "-ldl"], check=True, timeout=120)
    return exe


def _edge(edges, address: str, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HVGPU_AGENT=address, LD_LIBRARY_PATH=str(library().parent),
               HVGPU_SHIM_STATS="1")
    out = subprocess.run([str(edges), mode], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    return out


def test_a_capture_whose_one_way_frame_failed_ends_invalidated(edges, fake_agent):
    out = _edge(edges, fake_agent.address, "failed")
    assert "failed frame: the capture ended, invalidated" in out.stdout


def test_a_copy_refused_in_a_capture_invalidates_it_though_an_earlier_error_is_owed(
        edges, fake_agent):
    out = _edge(edges, fake_agent.address, "refused")
    assert "refused copy: the earlier error reported, the capture invalidated" in out.stdout


def test_destroying_the_capturing_stream_ends_the_capture_in_the_guest_too(edges, fake_agent):
    out = _edge(edges, fake_agent.address, "destroyed")
    assert "destroyed stream: the capture ended" in out.stdout


def test_a_forked_child_has_no_capture_of_its_parent(edges, fake_agent):
    out = _edge(edges, fake_agent.address, "fork")
    assert "child: no capture of its own until it began one" in out.stdout
    assert "parent: ended its capture" in out.stdout


def test_a_capture_the_shim_cannot_keep_leaves_no_graph(edges, fake_agent):
    out = _edge(edges, fake_agent.address, "full")
    assert "full: 256 captures at once, one more refused" in out.stdout
    stats = shim_stats(out.stderr)
    assert stats["STREAM_BEGIN_CAPTURE"] == (257, 0)
    assert stats["STREAM_END_CAPTURE"] == (257, 0)
    assert stats["GRAPH_DESTROY"] == (257, 0)  # the refused one's graph too


def test_an_allocator_may_ask_about_the_capture_on_every_allocation(edges, fake_agent):
    # PyTorch's caching allocator asks cudaStreamGetCaptureInfo(stream, &status, &id) on
    # each allocation during a capture: more such queries than the executor gives node
    # handles to a connection must all be answered.
    out = _edge(edges, fake_agent.address, "queries")
    assert "queries: 70000 during one capture" in out.stdout
    assert shim_stats(out.stderr)["STREAM_CAPTURE_INFO"] == (70000, 0)


def test_a_lying_parameter_layout_is_refused_not_followed(edges, tmp_path):
    # The shim copies each kernel parameter where the agent's layout puts it; an end
    # past 2**32 must not wrap into a small buffer size (a hostile agent overrunning
    # the program's memory).
    agent = RunningAgent(tmp_path, "tests.security.hostile_gpu:LyingLayoutDevice")
    try:
        out = _edge(edges, agent.address, "layout")
    finally:
        agent.stop()
    assert "layout: refused" in out.stdout
