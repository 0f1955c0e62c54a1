"""Virtual memory management and memory pools on a GPU: cuda/vmm_pools.c prints the same
natively and through the shim, and on a slice neither cuMemCreate nor a pool goes past
the quota; cuda/pool_reuse.c's steps, freed-block semantics and threads print the same
natively and through the shim, which keeps freed blocks in the guest. HVGPU_SHIM_REPORT=DIR
keeps what each run printed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hvgpu.guest.shim import library
from tests.guest.test_shim_vmm import build

pytestmark = pytest.mark.gpu


def _report(name: str, text: str) -> None:
    out = os.environ.get("HVGPU_SHIM_REPORT")
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, name).write_text(text)


def _native_env() -> dict:
    env = dict(os.environ)
    env.pop("HVGPU_AGENT", None)
    shim = str(library().parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != shim)
    return env


def _shim_env(address: str) -> dict:
    env = _native_env()
    env["HVGPU_AGENT"] = address
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(library().parent), env["LD_LIBRARY_PATH"]])
    return env


def _run(exe, env, *args):
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vmm_gpu"))


def test_vmm_and_pools_print_the_same_through_the_shim(exe, gpu_agent):
    native = _run(exe, _native_env())
    shimmed = _run(exe, _shim_env(gpu_agent.address))
    _report("vmm_pools.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"vmm_pools: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout
    assert "not implemented" not in shimmed.stderr


def test_neither_cu_mem_create_nor_a_pool_passes_a_slice_on_the_gpu(exe, tmp_path):
    from hvgpu.host.inventory import read_gpus
    from tests.conftest import RunningAgent

    agent = RunningAgent(tmp_path, None, slices=True, vms=("vm1",), gpus=read_gpus)
    try:
        agent.api.attach("vm1", "1G", gpu=0)
        out = _run(exe, _shim_env(agent.vm_address("vm1")), "quota")
        deadline = time.monotonic() + 30
        while agent.api.status()[0]["mem_used"] and time.monotonic() < deadline:
            time.sleep(0.1)
        used_after = agent.api.status()[0]["mem_used"]
    finally:
        agent.stop()
    _report("vmm_pools_quota.txt", f"shim (rc {out.returncode}):\n{out.stdout}{out.stderr}")
    print(f"vmm_pools quota: {out.stdout.strip()} | {out.stderr.strip()[-300:]}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("quota: 64 chunks created, ")  # 1 GiB in 16 MiB chunks
    assert out.stdout.endswith("the pool holds what it kept\n")
    assert used_after == 0


@pytest.fixture(scope="module")
def pool_exe(tmp_path_factory):
    from tests.guest.test_shim_pool_cache import build as build_pool_reuse

    return build_pool_reuse(tmp_path_factory.mktemp("pool_reuse_gpu"))


@pytest.mark.parametrize("args", [("steps", "20"), ("semantics",), ("threads",)],
                         ids=lambda a: a[0])
def test_kept_pool_blocks_do_what_the_drivers_pool_does(pool_exe, gpu_agent, args):
    """cuda/pool_reuse.c natively and through the shim (which keeps freed blocks in the
    guest): the same lines, but for what only the shim counts or refuses."""
    native = _run(pool_exe, _native_env(), *args)
    shimmed = _run(pool_exe, _shim_env(gpu_agent.address), *args)
    _report(f"pool_reuse_{args[0]}.txt",
            f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"pool_reuse {' '.join(args)}: native: {native.stdout.strip()} | "
          f"shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    shim_only = ("round trips after the first step", "a kept block is freed memory")
    assert [line for line in shimmed.stdout.splitlines()
            if not line.startswith(shim_only)] == native.stdout.splitlines()
    if args[0] == "steps":  # one round trip a step: its read back
        assert "round trips after the first step: 19\n" in shimmed.stdout
