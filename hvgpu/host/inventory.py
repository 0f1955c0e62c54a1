"""What GPUs this host has, read through NVML (nvidia-ml-py).

The only module in hvgpu that imports NVML. It reports; it decides nothing
(placement is the slice manager's) and never changes a GPU's settings.
"""

from __future__ import annotations

import os
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


def host_memory() -> int | None:
    """This host's RAM in bytes (what the kernel manages); None where it cannot say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


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
    _init(nvml)
    try:
        return _read_gpus(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _init(nvml) -> None:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        raise NoDriver(f"no NVIDIA driver/NVML found: {exc}") from None


def _read_gpus(nvml) -> list[Gpu]:
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


NVML_SUCCESS, NVML_ERROR_NOT_FOUND = 0, 6  # nvmlReturn_t


class Sampling:
    """NVML held open for repeated reads (the agent's usage sampler, one thread).

    :meth:`process_utilization` is the driver's per-process figure: the mean SM
    utilisation of each process's samples since the previous call, 0 for a process
    the driver lists on the GPU that had no sample (it ran nothing), and nothing
    for a process the driver does not list. Raises NoDriver where NVML is absent.
    """

    def __init__(self, nvml=None):
        self.nvml = nvml or _load_nvml()
        _init(self.nvml)
        self._seen: dict[int, int] = {}  # GPU index -> newest sample's timestamp (µs)

    def gpus(self) -> list[Gpu]:
        return _read_gpus(self.nvml)

    def process_utilization(self, index: int) -> dict[int, int] | None:
        """pid -> SM utilisation in percent; None where the driver cannot say."""
        nvml = self.nvml
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            running = {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)}
        except Exception:
            return None
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(h, self._seen.get(index, 0))
        except Exception as exc:
            # pynvml raises for "no sample in the window" too: NOT_FOUND, or SUCCESS with none
            if getattr(exc, "value", None) not in (NVML_SUCCESS, NVML_ERROR_NOT_FOUND):
                return None  # not supported here: no figure rather than a made-up one
            samples = []
        by_pid: dict[int, list[int]] = {}
        for sample in samples:
            by_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
            self._seen[index] = max(self._seen.get(index, 0), int(sample.timeStamp))
        figures = {pid: 0 for pid in running}
        figures.update({pid: min(100, max(0, round(sum(v) / len(v))))
                        for pid, v in by_pid.items()})
        return figures

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass
