"""The libcuda.so.1 shim on a machine without a GPU: built, exported, honest.

Compiled CUDA programs (nvcc's default static cudart and -cudart=shared) run
through the shim against the agent with the GPU test double, whose `saxpy`
kernel the program's own kernel of that name stands for.
"""

from __future__ import annotations

import ctypes
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvgpu.guest.shim import library

HERE = Path(__file__).parent
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)


def test_the_shim_is_built_with_every_entry_point_it_lists(lib):
    implemented = [line.split(",")[2].strip(" )\n")
                   for line in (HERE.parents[1] / "hvgpu/guest/shim/implemented.def").open()
                   if line.startswith("E(")]
    assert len(implemented) > 100
    for symbol in implemented + ["cuArrayCreate_v2", "cuGraphLaunch", "cuGetExportTable",
                                 "cuStreamWaitValue32", "cuLinkComplete", "cuMemcpyHtoD"]:
        assert hasattr(lib, symbol), symbol


# Exported under their first names for programs linked against old cuda.h; the runtime
# asks cuGetProcAddress for the later ones (_v2), which implemented.def lists.
_LEGACY = {"cuCtxDestroy", "cuCtxPopCurrent", "cuCtxPushCurrent", "cuDevicePrimaryCtxRelease",
           "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxSetFlags", "cuEventDestroy",
           "cuStreamDestroy", "cuMemHostRegister"}
# Defined to refuse with the reason a vGPU cannot serve them (they check their arguments
# first, as the driver does); not listed, so `hvgpu-guest coverage` counts them missing.
_REFUSED = {"cuLaunchCooperativeKernelMultiDevice", "cuLibraryGetManaged",
            "cuLibraryGetUnifiedFunction", "cuMemGetHandleForAddressRange"}


def test_every_entry_point_the_shim_defines_is_found_by_cu_get_proc_address():
    """The runtime finds the driver through cuGetProcAddress: a function the shim defines
    but implemented.def does not list is, to a CUDA program, not there."""
    defined = set()
    for source in (HERE.parents[1] / "hvgpu/guest/shim").glob("*.c"):
        defined |= set(re.findall(r"HV_EXPORT\s+\w+\s+\**(cu\w+)\s*\(", source.read_text()))
    listed = set(re.findall(r"E\(\w+, \d+, (\w+)\)",
                            (HERE.parents[1] / "hvgpu/guest/shim/implemented.def").read_text()))
    assert sorted(defined - listed - _LEGACY - _REFUSED) == []


def test_get_proc_address_resolves_versions_and_says_what_is_missing(lib):
    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    pfn, status = ctypes.c_void_p(), ctypes.c_int()
    assert gpa(b"cuMemAlloc", pfn, 12000, 0, status) == 0 and status.value == 0
    assert pfn.value == ctypes.cast(lib.cuMemAlloc_v2, ctypes.c_void_p).value
    assert gpa(b"cuCtxSynchronize", pfn, 13000, 0, status) == 0
    assert pfn.value == ctypes.cast(lib.cuCtxSynchronize_v2, ctypes.c_void_p).value
    assert gpa(b"cuCtxSynchronize", pfn, 12000, 0, status) == 0
    assert pfn.value == ctypes.cast(lib.cuCtxSynchronize, ctypes.c_void_p).value
    assert gpa(b"cuNoSuchThing", pfn, 13000, 0, status) == 500 and status.value == 1
    # Known but not built: a function that returns CUDA_ERROR_NOT_SUPPORTED.
    assert gpa(b"cuTexRefCreate", pfn, 13000, 0, status) == 0
    assert ctypes.CFUNCTYPE(ctypes.c_int)(pfn.value)() == 801


def test_error_names_come_from_the_protocol_table(lib):
    out = ctypes.c_char_p()
    assert lib.cuGetErrorName(801, ctypes.byref(out)) == 0
    assert out.value == b"CUDA_ERROR_NOT_SUPPORTED"
    assert lib.cuGetErrorString(2, ctypes.byref(out)) == 0 and b"memory" in out.value


