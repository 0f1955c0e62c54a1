"""The multi-tenant bench's utilisation recording, against the GPU test double.

bench/multi_tenant.py reads each slice's utilisation from the agent's usage
snapshot (no prometheus-client on the GPU machine); here recorded NVML
answers stand in for the driver's per-process figures.
"""

from __future__ import annotations

import time

from bench import multi_tenant
from hvgpu.guest import Connection, Device
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.fake_nvml import FakeNvml, gpu

UUID = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_each_slices_utilisation_is_recorded_by_scenario(tmp_path, monkeypatch):
    nvml = FakeNvml([gpu(UUID, 1, util=55, processes={})])
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("t0",), nvml=nvml)
    running.agent.sampler.every = 0.2
    monkeypatch.setattr(multi_tenant, "UTIL_EVERY", 0.1)
    recorder = multi_tenant.UtilRecorder(running.agent).start()
    try:
        running.api.attach("t0", "64M", "50%", allow_time_shared=True)
        recorder.scenario = "50/50"
        with Connection(running.vm_address("t0")) as conn:
            Device(connection=conn).allocate(1 << 20)
            (st,) = running.api.status()
            nvml.gpus[0]["processes"] = {st["executors"][0]["pid"]: 48}
            deadline = time.monotonic() + 60
            while not any(s["slices"].get("t0") == 48 for s in recorder.samples):
                assert time.monotonic() < deadline, recorder.samples[-3:]
                time.sleep(0.1)
    finally:
        recorder.stop()
        running.stop()
    seen = [s for s in recorder.samples if s["slices"].get("t0") == 48]
    assert seen[0]["scenario"] == "50/50" and seen[0]["compute"] == {"t0": 50}
    assert seen[0]["gpus"] == {"0": 55}
    assert multi_tenant.mean_util([{"scenario": "50/50", "slices": {"t0": 48, "t1": None}},
                                   {"scenario": "50/50", "slices": {"t0": 52, "t1": None}},
                                   {"scenario": None, "slices": {"t0": 0}}]) \
        == {"50/50": {"t0": 50.0}}
    doc = {"gpu": "test double", "utilization": {"samples": recorder.samples}}
    drawn = multi_tenant.plot_util(doc, tmp_path / "util.png")
    assert drawn == (tmp_path / "util.png").exists()
