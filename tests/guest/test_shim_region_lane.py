"""The libcuda.so.1 shim over the region lane, against the GPU test double.

cuda/region_copies.cu (nvcc's static and shared cudart) copies pinned memory
(cudaMallocHost, cudaHostAlloc) and pageable memory of 1000 bytes, 1 MiB and 20 MiB
+ 12345 bytes both ways, synchronously and on a stream, and checks every byte;
cuda/region_driver.c (the driver API) copies past an allocation's end and from four
threads at once. HVGPU_SHIM_STATS shows which frames carried the bytes: offsets
into a region (MEMCPY_HTOD_REGION / MEMCPY_DTOH_REGION) or the socket.

Regions come from a memfd on the agent's unix socket, from the VM's device region
(served here by in-process sessions whose device region is a file, found by the
preloaded test double of the shim's finder, cuda/region_finder.c), or not at all.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from bench import toolkit
from hvgpu.guest.shim import library
from hvgpu.host.executor import regions
from hvgpu.host.executor.session import Session
from hvgpu.virtio import region as R
from hvgpu.virtio.transport import listen
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.fake_gpu import FakeDevice
from tests.guest.test_shim_cache import shim_stats
from tests.guest.test_shim_vmm import cuda_include

HERE = Path(__file__).parent
NVCC = toolkit.nvcc()
MiB = 1 << 20

# Frames cuda/region_copies.cu makes in each mode with a region (see the program). Sizes
# 1000 B, 1 MiB, 20 MiB + 12345 B: a staged copy moves 1, 1 and 3 chunks.
PAGEABLE = {
    # (1 + 3 chunks) x (sync + async round trip), each way; 1000 B on the socket
    "MEMCPY_HTOD_REGION": (0, 8), "MEMCPY_DTOH_REGION": (0, 8),
    "MEMCPY_HTOD": (0, 2), "MEMCPY_DTOH": (2, 0),
    "STREAM_SYNCHRONIZE": (16, 0),  # one fence per staged chunk
}
PINNED = {
    # per size: sync and async round trips, the odd piece, pinned to pageable (4 each
    # way, 12), 64 rows each way of the two 2D copies (128), and the pageable side of
    # "pageable to pinned" / "pinned to pageable" staged at 1 MiB and 20 MiB (1 + 3)
    "MEMCPY_HTOD_REGION": (0, 144), "MEMCPY_DTOH_REGION": (0, 144),
    "MEMCPY_HTOD": (0, 1), "MEMCPY_DTOH": (1, 0),  # the 1000-byte pageable sides
    # the synchronous copies from and to pinned memory wait once each (2 + 2 + 2 per
    # size, less the 2D pair at 1000 B), and the staged chunks fence (8)
    "STREAM_SYNCHRONIZE": (24, 0),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("region")
    built = {}
    for cudart in ("static", "shared"):
        exe = out / f"region_copies_{cudart}"
        subprocess.run([NVCC, "-arch=sm_90", *(["-cudart=shared"] if cudart == "shared" else []),
                        "-o", str(exe), str(HERE / "cuda/region_copies.cu")], check=True,
                       capture_output=True, timeout=300)
        built[cudart] = exe
    include = cuda_include()
    built["driver"] = out / "region_driver"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-pthread", "-o", str(built["driver"]),
                    str(HERE / "cuda/region_driver.c"), f"-I{include}", f"-L{library().parent}",
                    "-l:libcuda.so.1"], check=True, timeout=120)
    built["finder"] = out / "region_finder.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(built["finder"]),
                    str(HERE / "cuda/region_finder.c")], check=True, timeout=120)
    return built


def _run(exe, address: str, *args: str, **extra_env):
    cudart = Path(NVCC).resolve().parents[1] / "lib64"
    env = dict(os.environ, HVGPU_AGENT=address, HVGPU_SHIM_STATS="1", HVGPU_SHIM_TRACE="1",
               LD_LIBRARY_PATH=os.pathsep.join([str(library().parent), str(cudart)]),
               **extra_env)
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    return out


def _region_ops(stats: dict) -> dict:
    return {op: n for op, n in stats.items() if op.startswith("REGION_")}


def _copies(stats: dict) -> dict:
    return {op: n for op, n in stats.items()
            if (op.startswith("MEMCPY_") and op != "MEMCPY_DTOD") or op == "STREAM_SYNCHRONIZE"}


@pytest.mark.parametrize("cudart,threads", [("static", ""), ("shared", ""), ("static", "1"),
                                             ("static", "3")])
def test_pageable_copies_from_1_mib_are_staged_in_8_mib_chunks(programs, cudart, threads,
                                                              fake_agent):
    # HVGPU_COPY_THREADS: how many threads share the guest's side of a chunk (pcopy.c)
    out = _run(programs[cudart], fake_agent.address, "pageable", HVGPU_COPY_THREADS=threads)
    assert "region_copies pageable: sizes=1000,1048576,20983865 wrong=0" in out.stdout
    stats = shim_stats(out.stderr)
    assert _copies(stats) == PAGEABLE
    assert _region_ops(stats) == {"REGION_ATTACH": (1, 0)}  # the slots' memfd, once
    assert "device 0: pinned memory and large copies go through a region " \
           "(memfds)" in out.stderr


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_pinned_memory_is_a_memfd_region_and_its_copies_name_offsets(programs, cudart,
                                                                     fake_agent):
    out = _run(programs[cudart], fake_agent.address, "pinned")
    assert "region_copies pinned: sizes=1000,1048576,20983865 wrong=0" in out.stdout
    stats = shim_stats(out.stderr)
    assert _copies(stats) == PINNED
    # the slots, then a memfd per pinned allocation (two per size), each given back
    assert _region_ops(stats) == {"REGION_ATTACH": (7, 0), "REGION_DETACH": (6, 0)}


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_without_a_region_everything_goes_on_the_socket(programs, cudart, tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, local_region=0)  # no region offered
    try:
        out = _run(programs[cudart], agent.address, "all")
    finally:
        agent.stop()
    assert "region_copies all: sizes=1000,1048576,20983865 wrong=0" in out.stdout
    stats = shim_stats(out.stderr)
    assert not _region_ops(stats)
    assert "MEMCPY_HTOD_REGION" not in stats and "MEMCPY_DTOH_REGION" not in stats
    assert stats["MEMCPY_HTOD"][1] > 0 and stats["MEMCPY_DTOH"][0] > 0
    assert "device 0: the agent offers no region; copies travel on the socket " \
           "and pinned memory is ordinary memory" in out.stderr


def test_a_staged_or_pinned_copy_that_fails_reads_every_reply_and_the_next_one_works(
        programs, fake_agent):
    out = _run(programs["driver"], fake_agent.address, "errors")
    # CUDA_ERROR_INVALID_VALUE, as the executor said it, for each copy past the end
    assert out.stdout == ("region_driver errors: htod=1 htod_pinned=1 dtoh=1 dtoh_pinned=1 "
                          "then wrong=0\n")
    stats = shim_stats(out.stderr)
    # staged: two chunks each way asked before the first fence failed, then one good one;
    # pinned: one frame each way and one good one
    assert stats["MEMCPY_HTOD_REGION"] == (0, 5) and stats["MEMCPY_DTOH_REGION"] == (0, 5)
    assert "MEMCPY_HTOD" not in stats and "MEMCPY_DTOH" not in stats


def test_threads_copying_at_once_keep_the_slots_apart(programs, fake_agent):
    out = _run(programs["driver"], fake_agent.address, "threads")
    assert out.stdout == "region_driver threads: 4 x 3 rounds wrong=0\n"
    stats = shim_stats(out.stderr)
    # 4 threads x 3 rounds x (2 chunks staged + 1 pinned) each way
    assert stats["MEMCPY_HTOD_REGION"] == (0, 36) and stats["MEMCPY_DTOH_REGION"] == (0, 36)


class DeviceRegionHost:
    """Executor sessions in this process whose VM has a device region: a file standing
    for QEMU's /dev/shm/hvgpu-VM, which the preloaded test finder maps as a guest maps
    its ivshmem BAR. The VM's limit leaves room for memfds beside it."""

    def __init__(self, tmp_path: Path, size: int = 128 * MiB):
        self.path = tmp_path / "hvgpu-vm1"
        with open(self.path, "wb") as f:
            f.truncate(size)
        self.executor_regions = regions.ExecutorRegions(
            2 * size, lambda: (os.open(self.path, os.O_RDWR), size), vgpu=0)
        self.device = FakeDevice()
        self.address = f"unix://{tmp_path}/vm1.sock"
        self.listener = listen(self.address)
        self.sessions: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            session = Session(conn, self.device, peer=peer, owns_device=False,
                              executor_regions=self.executor_regions)
            t = threading.Thread(target=session.serve, daemon=True)
            t.start()
            self.sessions.append(t)

    def sessions_ended(self) -> bool:
        for t in self.sessions:
            t.join(60)
        return not any(t.is_alive() for t in self.sessions)

    def close(self):
        self.listener.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.thread.join(30)
        self.listener.close()
        self.sessions_ended()
        self.executor_regions.close()


