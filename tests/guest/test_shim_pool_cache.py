"""Freed stream-ordered blocks are kept in the guest and reused without a round trip.

tests/guest/cuda/pool_reuse.c runs through the shim against the GPU test double
with HVGPU_SHIM_STATS=1: steps shaped like a framework's (allocate every tensor,
copy, launch, read one back, free every tensor) with PyTorch's release threshold
(UINT64_MAX) and with the default (0), and what a kept block may and may not be.
The program checks the shim's round-trip counter and kept bytes itself; the frame
counts at exit show what was sent.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from hvgpu.guest.shim import library
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.guest.test_shim_cache import added, shim_stats

HERE = os.path.dirname(__file__)
K = 4  # buffer sizes per step; two buffers of each


def build(out) -> str:
    exe = out / "pool_reuse"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-pthread", "-o", str(exe),
                    os.path.join(HERE, "cuda/pool_reuse.c"), f"-L{library().parent}",
                    "-l:libcuda.so.1", "-ldl"], check=True, timeout=120)
    return str(exe)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pool_reuse"))


def run(program, address: str, *args: str):
    env = dict(os.environ, HVGPU_AGENT=address, LD_LIBRARY_PATH=str(library().parent),
               HVGPU_SHIM_STATS="1")
    out = subprocess.run([program, *args], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_steady_steps_allocate_in_the_guest(program, fake_agent):
    one, five = (run(program, fake_agent.address, "steps", n) for n in ("1", "5"))
    assert "steps=5 ok" in five.stdout  # each step's read back saw what it computed
    assert "round trips after the first step: 4\n" in five.stdout  # the read backs only
    first, after = shim_stats(one.stderr), shim_stats(five.stderr)
    sync, oneway = added(first, after)
    assert sync == {"MEMCPY_DTOH": 4}
    assert after["MEM_ALLOC_ASYNC"] == (2 * K, 0)  # the first step's, then reused
    assert "MEM_FREE_ASYNC" not in after  # kept to the end; the executor frees them then
    assert "stream-ordered allocations: 40, 32 of them freed blocks kept in the guest" \
        in five.stderr


def test_with_the_default_threshold_nothing_is_kept(program, fake_agent):
    out = run(program, fake_agent.address, "steps", "5", "default")
    assert "steps=5 ok" in out.stdout
    assert f"round trips after the first step: {4 + 4 * 2 * K}\n" in out.stdout
    stats = shim_stats(out.stderr)
    assert stats["MEM_ALLOC_ASYNC"] == (5 * 2 * K, 0)  # every one a round trip
    assert stats["MEM_FREE_ASYNC"] == (0, 5 * 2 * K)  # and every free sent, as before
    assert "0 of them freed blocks kept" in out.stderr


def test_a_kept_block_is_reused_only_as_the_driver_would(program, fake_agent):
    out = run(program, fake_agent.address, "semantics")
    assert out.stdout.splitlines() == [
        "reused on the stream that freed it",
        "not reused on another stream",
        "data through a reused block reads back",
        "kept blocks are not in use",
        "a kept block is freed memory: refused",
        "not reused from another pool",
        "a lower threshold gives back the oldest",
        "a destroyed stream's blocks are freed",
        "a trim frees what is kept",
        "semantics ok"]
    # Frees sent: a trim of the second pool (1), its lowered threshold (6), its frees past
    # it (6), the destroyed stream (1), the default pool's trim (5), the destroy (2).
    assert shim_stats(out.stderr)["MEM_FREE_ASYNC"] == (0, 1 + 6 + 6 + 1 + 5 + 2)


def test_out_of_memory_frees_what_is_kept_and_tries_again(program, tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        agent.api.attach("vm1", "64M")
        out = run(program, agent.vm_address("vm1"), "oom")
    finally:
        agent.stop()
    assert out.stdout.startswith("oom: ") and "freed for an allocation on another stream" \
        in out.stdout
    kept = int(out.stdout.split()[1])
    stats = shim_stats(out.stderr)
    # The blocks then the one refused; on the other stream, refused once, then the retry.
    assert stats["MEM_ALLOC_ASYNC"] == (kept + 1 + 2, 0)
    assert stats["MEM_FREE_ASYNC"] == (0, kept)  # the kept blocks, freed for the retry


def test_threads_reuse_on_their_own_streams(program, fake_agent):
    out = run(program, fake_agent.address, "threads")
    assert out.stdout == "threads=4 rounds=100 wrong=0\n"
    stats = shim_stats(out.stderr)
    assert stats["MEM_ALLOC_ASYNC"] == (4 * 3, 0)  # each thread's first round only
    assert stats["MEM_FREE_ASYNC"] == (0, 4 * 3)  # each thread's, with its stream


def test_a_forked_child_keeps_nothing_of_the_parents(program, fake_agent):
    out = run(program, fake_agent.address, "fork")
    assert out.stdout == "child: allocated from its own pool\nparent: reused its kept block\n"
