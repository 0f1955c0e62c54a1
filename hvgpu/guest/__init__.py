"""hvgpu's guest runtime: CUDA from a VM with no GPU, through the host agent.

    from hvgpu.guest import Device, Program, LaunchConfig, launch

The API is shaped after NVIDIA's ``cuda.core``.

Errors: what CUDA refuses raises ``CudaError`` with CUDA's own status number
(``status``, ``name``); NVRTC's failures are its subclass ``CompileError``,
with the compiler's ``log``. A connection to the agent that is lost (the agent
stopped, the slice was detached, the agent fell silent for $HVGPU_TIMEOUT)
raises ``AgentLost``, a ``CudaError`` with CUDA_ERROR_DEVICE_UNAVAILABLE (46),
the status the ``libcuda.so.1`` shim returns then, on that call and every later
one on that connection; it is a ``ConnectionLost`` too. An agent that cannot be
reached at all raises ``TransportError`` and a bad $HVGPU_AGENT ``AddressError``
(both ``HvgpuError``, the base of all of them). Arguments the API can check
itself raise Python's ``TypeError`` or ``ValueError``.

Everything here runs in the
guest and must install without libvirt, CuPy, NVML or a GPU driver; it must
never import ``hvgpu.host``.
"""

from hvgpu.errors import (AgentLost, CompileError, ConnectionLost, CudaError, HvgpuError,
                          TransportError)
from hvgpu.guest.client import Connection
from hvgpu.guest.device import Buffer, Device, Event, Stream
from hvgpu.guest.program import (Kernel, LaunchConfig, ObjectCode, Program, ProgramOptions,
                                 launch)
from hvgpu.guest.runtime import connect, default_connection, device_count

__all__ = ["AgentLost", "Buffer", "CompileError", "Connection", "ConnectionLost", "CudaError",
           "Device", "Event", "HvgpuError", "Kernel", "LaunchConfig", "ObjectCode", "Program",
           "ProgramOptions", "Stream", "TransportError", "connect", "default_connection",
           "device_count", "launch"]