@pytest.fixture
def vm_host(tmp_path):
    host = DeviceRegionHost(tmp_path)
    yield host
    host.close()


def test_the_vms_device_region_gives_pinned_memory_and_the_slots(programs, vm_host, tmp_path):
    calls = tmp_path / "finder-calls"
    out = _run(programs["static"], vm_host.address, "all", LD_PRELOAD=str(programs["finder"]),
               HVGPU_TEST_REGION=str(vm_host.path), HVGPU_TEST_REGION_CALLS=str(calls))
    assert "region_copies all: sizes=1000,1048576,20983865 wrong=0" in out.stdout
    assert calls.read_text() == "device 0\n"  # the finder was asked once, for vGPU 0
    stats = shim_stats(out.stderr)
    # one attach; the slots and each pinned allocation are room in it
    assert _region_ops(stats) == {"REGION_ATTACH": (1, 0), "REGION_ALLOC": (7, 0),
                                  "REGION_FREE": (6, 0)}
    assert stats["MEMCPY_HTOD_REGION"] == (0, 144 + 8)
    assert stats["MEMCPY_DTOH_REGION"] == (0, 144 + 8)
    assert "device 0: pinned memory and large copies go through a region " \
           "(the VM's device)" \
        in out.stderr
    # every room came back once the connection closed; the region stays mapped
    assert vm_host.sessions_ended()
    assert vm_host.executor_regions.device_region.rooms.free == [(R.DATA_OFFSET, 128 * MiB)]


