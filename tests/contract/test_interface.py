"""The double and the driver's class both implement the whole of ``GpuDevice``, each
method with its parameters: a method the session calls that one of them lacks, or
takes differently, fails here rather than on the GPU machine. Needs no GPU: the
driver's class is only inspected."""

from __future__ import annotations

import inspect

import pytest

from hvgpu.host.executor.cuda_device import CudaDevice
from hvgpu.host.executor.device import GpuDevice
from tests.fake_gpu import FakeDevice


def _parameters(cls, name):
    method = getattr(cls, name, None)
    return None if method is None else list(inspect.signature(method).parameters)


@pytest.mark.parametrize("cls", [FakeDevice, CudaDevice], ids=["double", "driver"])
def test_every_device_method_is_there_with_the_interfaces_parameters(cls):
    methods = [name for name, value in vars(GpuDevice).items()
               if callable(value) and not name.startswith("_")]
    assert len(methods) > 50
    wrong = {name: _parameters(cls, name) for name in methods
             if _parameters(cls, name) != _parameters(GpuDevice, name)}
    assert wrong == {}
