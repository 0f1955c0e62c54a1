import pytest

from hvgpu.host import inventory
from hvgpu.host.inventory import NoDriver, read_gpus
from tests.fake_nvml import FakeNvml, gpu


def test_reads_each_gpu_from_nvml(monkeypatch):
    monkeypatch.setattr(inventory.shutil, "which", lambda name: "/usr/bin/" + name)
    nvml = FakeNvml()
    (g,) = read_gpus(nvml)
    assert (g.index, g.name, g.memory_total) == (0, "NVIDIA H200", 150109880320)
    assert g.uuid.startswith("GPU-") and g.mps and not g.mig
    assert nvml.inited == 0  # shut down again


def test_says_why_mps_cannot_be_used(monkeypatch):
    monkeypatch.setattr(inventory.shutil, "which", lambda name: None)
    assert read_gpus(FakeNvml())[0].mps_reason == "nvidia-cuda-mps-control is not installed"
    monkeypatch.setattr(inventory.shutil, "which", lambda name: "/x")
    g = read_gpus(FakeNvml([gpu("GPU-a", 80, compute_mode=2, mig=None)]))[0]
    assert not g.mps and "Prohibited" in g.mps_reason and not g.mig


def test_no_driver_is_a_clear_error_not_a_traceback():
    with pytest.raises(NoDriver, match="no NVIDIA driver/NVML found: Driver Not Loaded"):
        read_gpus(FakeNvml(fail_init="Driver Not Loaded"))
