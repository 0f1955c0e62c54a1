"""CUDA IPC between two processes of one VM through the libcuda.so.1 shim: cuda/ipc_fork.c
forks, the parent exports memory and an interprocess event, the child opens both, waits
for the event and writes the memory with a kernel, and the parent reads what it wrote.
cuda/vmm_share.c does the same with VMM memory exported as a POSIX file descriptor, which
the parent sends to the child over a unix socket (SCM_RIGHTS).
Against the double (both processes are connections of the VM's one executor), and, with
-m gpu, natively and through the shim on a GPU, line for line. HVGPU_SHIM_REPORT=DIR
keeps what each GPU run printed."""

from __future__ import annotations

import ctypes
import time

import pytest

from hvgpu.guest.shim import library
from tests.guest.test_shim_vmm import build, run
from tests.guest.test_vmm_gpu import _native_env, _report, _run, _shim_env

EXPECTED = (
    "parent: IPC events 1; opening its own memory handle 201, its own event handle 201, "
    "exporting a timed event 400\n"
    "child: opened 16384 bytes, the same pointer twice 1, its base 1\n"
    "child: cuMemFree of opened memory 1, closed 0 then 0, closed again 1, a zeroed handle 1\n"
    "parent: the child wrote 4096 of 4096 values; it exited 0\n")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("ipc"), "ipc_fork")


VMM_EXPECTED = (
    "parent: POSIX fd handles 1; exported a descriptor 1\n"
    "child: imported 2097152 bytes, mapped them and wrote them with a kernel\n"
    "parent: the child wrote 4096 of 4096 values; it exited 0\n")


@pytest.fixture(scope="module")
def vmm_exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vmm_share"), "vmm_share")


def test_the_shim_resolves_every_ipc_entry_point():
    lib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)
    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    for name, version, symbol in (
            ("cuIpcGetMemHandle", 13000, "cuIpcGetMemHandle"),
            ("cuIpcOpenMemHandle", 13000, "cuIpcOpenMemHandle_v2"),
            ("cuIpcOpenMemHandle", 10000, "cuIpcOpenMemHandle"),
            ("cuIpcCloseMemHandle", 13000, "cuIpcCloseMemHandle"),
            ("cuIpcGetEventHandle", 13000, "cuIpcGetEventHandle"),
            ("cuIpcOpenEventHandle", 13000, "cuIpcOpenEventHandle"),
            ("cuMemExportToShareableHandle", 13000, "cuMemExportToShareableHandle"),
            ("cuMemImportFromShareableHandle", 13000, "cuMemImportFromShareableHandle")):
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        assert gpa(name.encode(), pfn, version, 0, status) == 0 and status.value == 0, name
        assert pfn.value == ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, name


def test_two_processes_of_a_vm_share_memory_and_an_event(exe, sliced):
    out = run(exe, sliced.vm_address("vm1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == EXPECTED
    assert "not implemented" not in out.stderr
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0  # both exits gave everything back


def test_two_processes_of_a_vm_share_vmm_memory_through_a_descriptor(vmm_exe, sliced):
    out = run(vmm_exe, sliced.vm_address("vm1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == VMM_EXPECTED
    assert "not implemented" not in out.stderr
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0


def _native_and_shim(exe, tmp_path, name):
    from hvgpu.host.inventory import read_gpus
    from tests.conftest import RunningAgent

    native = _run(exe, _native_env())
    agent = RunningAgent(tmp_path, None, slices=True, vms=("vm1",), gpus=read_gpus)
    try:
        agent.api.attach("vm1", "1G", gpu=0)
        shimmed = _run(exe, _shim_env(agent.vm_address("vm1")))
    finally:
        agent.stop()
    _report(f"{name}.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"{name}: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout


@pytest.mark.gpu
def test_vmm_memory_shared_through_a_descriptor_prints_the_same_natively_and_through_the_shim(
        vmm_exe, tmp_path):
    _native_and_shim(vmm_exe, tmp_path, "vmm_share")


@pytest.mark.gpu
def test_ipc_between_a_parent_and_its_child_prints_the_same_natively_and_through_the_shim(
        exe, tmp_path):
    _native_and_shim(exe, tmp_path, "ipc_fork")


POOL_EXPECTED = (
    "parent: pools 1, POSIX fd pool handles 1\n"
    "parent: exported a descriptor 1; exporting the default pool's allocation 1\n"
    "child 0: imported the pool (access 3) and 4096 floats, wrote its half with a kernel, "
    "freed them; allocating from the imported pool 1\n"
    "child 1: imported the pool (access 3) and 4096 floats, wrote its half with a kernel, "
    "freed them; allocating from the imported pool 1\n"
    "parent: the children wrote 4096 of 4096 values; 2 of 2 exited 0; exporting the freed "
    "allocation 1\n")


@pytest.fixture(scope="module")
def pool_exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pool_share"), "pool_share")


def test_the_shim_resolves_every_pool_ipc_entry_point():
    lib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)
    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    for name in ("cuMemPoolExportToShareableHandle", "cuMemPoolImportFromShareableHandle",
                 "cuMemPoolExportPointer", "cuMemPoolImportPointer"):
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        assert gpa(name.encode(), pfn, 13000, 0, status) == 0 and status.value == 0, name
        assert pfn.value == ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, name


def test_processes_of_a_vm_share_a_pool_and_its_allocation_through_a_descriptor(
        pool_exe, sliced):
    out = run(pool_exe, sliced.vm_address("vm1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == POOL_EXPECTED
    assert "not implemented" not in out.stderr
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0  # every process gave everything back


@pytest.mark.gpu
def test_a_pool_shared_through_a_descriptor_prints_the_same_natively_and_through_the_shim(
        pool_exe, tmp_path):
    _native_and_shim(pool_exe, tmp_path, "pool_share")


def test_importers_that_exit_holding_their_imports_leave_nothing_held(pool_exe, sliced):
    out = run(pool_exe, sliced.vm_address("vm1"), "abandon")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[2:4] == [
        f"child {i}: wrote its half and exits holding its imports" for i in range(2)]
    assert out.stdout.splitlines()[-1].startswith("parent: the children wrote 4096 of 4096")
    deadline = time.monotonic() + 20
    while sliced.api.status()[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sliced.api.status()[0]["mem_used"] == 0
