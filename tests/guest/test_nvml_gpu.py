"""The guest's NVML library and `hvgpu-guest smi` on the real GPU, through `hvgpu-guest run`.

A slice of 2 GiB for vm1 on GPU 0; a program of vm1 (this test process, over
the data lane) holds 512 MiB; pynvml, started by `hvgpu-guest run` as a user
starts it in the VM, must see the slice as its GPU, that program among the
VM's processes, and NOT_SUPPORTED where the host tells a VM nothing. What it
saw is printed (pytest -s shows it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hvgpu.guest.client import Connection
from tests.conftest import REPO, RunningAgent

pytestmark = pytest.mark.gpu
M, G = 1 << 20, 1 << 30

PROGRAM = r'''
import json, pynvml as N
N.nvmlInit()
out = {"count": N.nvmlDeviceGetCount(), "cuda": N.nvmlSystemGetCudaDriverVersion()}
h = N.nvmlDeviceGetHandleByIndex(0)
m = N.nvmlDeviceGetMemoryInfo(h)
out.update(name=N.nvmlDeviceGetName(h), uuid=N.nvmlDeviceGetUUID(h),
           memory=[m.total, m.used, m.free], bus=N.nvmlDeviceGetPciInfo(h).busId,
           cc=list(N.nvmlDeviceGetCudaComputeCapability(h)),
           processes=[[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)])
for name, call in [("utilization", lambda: N.nvmlDeviceGetUtilizationRates(h).gpu),
                   ("temperature", lambda: N.nvmlDeviceGetTemperature(h, 0)),
                   ("power", lambda: N.nvmlDeviceGetPowerUsage(h))]:
    try:
        out[name] = call()
    except N.NVMLError as e:
        out[name] = str(e)
N.nvmlShutdown()
print(json.dumps(out))
'''


@pytest.fixture
def agent(tmp_path):
    pytest.importorskip("pynvml")
    from hvgpu.host.inventory import read_gpus

    running = RunningAgent(tmp_path, None, slices=True, vms=("vm1",), gpus=read_gpus)
    running.api.attach("vm1", "2G", allow_time_shared=True)
    yield running
    running.stop()


def test_pynvml_through_hvgpu_guest_run_on_the_gpu(agent):
    env = dict(os.environ, HVGPU_AGENT=agent.vm_address("vm1"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    guest = [sys.executable, "-m", "hvgpu.guest.cli"]
    with Connection(agent.vm_address("vm1")) as program:
        program.call("MEM_ALLOC", 512 * M)
        proc = subprocess.run([*guest, "run", "--", sys.executable, "-c", PROGRAM], env=env,
                              capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        smi = subprocess.run([*guest, "smi"], env=env, capture_output=True, text=True,
                             timeout=300, cwd=REPO)
    seen = json.loads(proc.stdout.splitlines()[-1])
    print("\npynvml through hvgpu-guest run saw:\n" + json.dumps(seen, indent=2))
    print(smi.stdout, smi.stderr)
    assert seen["count"] == 1 and seen["memory"][0] == 2 * G
    assert seen["memory"][1] >= 512 * M
    assert any(pid == os.getpid() and used >= 512 * M for pid, used in seen["processes"])
    assert seen["temperature"] == seen["power"] == "Not Supported"
    assert seen["uuid"].startswith("GPU-") and seen["cc"][0] >= 7
    assert smi.returncode == 0 and str(os.getpid()) in smi.stdout
