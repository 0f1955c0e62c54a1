"""Virtual memory management and memory pools through the libcuda.so.1 shim, against the
agent with the GPU test double: cuda/vmm_pools.c does what PyTorch's expandable segments
and its cudaMallocAsync backend do, tries to go past a slice's quota both ways, and
asks for what the shim refuses."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import pytest

from bench import toolkit
from hvgpu.guest.shim import library

HERE = Path(__file__).parent


def cuda_include() -> Path | None:
    """The toolkit's include directory (cuda.h), if a toolkit is installed."""
    nvcc = toolkit.nvcc()
    roots = [Path(nvcc).resolve().parents[1]] if nvcc else []
    roots += [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))]
    return next((r / "include" for r in roots if (r / "include" / "cuda.h").exists()), None)


def build(out: Path, name: str = "vmm_pools", flags=()) -> Path:
    """cuda/NAME.c, linked against libcuda.so.1 by name: the shim where it is first on
    the library path, else the real driver."""
    include = cuda_include()
    if include is None:
        pytest.skip("cuda.h (CUDA toolkit) is not installed")
    exe = out / name
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", *flags, "-o", str(exe),
                    str(HERE / f"cuda/{name}.c"), f"-I{include}", f"-L{library().parent}",
                    "-l:libcuda.so.1"], check=True, timeout=120)
    return exe


def run(exe: Path, address: str, *args: str):
    env = dict(os.environ, HVGPU_AGENT=address, LD_LIBRARY_PATH=str(library().parent))
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vmm"))


def test_the_shim_resolves_every_vmm_and_pool_entry_point():
    lib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)
    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    for name in ("cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease",
                 "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAccess",
                 "cuMemGetAllocationGranularity", "cuMemGetAllocationPropertiesFromHandle",
                 "cuMemRetainAllocationHandle", "cuMemAllocAsync", "cuMemFreeAsync",
                 "cuMemAllocFromPoolAsync", "cuMemPoolCreate", "cuMemPoolDestroy",
                 "cuMemPoolSetAttribute", "cuMemPoolGetAttribute", "cuMemPoolTrimTo",
                 "cuMemPoolSetAccess", "cuMemPoolGetAccess", "cuDeviceGetDefaultMemPool",
                 "cuDeviceGetMemPool", "cuDeviceSetMemPool", "cuMemGetDefaultMemPool"):
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        assert gpa(name.encode(), pfn, 13000, 0, status) == 0 and status.value == 0, name
        assert pfn.value == ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, name


def test_expandable_segments_and_malloc_async_run_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "vmm 1, pools 1\n"
        "address range: chunk 1, 1 granules\n"
        "pointer range: from granule 0, 64 granules\n"
        "expandable segments: granularity 2097152, 4 chunks mapped, used, unmapped\n"
        "cudaMallocAsync: 32 allocations from the default pool, freed, kept, trimmed; "
        "a pool of its own as the current one\n"
        "vmm_pools: ok\n")
    assert "not implemented" not in out.stderr


def test_neither_cu_mem_create_nor_a_pool_passes_the_slice(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"), "quota")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ("quota: 4 chunks created, 4 allocated from a pool, refused past the "
                          "device's memory; the pool holds what it kept\n")
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0  # the program's exit gave it all back


def test_what_the_shim_refuses_it_says(exe, fake_agent):
    out = run(exe, fake_agent.address, "refusals")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "vmm 1, pools 1, pool handle types 1\nrefusals: as expected\n"
    for said in ("cuMemCreate of exportable memory", "cuMemCreate of host or NUMA memory",
                 "GPUDirect RDMA", "cuMemPoolCreate of exportable memory",
                 "cuMemExportToShareableHandle of other handle types"):
        assert said in out.stderr, said