def test_integrity_digest_is_rfc_1319_md2(lib):
    out = ctypes.create_string_buffer(16)
    for message, digest in [(b"", "8350e5a3e24c153df2275c9f80692773"),
                            (b"abc", "da853b0d3f88d99b30283a69e6ded6bb"),
                            (b"12345678901234567890123456789012345678901234567890123456789012345"
                             b"678901234567890", "d5976f79d83d3a0dc9806c3c66f3efd8")]:
        lib.hvgpu_shim_md2(message, len(message), out)
        assert out.raw.hex() == digest


def _guest(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "hvgpu.guest.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, **kw)


def test_coverage_lists_what_is_implemented():
    out = _guest("coverage")
    assert out.returncode == 0
    lines = {line.split()[1]: line.split()[0] for line in out.stdout.splitlines()}
    assert lines["cuLaunchKernel"] == "yes" and lines["cuTexRefCreate"] == "no" and lines["cuArrayCreate"] == "yes"
    assert "driver entry points" in out.stderr


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("cuda")
    built = {}
    for name, flags in (("static", []), ("shared", ["-cudart=shared"])):
        exe = out / f"saxpy_{name}"
        subprocess.run([NVCC, "-arch=sm_90", *flags, "-o", str(exe), str(HERE / "cuda/saxpy.cu")],
                       check=True, capture_output=True, timeout=300)
        built[name] = exe
    return built


def _env(address):
    env = dict(os.environ, HVGPU_AGENT=address)
    cudart = Path(NVCC).resolve().parents[1] / "lib64"  # the shared cudart, for -cudart=shared
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(cudart), env.get("LD_LIBRARY_PATH", "")])
    return env


@needs_nvcc
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_a_compiled_program_without_an_agent_gets_a_cuda_error_not_a_signal(programs, cudart,
                                                                              tmp_path):
    out = _guest("run", "--", str(programs[cudart]), env=_env(f"unix://{tmp_path}/none.sock"))
    assert out.returncode == 1, out  # the program's own error exit
    assert "cudaMalloc: no CUDA-capable device is detected" in out.stdout
    assert "cannot reach the hvgpu agent" in out.stderr


@needs_nvcc
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_a_compiled_program_runs_through_the_shim(programs, cudart, fake_agent):
    out = _guest("run", "--", str(programs[cudart]), env=_env(fake_agent.address))
    assert out.returncode == 0, out.stderr
    assert "copy back: no error" in out.stdout
    got, want = out.stdout.split("sum ")[1].split(" (expect ")
    assert got == want.rstrip(")\n")
    assert "not implemented" not in out.stderr  # every call the runtime made is built