def test_a_device_region_the_guest_cannot_find_is_detached_for_a_memfd(programs, vm_host,
                                                                        tmp_path):
    other = tmp_path / "another-region"
    with open(other, "wb") as f:  # a device whose header carries no token of ours
        f.truncate(4 * MiB)
    out = _run(programs["static"], vm_host.address, "pinned", LD_PRELOAD=str(programs["finder"]),
               HVGPU_TEST_REGION=str(other))
    assert "region_copies pinned: sizes=1000,1048576,20983865 wrong=0" in out.stdout
    stats = shim_stats(out.stderr)
    assert _copies(stats) == PINNED
    # the device region, detached; then the memfds as on any unix socket
    assert _region_ops(stats) == {"REGION_ATTACH": (8, 0), "REGION_DETACH": (7, 0)}
    assert "test finder: the region's header carries another token" in out.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("program", ["static all", "shared all", "static pageable",
                                     "driver errors", "driver threads"])
def test_the_copies_print_the_same_natively_and_through_the_lane(programs, program, gpu_agent):
    """On the GPU machine: identical output, and the shim's bytes went through the
    region (a memfd: the agent's local connections get one)."""
    from tests.guest.test_shim_gpu import _native_env, _report, _shim_env

    name, mode = program.split()
    cmd = [str(programs[name]), mode]
    native = subprocess.run(cmd, capture_output=True, text=True, env=_native_env(), timeout=600)
    shimmed = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env=dict(_shim_env(gpu_agent), HVGPU_SHIM_STATS="1"))
    _report(f"region_{name}_{mode}.txt", f"native (rc {native.returncode}):\n{native.stdout}"
            f"{native.stderr}\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"region {program}: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
    stats = shim_stats(shimmed.stderr)
    assert stats["MEMCPY_HTOD_REGION"][1] > 0 and stats["MEMCPY_DTOH_REGION"][1] > 0
