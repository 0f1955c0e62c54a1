"""The guest's libnvidia-ml.so.1 through pynvml, against the agent with the GPU test double.

pynvml loads "libnvidia-ml.so.1" with ctypes, so each check runs pynvml in a
subprocess whose LD_LIBRARY_PATH starts with the shim's directory, as
`hvgpu-guest run` sets it. The vGPU is vm1's 256 MiB slice of the double's GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

from hvgpu.guest.client import Connection
from hvgpu.guest.shim import NVML_LIBRARY
from tests.conftest import FAKE_DEVICE, REPO, RunningAgent

M = 1 << 20
pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the test extra) is not installed")


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    running.api.attach("vm1", "256M", "25%", allow_time_shared=True)
    yield running
    running.stop()


def _pynvml(address: str, code: str, *, run: bool = False) -> dict:
    """What ``code`` (with pynvml as N, results put in dict ``out``) saw, as JSON."""
    program = ("import json, pynvml as N\nout = {}\n" + textwrap.dedent(code)
               + "\nprint(json.dumps(out))")
    env = dict(os.environ, HVGPU_AGENT=address,
               PYTHONPATH=os.pathsep.join([str(REPO), os.path.dirname(pynvml.__file__)]))
    if run:  # as a user starts it
        cmd = [sys.executable, "-m", "hvgpu.guest.cli", "run", "--", sys.executable, "-c", program]
    else:
        env["LD_LIBRARY_PATH"] = str(NVML_LIBRARY.parent)
        cmd = [sys.executable, "-c", program]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_library_exports_every_nvml_entry_point():
    lib = ctypes.CDLL(str(NVML_LIBRARY), mode=ctypes.RTLD_LOCAL)
    names = [line[len("NVML_API("):-1] for line in
             (REPO / "hvgpu/guest/nvml/nvml_api.def").read_text().splitlines()
             if line.startswith("NVML_API(")]
    assert len(names) > 300
    for name in names + ["nvmlErrorString"]:
        assert hasattr(lib, name), name
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(3) == b"Not Supported"
    assert lib.nvmlDeviceGetTemperature(None, 0, None) == 3  # a fallback: NOT_SUPPORTED


def test_pynvml_sees_the_slice_as_its_gpu(agent):
    with Connection(agent.vm_address("vm1")) as other_process:  # another program of vm1
        other_process.call("MEM_ALLOC", 64 * M)
        out = _pynvml(agent.vm_address("vm1"), """
            N.nvmlInit()
            h = N.nvmlDeviceGetHandleByIndex(0)
            out["count"] = N.nvmlDeviceGetCount()
            out["name"] = N.nvmlDeviceGetName(h)
            out["uuid"] = N.nvmlDeviceGetUUID(h)
            m = N.nvmlDeviceGetMemoryInfo(h)
            out["memory"] = [m.total, m.used, m.free]
            m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            out["memory_v2"] = [m.total, m.used, m.free]
            out["processes"] = [[p.pid, p.usedGpuMemory]
                                for p in N.nvmlDeviceGetComputeRunningProcesses(h)]
            out["graphics"] = N.nvmlDeviceGetGraphicsRunningProcesses(h)
            out["by_uuid"] = N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(out["uuid"]))
            bus = N.nvmlDeviceGetPciInfo(h).busId
            out["bus"] = bus
            out["by_bus"] = N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(bus))
            out["cc"] = list(N.nvmlDeviceGetCudaComputeCapability(h))
            out["cuda"] = N.nvmlSystemGetCudaDriverVersion()
            for name, call in [("temperature", lambda: N.nvmlDeviceGetTemperature(h, 0)),
                               ("power", lambda: N.nvmlDeviceGetPowerUsage(h)),
                               ("utilization", lambda: N.nvmlDeviceGetUtilizationRates(h)),
                               ("driver", N.nvmlSystemGetDriverVersion)]:
                try:
                    call()
                    out[name] = "answered"
                except N.NVMLError as e:
                    out[name] = e.value
            N.nvmlShutdown()
        """)
    assert out["count"] == 1 and out["name"] == "hvgpu fake GPU"
    assert out["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert out["memory"] == [256 * M, 64 * M, 192 * M] == out["memory_v2"]
    assert out["processes"] == [[os.getpid(), 64 * M]]  # the NVML reader itself is none
    assert out["graphics"] == [] and out["by_uuid"] == 0 and out["by_bus"] == 0
    assert out["bus"] == "00000000:00:00.0"  # as the shim's cuDeviceGetPCIBusId
    assert out["cc"] == [9, 0] and out["cuda"] == 13000
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert out["temperature"] == out["power"] == out["driver"] == not_supported
    assert out["utilization"] == not_supported  # this agent does not measure it


def test_nccls_start_up_questions_get_the_answers_a_gpu_without_peers_gives(agent):
    # NCCL (torch.distributed's backend) asks every pair of devices, itself included, for
    # P2P read and write and stops at any error; the rest it tolerates NOT_SUPPORTED for.
    out = _pynvml(agent.vm_address("vm1"), """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        # nvmlGpuP2PCapsIndex_t READ and WRITE (pynvml's own constants are tuples)
        out["p2p"] = [N.nvmlDeviceGetP2PStatus(h, h, i) for i in (0, 1)]
        for name, call in [("nvlink", lambda: N.nvmlDeviceGetNvLinkState(h, 0)),
                           ("pcie", lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h))]:
            try:
                call()
                out[name] = "answered"
            except N.NVMLError as e:
                out[name] = e.value
        N.nvmlShutdown()
    """)
    assert out["p2p"] == [pynvml.NVML_P2P_STATUS_OK] * 2
    assert out["nvlink"] == out["pcie"] == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_pynvml_through_hvgpu_guest_run_sees_only_its_vms_processes(agent):
    agent.api.attach("vm2", "128M", allow_time_shared=True)
    with Connection(agent.vm_address("vm1")) as vm1_process:
        vm1_process.call("MEM_ALLOC", 32 * M)
        out = _pynvml(agent.vm_address("vm2"), """
            N.nvmlInit()
            h = N.nvmlDeviceGetHandleByIndex(0)
            out["processes"] = N.nvmlDeviceGetComputeRunningProcesses(h)
            out["used"] = N.nvmlDeviceGetMemoryInfo(h).used
            out["total"] = N.nvmlDeviceGetMemoryInfo(h).total
        """, run=True)
    assert out == {"processes": [], "used": 0, "total": 128 * M}


def test_without_an_agent_init_says_the_driver_is_not_loaded(tmp_path):
    out = _pynvml(f"unix://{tmp_path}/none.sock", """
        try:
            N.nvmlInit()
        except N.NVMLError as e:
            out["error"] = e.value
    """)
    assert out == {"error": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}


def test_calls_before_init_are_uninitialized():
    lib = ctypes.CDLL(str(NVML_LIBRARY), mode=ctypes.RTLD_LOCAL)
    n = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 1  # NVML_ERROR_UNINITIALIZED
    assert lib.nvmlShutdown() == 1
