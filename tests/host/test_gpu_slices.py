"""Slices on a real GPU with MPS (``gpu`` marker): quota, the driver's own
enforcement, and what a live resize can change."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hvgpu.host.demo import run_saxpy
from hvgpu.errors import CudaError
from hvgpu.guest import (Connection, Device, LaunchConfig, Program, device_count, launch,
                         runtime)
from hvgpu.virtio import protocol as P
from tests.conftest import RunningAgent

pytestmark = pytest.mark.gpu

G = 1 << 30


@pytest.fixture
def mps_agent(tmp_path):
    from hvgpu.host.inventory import read_gpus

    running = RunningAgent(tmp_path, None, slices=True, vms=("vm1", "vm1#1", "vm2"),
                           gpus=read_gpus, mps=True)
    yield running
    running.stop()


def test_mps_runs_and_gpus_say_what_is_enforced(mps_agent):
    assert mps_agent.agent.mps.running, mps_agent.agent.mps.reason
    (gpu,) = mps_agent.api.gpus()[:1]
    print(f"\n{gpu['name']}: {gpu['enforcement']}")
    assert gpu["enforcement"].startswith("MPS")


def test_a_guest_sees_its_quota_and_cannot_pass_it(mps_agent):
    mps_agent.api.attach("vm1", "2G", "50%")
    with Connection(mps_agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        assert dev.total_memory == 2 * G
        assert dev.mem_info()[1] == 2 * G
        assert run_saxpy(conn, 1 << 20) < 1e-6  # real work on the slice
        held = dev.allocate(int(1.5 * G))
        with pytest.raises(CudaError) as info:
            dev.allocate(G)
        assert info.value.status == P.CUDA_ERROR_OUT_OF_MEMORY
        print(f"\nrefused: {info.value}")
        held.close()


def test_the_driver_itself_enforces_the_slice_memory_limit(mps_agent):
    """An MPS client with a slice's environment, bypassing hvgpu's accounting."""
    code = (
        "from cuda.bindings import driver as cu\n"
        "cu.cuInit(0)\n"
        "_, dev = cu.cuDeviceGet(0)\n"
        "_, ctx = cu.cuDevicePrimaryCtxRetain(dev)\n"
        "cu.cuCtxSetCurrent(ctx)\n"
        "ok, _ = cu.cuMemAlloc(1 << 30)\n"
        "err, _ = cu.cuMemAlloc(3 << 30)\n"
        "print(int(ok), int(err))\n")
    env = dict(os.environ, **mps_agent.agent.mps.client_env(2 * G, 25))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    print(f"\n1 GiB then 3 GiB under a 2 GiB MPS limit: {out.stdout.strip()} {out.stderr[-300:]}")
    assert out.stdout.split() == ["0", str(P.CUDA_ERROR_OUT_OF_MEMORY)]


def test_resize_new_connections_get_new_limits_open_ones_keep_theirs(mps_agent):
    api = mps_agent.api
    api.attach("vm1", "1G", "25%")
    old = Connection(mps_agent.vm_address("vm1"))
    old.call("PING")
    (st,) = api.status()
    first_pid = st["executors"][0]["pid"]
    assert api.resize("vm1", mem="3G", compute="50%")["pending"] is True
    new = Connection(mps_agent.vm_address("vm1"))
    big = Device(connection=new).allocate(int(1.5 * G))  # the new executor's MPS limit is 3 GiB
    (st,) = api.status()
    gens = {e["pid"]: e for e in st["executors"]}
    assert gens[first_pid]["retiring"] and len(gens) == 2
    # The open connection passes the new accounting quota, but its executor's
    # MPS ceiling is still 1 GiB: the driver refuses. This is what cannot change live.
    with pytest.raises(CudaError) as info:
        Device(connection=old).allocate(int(1.2 * G))
    print(f"\nold executor past its MPS ceiling: {info.value}")
    assert info.value.status == P.CUDA_ERROR_OUT_OF_MEMORY
    old.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(api.status()[0]["executors"]) > 1:
        time.sleep(0.1)
    assert [e["pid"] for e in api.status()[0]["executors"]] != [first_pid]
    big.close()
    new.close()


FILL = r"""extern "C" __global__ void fill(float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = 0.5f * i;
}"""
SCALE = r"""extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}"""


def test_a_vm_with_two_vgpus_fills_on_0_copies_to_1_computes_there_and_reads_back(
        mps_agent, monkeypatch):
    import numpy as np

    gpus = mps_agent.api.gpus()
    # On a one-GPU host both vGPUs are named onto GPU 0; placement puts them on two GPUs.
    vgpus = mps_agent.api.attach("vm1", "1G", "50%", gpu=0 if len(gpus) == 1 else None,
                                 count=2)["vgpus"]
    monkeypatch.setattr(runtime, "_defaults", {})
    monkeypatch.setenv("HVGPU_AGENT", ",".join(mps_agent.vm_address(v) for v in ("vm1", "vm1#1")))
    try:
        n = 1 << 22
        d0, d1 = Device(0), Device(1)
        a = d0.allocate(4 * n)
        launch(Program(FILL, connection=d0.conn).compile().get_kernel("fill"),
               LaunchConfig((n + 255) // 256, 256), a, np.int32(n))
        x, y = d1.allocate(4 * n), d1.allocate(4 * n)
        x.copy_from(a)  # device 0 -> device 1
        launch(Program(SCALE, connection=d1.conn).compile().get_kernel("scale"),
               LaunchConfig((n + 255) // 256, 256), x, y, np.int32(n))
        out = np.empty(n, dtype=np.float32)
        y.copy_to(out)
        want = 2.0 * (0.5 * np.arange(n, dtype=np.float32)) + 1.0
        pids = [st["executors"][0]["pid"] for st in mps_agent.api.status() if st["vm"] == "vm1"]
        print(f"\ndevices={device_count()} gpus={[v['gpu_index'] for v in vgpus]} "
              f"executors={len(set(pids))} total_memory={d0.total_memory >> 20},"
              f"{d1.total_memory >> 20} MiB out[1]={out[1]} out[-1]={out[-1]} "
              f"mismatches={int((out != want).sum())}")
        assert device_count() == 2 and len(set(pids)) == 2
        assert d1.total_memory == G
        assert (out == want).all()
    finally:
        for conn in runtime._defaults.values():
            conn.close()


def test_a_second_vgpu_allocates_in_its_own_address_window():
    import ctypes

    from hvgpu.host.executor.address_window import WINDOW_BASE as _WINDOW_BASE
    from hvgpu.host.executor.address_window import WINDOW_SIZE as _WINDOW_SIZE
    from hvgpu.host.executor.cuda_device import CudaDevice

    dev = CudaDevice(0, address_window=1)
    try:
        a, b, c = dev.mem_alloc(100), dev.mem_alloc(5 << 20), dev.mem_alloc(1)
        assert all(_WINDOW_BASE <= p < _WINDOW_BASE + _WINDOW_SIZE for p in (a, b, c))
        dev.mem_free(b)
        assert dev.mem_alloc(4 << 20) == b  # the hole is reused
        out = ctypes.create_string_buffer(100)
        stream = dev.stream(0)
        dev.memset_async(a, 0x5A, 1, 100, stream)
        dev.memcpy_dtoh_async(ctypes.addressof(out), a, 100, stream)
        dev.stream_synchronize(stream)
        print(f"\nwindow allocations: 0x{a:x} 0x{b:x} 0x{c:x}; bytes back: {out.raw[:4].hex()}")
        assert out.raw == b"\x5a" * 100
        for p in (a, b, c):
            dev.mem_free(p)
    finally:
        dev.close()
