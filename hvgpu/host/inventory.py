"""What GPUs this host has, read through NVML (nvidia-ml-py).

The only module in hvgpu that imports NVML. It reports; it decides nothing
(placement is the slice manager's) and never changes a GPU's settings.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass

from hvgpu.errors import HvgpuError

COMPUTE_MODE_PROHIBITED = 2


class NoDriver(HvgpuError):
    code = "no-driver"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    utilization: int | None  # percent, None where NVML cannot say
    mig: bool
    mps: bool  # an MPS control daemon can serve this GPU here
    mps_reason: str  # why not, when mps is False

    def as_dict(self) -> dict:
        return asdict(self)


def _load_nvml():
    try:
        import pynvml
    except ImportError:
        raise NoDriver("no NVIDIA driver/NVML found: nvidia-ml-py is not installed "
                       "(pip install 'hvgpu[host]')") from None
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpus(nvml=None) -> list[Gpu]:
    """Every GPU NVML sees; ``nvml`` defaults to the pynvml module."""
    nvml = nvml or _load_nvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        raise NoDriver(f"no NVIDIA driver/NVML found: {exc}") from None
    try:
        mps_binary = shutil.which("nvidia-cuda-mps-control")
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                util = int(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            try:
                mig = bool(nvml.nvmlDeviceGetMigMode(h)[0])
            except Exception:  # not a MIG-capable GPU
                mig = False
            try:
                prohibited = nvml.nvmlDeviceGetComputeMode(h) == COMPUTE_MODE_PROHIBITED
            except Exception:
                prohibited = False
            if not mps_binary:
                reason = "nvidia-cuda-mps-control is not installed"
            elif prohibited:
                reason = "the GPU's compute mode is Prohibited"
            else:
                reason = ""
            gpus.append(Gpu(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                            name=_text(nvml.nvmlDeviceGetName(h)),
                            memory_total=int(mem.total), memory_used=int(mem.used),
                            utilization=util, mig=mig, mps=not reason, mps_reason=reason))
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