def test_an_agent_that_goes_away_is_a_cuda_error_for_the_program(fake_agent, tmp_path):
    exe = tmp_path / "agent_loss"
    subprocess.run(["gcc", "-o", str(exe), str(HERE / "cuda/agent_loss.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    env = dict(os.environ, HVGPU_AGENT=fake_agent.address,
               LD_LIBRARY_PATH=str(library().parent))
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline() == "first: 0\n"
    mapped = {line.split()[-1] for line in open(f"/proc/{proc.pid}/maps") if "libcuda" in line}
    assert mapped == {str(library())}  # no other driver library in the process
    fake_agent.stop()
    out, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0, err  # no signal: the program saw an error and went on
    assert out == "second: 46 CUDA_ERROR_DEVICE_UNAVAILABLE\n"
    assert "lost the connection to the hvgpu agent" in err


def test_ldconfig_prints_the_snippet_that_makes_the_shim_the_default():
    out = _guest("ldconfig")
    assert out.returncode == 0
    assert "/etc/ld.so.conf.d/00-hvgpu.conf" in out.stdout
    assert str(library().parent) in out.stdout.splitlines()


def test_run_without_a_command_says_how():
    out = _guest("run")
    assert out.returncode == 2 and "hvgpu-guest run -- python3 train.py" in out.stderr


def test_threads_of_one_program_share_the_connection_safely(fake_agent, tmp_path):
    exe = tmp_path / "threads"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), str(HERE / "cuda/threads.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HVGPU_AGENT=fake_agent.address,
                                  LD_LIBRARY_PATH=str(library().parent)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "threads=4 rounds=50 wrong=0\n"


@needs_nvcc
@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_one_program_uses_two_vgpus_switching_with_cudaSetDevice(cudart, tmp_path):
    from tests.conftest import FAKE_DEVICE, RunningAgent
    from tests.host.test_slices_served import two_fake_gpus

    exe = tmp_path / "multi_device"
    subprocess.run([NVCC, "-arch=sm_90", *(["-cudart=shared"] if cudart == "shared" else []),
                    "-o", str(exe), str(HERE / "cuda/multi_device.cu")], check=True,
                   capture_output=True, timeout=300)
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm1#1"),
                         gpus=two_fake_gpus)
    try:
        agent.api.attach("vm1", "64M", count=2)
        both = ",".join(agent.vm_address(v) for v in ("vm1", "vm1#1"))
        out = _guest("run", "--", str(exe), env=_env(both))
        status = {s["device"]: s for s in agent.api.status()}
    finally:
        agent.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "multi_device: devices=2 current=1 y0_on=0 out[1]=6.0 out[last]=393210.0 " \
           "mismatches=0 uva_mismatches=0" in out.stdout
    assert "is an address on device" not in out.stderr  # each vGPU has its own addresses
    assert "not implemented" not in out.stderr
    assert all(s["executors"] for s in status.values())  # each vGPU's own executor served it


@needs_nvcc
def test_a_vgpu_the_program_cannot_reach_leaves_it_the_others(programs, tmp_path):
    from tests.conftest import FAKE_DEVICE, RunningAgent
    from tests.host.test_slices_served import two_fake_gpus

    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",), gpus=two_fake_gpus)
    try:
        agent.api.attach("vm1", "64M", count=2)  # device 1 has no socket bound here
        out = _guest("run", "--", str(programs["static"]), env=_env(agent.vm_address("vm1")))
    finally:
        agent.stop()
    assert out.returncode == 0, out.stderr
    assert "copy back: no error" in out.stdout
    assert "device 1 of this VM's 2 vGPUs cannot be reached" in out.stderr


@pytest.mark.parametrize("trace", ["1", None])
def test_a_crash_under_trace_names_the_address_and_still_kills_the_program(tmp_path, trace):
    exe = tmp_path / "crash_report"
    subprocess.run(["cc", "-o", str(exe), str(HERE / "cuda" / "crash_report.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(library().parent),
               HVGPU_AGENT=f"unix://{tmp_path / 'nobody.sock'}")
    env.pop("HVGPU_SHIM_TRACE", None)
    if trace:
        env["HVGPU_SHIM_TRACE"] = trace
    p = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -11  # the program dies as it would have without the shim's handler
    if trace:
        assert "fatal signal 11 (Segmentation fault) at address 0x18" in p.stderr
        assert "libcuda.so.1" in p.stderr or "crash_report" in p.stderr  # the native stack
    else:
        assert "fatal signal" not in p.stderr


def test_the_cluster_table_answers_what_it_carries_and_refuses_the_rest(lib):
    """cuBLASLt calls into this table without checking it was given one: every slot is
    a real function, and the GPU-layout slot refuses instead of inventing a layout."""
    table = ctypes.c_void_p()
    uuid = (ctypes.c_ubyte * 16)(*bytes.fromhex("1734dc26800d47458726c0f1e7dd8bca"))
    assert lib.cuGetExportTable(ctypes.byref(table), uuid) == 0 and table.value
    slots = (ctypes.c_void_p * 17).from_address(table.value)
    assert slots[0] == 17 * 8 and all(slots[1:])  # its size in bytes, as the driver's
    vgpc, mtpc = ctypes.c_void_p(1), ctypes.c_void_p(1)
    layout = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(slots[4])
    assert layout(ctypes.byref(vgpc), ctypes.byref(mtpc)) == 801  # CUDA_ERROR_NOT_SUPPORTED
    assert vgpc.value is None and mtpc.value is None
    flag = ctypes.c_int(7)
    absent = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(slots[14])
    assert absent(ctypes.byref(flag)) == 0 and flag.value == 0


@needs_nvcc
def test_the_runtime_makes_the_primary_context_current_on_a_new_thread(fake_agent, tmp_path):
    exe = tmp_path / "thread_context"
    subprocess.run([NVCC, "-arch=sm_90", "-o", str(exe), str(HERE / "cuda/thread_context.cu"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True, capture_output=True,
                   timeout=300)
    out = _guest("run", "--", str(exe), env=_env(fake_agent.address))
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "after the primary context" in out.stdout
