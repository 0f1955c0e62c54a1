"""The shim keeps what a function's queries answer, and says what it sent.

tests/guest/cuda/step_cache.c (driver API) and func_attributes.cu (the CUDA
runtime, as nvcc links it) run through the shim against the GPU test double
with HVGPU_SHIM_STATS=1; its frame counts at exit show which calls made a
round trip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hvgpu.guest.shim import library
from tests.conftest import FAKE_DEVICE, RunningAgent

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    exe = tmp_path_factory.mktemp("step_cache") / "step_cache"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), os.path.join(HERE, "cuda/step_cache.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    return exe


def _run(program, address: str, *args: str, stats: bool = True, ld_path: str | None = None):
    env = dict(os.environ, HVGPU_AGENT=address,
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(library().parent), ld_path])))
    env.pop("HVGPU_SHIM_STATS", None)
    if stats:
        env["HVGPU_SHIM_STATS"] = "1"
    out = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def shim_stats(stderr: str) -> dict[str, tuple[int, int]]:
    """op name -> (sync, one-way) from the table HVGPU_SHIM_STATS prints at exit."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "(HVGPU_SHIM_STATS)" in line)
    assert lines[start + 1].split()[1:] == ["op", "sync", "one-way"]
    table = {}
    for line in lines[start + 2:]:
        name, sync, oneway = line.removeprefix("hvgpu:").strip().rsplit(None, 2)
        table[name] = (int(sync), int(oneway))
        if name == "total":
            break
    total = table.pop("total")
    assert total == tuple(map(sum, zip(*table.values())))
    return table


def added(first: dict, after: dict) -> tuple[dict, dict]:
    """Per op, the round trips and the one-way frames ``after`` has beyond ``first``."""
    sync = {op: n - first.get(op, (0, 0))[0] for op, (n, _) in after.items()}
    oneway = {op: n - first.get(op, (0, 0))[1] for op, (_, n) in after.items()}
    return ({op: n for op, n in sync.items() if n}, {op: n for op, n in oneway.items() if n})


def test_steady_steps_make_no_round_trip_but_their_own_sync(program, fake_agent):
    first = shim_stats(_run(program, fake_agent.address, "steps", "1").stderr)
    five = _run(program, fake_agent.address, "steps", "5")
    assert "steps=5 ok" in five.stdout  # the launches computed what they should
    after = shim_stats(five.stderr)
    sync, oneway = added(first, after)
    assert sync == {"CTX_SYNCHRONIZE": 4}
    assert oneway == {
        "LAUNCH_KERNEL": 8, "LAUNCH_KERNEL_EX": 4, "EVENT_RECORD": 4, "STREAM_WAIT_EVENT": 4,
        "MEMSET": 4}
    # The first step: each function's attributes in one reply, each set one-way once.
    assert after["FUNC_GET_ATTRIBUTES"] == (3, 0) and "FUNC_GET_ATTRIBUTE" not in after
    assert after["FUNC_SET_ATTRIBUTE"] == (0, 1) and after["FUNC_SET_CACHE_CONFIG"] == (0, 1)
    assert after["FUNC_GET_PARAM_INFO"] == (2, 0)  # saxpy's and noop's, once


def test_the_shims_round_trip_counter_sees_only_the_steps_own_syncs(program, fake_agent):
    # Counted without HVGPU_SHIM_STATS: what bench/frameworks.py reports per step.
    out = _run(program, fake_agent.address, "steps", "5", stats=False)
    assert "round trips after the first step: 4" in out.stdout
    assert "HVGPU_SHIM_STATS" not in out.stderr


