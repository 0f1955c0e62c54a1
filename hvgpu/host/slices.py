"""The slice manager: which VM gets how much of which GPU.

Placement (a policy, best fit by default, unless a GPU is named),
over-commit refusal, resize rules and persistence go through here; the
control API calls it, and the agent asks it which slice a connecting peer
belongs to. It never talks to CUDA,
NVML or libvirt directly: GPUs come from an inventory callable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.inventory import Gpu
from hvgpu.host.state import Slice, StateStore
from hvgpu.units import format_size


class SliceError(HvgpuError):
    code = "slice"


class NoRoom(SliceError):
    code = "no-room"


class UnknownVm(SliceError):
    code = "unknown-vm"


@dataclass
class GpuRoom:
    gpu: Gpu
    mem_reserved: int
    compute_reserved: int

    @property
    def mem_free(self) -> int:
        return self.gpu.memory_total - self.mem_reserved

    @property
    def compute_free(self) -> int:
        return 100 - self.compute_reserved

    def describe(self) -> str:
        return (f"GPU {self.gpu.index} ({self.gpu.name}) {format_size(max(self.mem_free, 0))} "
                f"free, {self.compute_free}% compute free")


# How a slice's GPU is chosen among those with room for it.
PLACEMENTS = {
    "best-fit": "the GPU left with the least free memory (keeps large holes for large slices)",
    "pack": "the first GPU by index (fills GPU 0 before GPU 1; idle GPUs stay idle)",
    "spread": "the GPU with the most free memory, then compute (tenants share less)",
}
DEFAULT_PLACEMENT = "best-fit"


def _choose(fits: list[GpuRoom], mem: int, placement: str) -> GpuRoom:
    if placement == "pack":
        return min(fits, key=lambda r: r.gpu.index)
    if placement == "spread":
        return min(fits, key=lambda r: (-r.mem_free, -r.compute_free, r.gpu.index))
    return min(fits, key=lambda r: (r.mem_free - mem, r.gpu.index))


def check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise SliceError(f"no placement policy {placement!r}; choose one of: "
                         + ", ".join(PLACEMENTS))


class SliceManager:
    def __init__(self, store: StateStore, gpus: Callable[[], list[Gpu]],
                 placement: str = DEFAULT_PLACEMENT):
        check_placement(placement)
        self.placement = placement
        self.store = store
        self._gpus = gpus
        self._lock = threading.RLock()
        self._slices = {s.vm: s for s in store.all()}

    # -- queries -------------------------------------------------------------

    def list(self) -> list[Slice]:
        with self._lock:
            return sorted(self._slices.values(), key=lambda s: s.vm)

    def get(self, vm: str) -> Slice:
        with self._lock:
            try:
                return self._slices[vm]
            except KeyError:
                raise UnknownVm(f"no slice is attached to {vm!r} (hvgpu list shows them)") from None

    def by_cid(self, cid: int) -> Slice | None:
        with self._lock:
            return next((s for s in self._slices.values() if s.cid == cid), None)

    def rooms(self, exclude: str | None = None) -> list[GpuRoom]:
        rooms = []
        for gpu in self._gpus():
            mine = [s for s in self._slices.values() if s.gpu_uuid == gpu.uuid and s.vm != exclude]
            rooms.append(GpuRoom(gpu, sum(s.mem for s in mine), sum(s.compute for s in mine)))
        return rooms

    # -- changes -------------------------------------------------------------

    def attach(self, vm: str, mem: int, compute: int = 0, gpu: str | int | None = None,
               cid: int | None = None, placement: str | None = None) -> Slice:
        with self._lock:
            if vm in self._slices:
                raise SliceError(f"{vm!r} already has a slice; use hvgpu resize to change it")
            if cid is not None:
                other = self.by_cid(cid)
                if other is not None:
                    raise SliceError(f"CID {cid} already belongs to {other.vm!r}")
            room = self._place(mem, compute, gpu, placement or self.placement)
            s = Slice(vm=vm, gpu_uuid=room.gpu.uuid, gpu_index=room.gpu.index, mem=mem,
                      compute=compute, cid=cid)
            self.store.put(s)
            self._slices[vm] = s
            return s

    def adopt(self, s: Slice) -> Slice:
        """Take a slice recorded elsewhere (a domain's metadata) as it is."""
        with self._lock:
            self.store.put(s)
            self._slices[s.vm] = s
            return s

    def _place(self, mem: int, compute: int, gpu: str | int | None,
               placement: str = DEFAULT_PLACEMENT) -> GpuRoom:
        check_placement(placement)
        rooms = self.rooms()
        if not rooms:
            raise NoRoom("this host has no GPU to place a slice on")
        if gpu is not None:
            named = [r for r in rooms if str(r.gpu.index) == str(gpu) or r.gpu.uuid == str(gpu)]
            if not named:
                raise SliceError(f"no GPU {gpu!r} on this host; GPUs: "
                                 + ", ".join(f"{r.gpu.index} ({r.gpu.uuid})" for r in rooms))
            rooms = named
        fits = [r for r in rooms if r.mem_free >= mem and r.compute_free >= compute]
        if not fits:
            want = format_size(mem) + (f" and {compute}% compute" if compute else "")
            raise NoRoom(f"no GPU has room for {want}: "
                         + "; ".join(r.describe() for r in rooms))
        return _choose(fits, mem, placement)

    def resize(self, vm: str, mem: int | None = None, compute: int | None = None,
               in_use: int = 0) -> Slice:
        with self._lock:
            s = self.get(vm)
            new_mem = s.mem if mem is None else mem
            new_compute = s.compute if compute is None else compute
            if new_mem < in_use:
                raise SliceError(f"cannot shrink {vm!r} to {format_size(new_mem)}: its guest "
                                 f"uses {format_size(in_use)} now")
            room = next((r for r in self.rooms(exclude=vm) if r.gpu.uuid == s.gpu_uuid), None)
            if room is None:
                raise SliceError(f"the GPU of {vm!r} ({s.gpu_uuid}) is no longer on this host")
            if new_mem > room.mem_free or new_compute > room.compute_free:
                raise NoRoom(f"cannot grow {vm!r} to {format_size(new_mem)}"
                             + (f", {new_compute}% compute" if new_compute else "")
                             + f": {room.describe()} besides this slice")
            s.mem, s.compute = new_mem, new_compute
            self.store.put(s)
            return s

    def detach(self, vm: str) -> Slice:
        with self._lock:
            s = self.get(vm)
            self.store.delete(vm)
            del self._slices[vm]
            return s
