"""One guest's share of the slice's quota, and what holds a piece of it.

A :class:`Ledger` charges the slice (``quota.reserve``) for what the guest's
ops take of device memory and gives it back (``quota.release``); ``charged``
is what this guest holds, which the session gives back whole when it ends. A
:class:`Resource` is something the guest holds that owns its handle, its charge
and its release (an allocation, a module): releasing it gives its device memory
back under :data:`DEVICE_MEMORY` and then its charge.

Must not import CUDA (the device does every call) or decide what a guest may
do (the ops' checks do).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor.device_memory import DeviceMemoryLock
from hvgpu.host.executor.vmm import quietly  # noqa: F401  (the ops' one release helper)
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

# One per executor process: a module's cost is the driver's free memory before and
# after its load, which another session's (or, through its lock file, another VM's
# executor's) allocation or release must not change in between; every call that takes
# or gives back device memory holds it shared, a measurement exclusive. Re-entrant: a
# release can run what a graph held back (parked), which takes it again.
DEVICE_MEMORY = DeviceMemoryLock()


class Ledger:
    """The bytes of the slice's quota one guest holds; no quota: the whole GPU, and
    nothing is charged."""

    def __init__(self, quota=None, settle: Callable[[], bool] = lambda: False):
        self.quota = quota  # reserve(n) / release(n) / usage(); may be set later
        self.charged = 0
        self.settle = settle  # pools give back what they no longer hold: True if any

    def charge(self, n: int) -> None:
        """Charge ``n`` bytes to the slice; CUDA_ERROR_OUT_OF_MEMORY past its quota."""
        if self.quota is not None and n:
            try:
                self.quota.reserve(n)
            except CudaError as exc:
                # Pools may have given memory back since they were last settled.
                if exc.status != P.CUDA_ERROR_OUT_OF_MEMORY or not self.settle():
                    raise
                self.quota.reserve(n)
            self.charged += n

    def uncharge(self, n: int) -> None:
        if self.quota is not None and n:
            self.charged -= n
            quietly(self.quota.release, n)

    def hand_over(self, n: int) -> Callable[[], None]:
        """``n`` bytes this guest was charged stay charged to the slice, but are no
        longer this guest's to give back (memory another process of the VM still
        holds, ipc.py): the call returned gives them back."""
        if self.quota is None or not n:
            return lambda: None
        self.charged -= n
        quota = self.quota
        return lambda: quietly(quota.release, n)

    def measure(self, device, make: Callable[[], Any], undo: Callable[[Any], None],
                what: str) -> tuple[Any, int]:
        """``make()``'s result and the bytes of device memory it took, charged: the
        driver's free memory before and after, under :data:`DEVICE_MEMORY` held
        exclusive (the driver says nothing else of a module's variables or an
        instantiation's own memory). Refused by the quota: ``undo(result)``, then the
        refusal, saying ``what`` took the memory."""
        with DEVICE_MEMORY.measuring():
            free_before = device.mem_info()[0]
            made = make()
            taken = max(0, free_before - device.mem_info()[0])
        try:
            self.charge(taken)
        except CudaError as exc:
            with DEVICE_MEMORY:  # as every release: another session's load may be measuring
                quietly(undo, made)
            raise CudaError(exc.status, f"{what} {taken} bytes of device memory: "
                                        f"{exc.detail}") from None
        return made, taken


class Resource:
    """Something a guest holds: its handle, what it was charged, and how it goes."""

    __slots__ = ("handle", "charge")

    def __init__(self, handle: int, charge: int = 0):
        self.handle, self.charge = handle, charge

    def release(self, session) -> None:
        """Give it back to the driver, then its charge to the slice."""
        raise NotImplementedError
