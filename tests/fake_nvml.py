"""Recorded NVML answers, for tests of the inventory without a driver.

A pynvml-compatible module object built from data; values of the H200 are as
the GPU machine reported them (143771 MiB, driver 580). A GPU's "processes"
(pid -> SM utilisation in percent, or None: listed on the GPU with no sample)
answer the per-process calls; the test changes it as it goes.
"""

from types import SimpleNamespace

H200 = {"name": "NVIDIA H200", "total": 150109880320, "used": 552402944, "util": 0,
        "mig": (0, 0), "compute_mode": 0}


class NVMLError(Exception):
    def __init__(self, message="", value=999):
        super().__init__(message)
        self.value = value  # nvmlReturn_t, as pynvml's NVMLError has it


NVML_ERROR_NOT_FOUND = 6


class FakeNvml:
    def __init__(self, gpus=None, fail_init: str | None = None):
        self.gpus = gpus if gpus is not None else [dict(H200, uuid="GPU-e711190c-4cb9-8874-dc5e-eac3d385bcc4")]
        self.fail_init = fail_init
        self.inited = 0

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError(self.fail_init)
        self.inited += 1

    def nvmlShutdown(self):
        self.inited -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMigMode(self, h):
        if h["mig"] is None:
            raise NVMLError("Not Supported")
        return h["mig"]

    def nvmlDeviceGetComputeMode(self, h):
        return h["compute_mode"]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=0) for pid in h.get("processes") or {}]

    def nvmlDeviceGetProcessUtilization(self, h, since):
        if h.get("processes") is None:
            raise NVMLError("Not Supported", 3)
        self.clock = getattr(self, "clock", 0) + 1
        samples = [SimpleNamespace(pid=pid, smUtil=util, memUtil=0, encUtil=0, decUtil=0,
                                   timeStamp=self.clock)
                   for pid, util in h["processes"].items() if util is not None]
        if not samples:
            raise NVMLError("Not Found", NVML_ERROR_NOT_FOUND)
        return samples


def gpu(uuid, total_gib, used_gib=0, **kw):
    return dict(H200, uuid=uuid, total=total_gib << 30, used=used_gib << 30, **kw)
