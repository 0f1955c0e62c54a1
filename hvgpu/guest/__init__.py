"""hvgpu's guest runtime: CUDA from a VM with no GPU, through the host agent.

    from hvgpu.guest import Device, Program, LaunchConfig, launch

The API is shaped after NVIDIA's ``cuda.core``. Everything here runs in the
guest and must install without libvirt, CuPy, NVML or a GPU driver; it must
never import ``hvgpu.host``.
"""

from hvgpu.errors import CompileError, ConnectionLost, CudaError, HvgpuError
from hvgpu.guest.client import Connection
from hvgpu.guest.device import Buffer, Device, Event, Stream
from hvgpu.guest.program import (Kernel, LaunchConfig, ObjectCode, Program, ProgramOptions,
                                 launch)
from hvgpu.guest.runtime import connect, default_connection, device_count

__all__ = ["Buffer", "CompileError", "Connection", "ConnectionLost", "CudaError", "Device",
           "Event", "HvgpuError", "Kernel", "LaunchConfig", "ObjectCode", "Program",
           "ProgramOptions", "Stream", "connect", "default_connection", "device_count",
           "launch"]