def test_a_set_reads_back_changes_occupancy_and_its_refusal_surfaces_at_the_next_sync(
        program, fake_agent):
    out = _run(program, fake_agent.address, "semantics")
    assert out.stdout.splitlines() == [
        "blocks before=14 after carveout=7 after cache config=7",
        "next sync: 1, the one after: 0",  # CUDA_ERROR_INVALID_VALUE, reported once
        "next get: 800, then cluster width=2",  # CUDA_ERROR_NOT_PERMITTED: set when compiled
        "semantics ok"]
    stats = shim_stats(out.stderr)
    assert stats["OCCUPANCY_MAX_BLOCKS"] == (3, 0)  # asked again after each set
    assert stats["FUNC_SET_ATTRIBUTE"] == (0, 4)  # refused at once: not sent
    assert stats["FUNC_SET_CACHE_CONFIG"] == (0, 1)


def test_a_library_kernel_has_its_own_attributes_on_each_vgpu(program, tmp_path):
    from tests.host.test_slices_served import two_fake_gpus

    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm1#1"),
                         gpus=two_fake_gpus)
    try:
        agent.api.attach("vm1", "64M", count=2)
        both = ",".join(agent.vm_address(v) for v in ("vm1", "vm1#1"))
        out = _run(program, both, "vgpus")
    finally:
        agent.stop()
    assert out.stdout == "vgpus ok\n"
    stats = shim_stats(out.stderr)
    assert stats["FUNC_GET_ATTRIBUTES"] == (2, 0)  # once on each vGPU
    assert stats["MODULE_GET_FUNCTION"] == (2, 0)  # the second cuLibraryGetKernel asked nothing
    assert stats["FUNC_SET_ATTRIBUTE"] == (0, 2)
    assert stats["FUNC_GET_PARAM_INFO"] == (1, 0)  # the layout: once per kernel


def test_threads_asking_at_once_get_the_right_answers_fetched_once(program, fake_agent):
    out = _run(program, fake_agent.address, "threads")
    assert out.stdout == "threads=8 rounds=200 wrong=0\n"
    stats = shim_stats(out.stderr)
    assert stats["FUNC_GET_ATTRIBUTES"] == (3, 0)
    assert stats["OCCUPANCY_MAX_BLOCKS"][0] <= 3 * 32  # each (kernel, block size) once


def test_without_the_variable_nothing_is_printed(program, fake_agent):
    out = _run(program, fake_agent.address, "steps", "1", stats=False)
    assert "HVGPU_SHIM_STATS" not in out.stderr


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_the_cuda_runtimes_steps_make_no_round_trip_but_their_own_sync(cudart, tmp_path,
                                                                        monkeypatch):
    exe = tmp_path / "func_attributes"
    subprocess.run([NVCC, "-arch=sm_90", *(["-cudart=shared"] if cudart == "shared" else []),
                    "-o", str(exe), os.path.join(HERE, "cuda/func_attributes.cu")], check=True,
                   capture_output=True, timeout=300)
    monkeypatch.setenv("HVGPU_FAKE_ANY_KERNEL", "1")  # the executor's kernels do nothing
    monkeypatch.setenv("HVGPU_FAKE_H200", "1")  # an H200's shared memory limits
    cudart_dir = str(Path(NVCC).resolve().parents[1] / "lib64")  # for -cudart=shared
    agent = RunningAgent(tmp_path, FAKE_DEVICE)
    try:
        outs = [_run(exe, agent.address, steps, ld_path=cudart_dir) for steps in ("1", "5")]
    finally:
        agent.stop()
    assert "past the opt-in limit: invalid argument" in outs[0].stdout
    assert "staged after the sets: no error static=0 max_threads=1024 max_dynamic=102400 " \
           "carveout=50 cluster_must=0" in outs[0].stdout
    assert "blocks per SM: 2, at a 50% carveout: 1" in outs[0].stdout
    sync, oneway = added(*(shim_stats(out.stderr) for out in outs))
    assert sync == {"STREAM_SYNCHRONIZE": 4}
    assert oneway == {"LAUNCH_KERNEL": 8, "MEMSET": 4, "EVENT_RECORD": 4, "STREAM_WAIT_EVENT": 4}
