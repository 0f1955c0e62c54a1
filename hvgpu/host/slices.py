"""The slice manager: the one store of vGPUs, which VM gets how much of which GPU.

Placement (a policy, best fit by default, unless a GPU is named),
over-commit refusal, resize rules and persistence go through here, and it is
the only writer of slices: attach, adopt, resize and detach each return a
:class:`StoreChange` saying what changed, which the agent applies to what runs
(registry records, ledgers, executors). Everything else holds a slice only as
an immutable value it was given. Changes run on the agent's loop alone (its
``guard``), so no lock is kept beside it.

Must not talk to CUDA, NVML or libvirt (GPUs come from an inventory callable),
nor start or end executors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.inventory import Gpu
from hvgpu.host.names import MAX_VGPUS, VgpuKey, check_device, check_vm_name
from hvgpu.host.state import MAX_CID, Slice, StateStore
from hvgpu.units import check_region_size, format_size


class SliceError(HvgpuError):
    code = "slice"


class NoRoom(SliceError):
    code = "no-room"


class UnknownVm(SliceError):
    code = "no-slice"  # the VM (which libvirt may well have) has no slice attached


@dataclass(frozen=True)
class StoreChange:
    """What one change of the store did, in order: vGPUs removed, added, and changed
    (each as (before, after))."""

    added: tuple[Slice, ...] = ()
    changed: tuple[tuple[Slice, Slice], ...] = ()
    removed: tuple[Slice, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    @property
    def now(self) -> list[Slice]:
        """The vGPUs this change made or changed, as they are now."""
        return [*self.added, *(after for _, after in self.changed)]


NOTHING = StoreChange()


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


def check_cid(cid) -> int:
    """``cid`` when it can be a guest's vsock CID, else SliceError saying which are."""
    if isinstance(cid, bool) or not isinstance(cid, int) or not 3 <= cid <= MAX_CID:
        raise SliceError(f"CID {cid!r} is not a guest's: a VM's vsock CID is 3 to {MAX_CID} "
                         "(0 is the hypervisor, 1 this host's loopback, 2 the host; "
                         f"{MAX_CID + 1} means any)")
    return cid


class SliceManager:
    """The vGPUs of every VM, by key (``Slice.key``: a VgpuKey). Every VM name that
    comes in is checked (names.check_vm_name)."""

    def __init__(self, store: StateStore, gpus: Callable[[], list[Gpu]],
                 placement: str = DEFAULT_PLACEMENT):
        check_placement(placement)
        self.placement = placement
        self.store = store
        self._gpus = gpus
        self._slices = {s.key: s for s in store.all()}
        # Called before every change: the agent makes it refuse any thread but its loop's.
        self.guard: Callable[[], None] = lambda: None

    # -- queries -------------------------------------------------------------

    def list(self) -> list[Slice]:
        return sorted(self._slices.values(), key=lambda s: (s.vm, s.device))

    def of_vm(self, vm: str) -> list[Slice]:
        """The VM's vGPUs by device number; [] if it has none."""
        check_vm_name(vm)
        return sorted((s for s in self._slices.values() if s.vm == vm), key=lambda s: s.device)

    def get(self, vm: str, device: int = 0) -> Slice:
        key = VgpuKey.of(vm, device)
        s = self._slices.get(key)
        if s is not None:
            return s
        mine = self.of_vm(vm)
        if not mine:
            raise UnknownVm(f"no slice is attached to {vm!r} (hvgpu list shows them)")
        raise SliceError(f"{vm!r} has no vGPU {device}; its devices are "
                         + ", ".join(str(m.device) for m in mine))

    def by_key(self, key: VgpuKey) -> Slice:
        return self.get(key.vm, key.device)

    def by_cid(self, cid: int) -> Slice | None:
        """The VM's device 0 (every vGPU of a VM carries its CID)."""
        return next((s for s in self.list() if s.cid == cid), None)

    def rooms(self, exclude: VgpuKey | None = None, gpus: list[Gpu] | None = None
              ) -> list[GpuRoom]:
        """Each GPU's reservations, leaving out the vGPU keyed ``exclude``; ``gpus``: the
        inventory when the caller has read it already."""
        rooms = []
        for gpu in (self._gpus() if gpus is None else gpus):
            mine = [s for s in self._slices.values()
                    if s.gpu_uuid == gpu.uuid and s.key != exclude]
            rooms.append(GpuRoom(gpu, sum(s.mem for s in mine), sum(s.compute for s in mine)))
        return rooms

    # -- changes -------------------------------------------------------------

    def attach(self, vm: str, mem: int, compute: int = 0, gpu: str | int | None = None,
               cid: int | None = None, placement: str | None = None, count: int = 1,
               add: bool = False, region: int = 0) -> StoreChange:
        """``count`` new vGPUs for ``vm``, each with ``mem``, ``compute`` and a
        region of ``region`` bytes (0: none); with ``add``, after the ones it
        has. Unless ``gpu`` names one, each goes to a GPU this VM does not use yet. All
        are placed, or none.

        The region is host RAM, not GPU memory: its size, set here, is its limit, and
        is not counted against the GPU."""
        check_region_size(region)
        self.guard()
        mine = self.of_vm(vm)  # checks the name
        if mine and not add:
            raise SliceError(f"{vm!r} already has {len(mine)} vGPU(s); use hvgpu resize "
                             "to change one, or attach --add for another")
        if not 1 <= count <= MAX_VGPUS - len(mine):
            raise SliceError(f"a VM has at most {MAX_VGPUS} vGPUs; {vm!r} has "
                             f"{len(mine)}, {count} more asked for")
        if mine:
            if cid is not None and cid != mine[0].cid:
                raise SliceError(f"{vm!r} is known by CID {mine[0].cid}, not {cid}")
            cid = mine[0].cid
        elif cid is not None:
            check_cid(cid)
            other = self.by_cid(cid)
            if other is not None:
                raise SliceError(f"CID {cid} already belongs to {other.vm!r}")
        policy = placement or self.placement
        check_placement(policy)
        new: list[Slice] = []
        for device in range(len(mine), len(mine) + count):
            room = self._place(mem, compute, gpu, policy, mine + new, count)
            new.append(Slice(vm=vm, gpu_uuid=room.gpu.uuid, gpu_index=room.gpu.index,
                             mem=mem, compute=compute, cid=cid, device=device, region=region))
        new = self.store.put(*new)
        for s in new:
            self._slices[s.key] = s
        return StoreChange(added=tuple(new))

    def adopt(self, s: Slice) -> StoreChange:
        """Take a vGPU recorded elsewhere (a domain's metadata) as it is."""
        self.guard()
        VgpuKey.of(s.vm, s.device)
        check_region_size(s.region)
        before = self._slices.get(s.key)
        (s,) = self.store.put(s)
        self._slices[s.key] = s
        if before is None:
            return StoreChange(added=(s,))
        return StoreChange(changed=((before, s),))

    def _place(self, mem: int, compute: int, gpu: str | int | None,
               placement: str = DEFAULT_PLACEMENT, siblings: list[Slice] = (),
               count: int = 1) -> GpuRoom:
        rooms = self.rooms()
        if not rooms:
            raise NoRoom("this host has no GPU to place a slice on")
        for r in rooms:  # count vGPUs placed earlier in the same attach
            taken = [s for s in siblings if s.gpu_uuid == r.gpu.uuid and s.key not in self._slices]
            r.mem_reserved += sum(s.mem for s in taken)
            r.compute_reserved += sum(s.compute for s in taken)
        if gpu is not None:
            named = [r for r in rooms if str(r.gpu.index) == str(gpu) or r.gpu.uuid == str(gpu)]
            if not named:
                raise SliceError(f"no GPU {gpu!r} on this host; GPUs: "
                                 + ", ".join(f"{r.gpu.index} ({r.gpu.uuid})" for r in rooms))
            rooms = named
        elif siblings:  # a VM's vGPUs on distinct GPUs, unless one is named
            used = {s.gpu_uuid for s in siblings}
            rooms_all = len(rooms)
            rooms = [r for r in rooms if r.gpu.uuid not in used]
            if not rooms:
                had = len([s for s in siblings if s.key in self._slices])
                if count > 1 and had == 0:  # the attach asked for more vGPUs than GPUs
                    raise NoRoom(f"{count} vGPUs asked for, and this host has {rooms_all} "
                                 f"GPU{'s' if rooms_all != 1 else ''}: a VM's vGPUs go to "
                                 "distinct GPUs unless one is named; attach with --gpu N "
                                 "to put them all on GPU N")
                raise NoRoom(f"every GPU of this host already holds a vGPU of this VM "
                             f"({len(used)}); name one with --gpu to put another there")
        fits = [r for r in rooms if r.mem_free >= mem and r.compute_free >= compute]
        if not fits:
            want = format_size(mem) + (f" and {compute}% compute" if compute else "")
            raise NoRoom(f"no GPU has room for {want}: "
                         + "; ".join(r.describe() for r in rooms))
        return _choose(fits, mem, placement)

    def resize(self, vm: str, mem: int | None = None, compute: int | None = None,
               in_use: int = 0, device: int = 0, region: int | None = None) -> StoreChange:
        """New limits for one vGPU (None: unchanged). Whether its region
        may change now is the caller's question (a running VM's cannot)."""
        self.guard()
        if region is not None:
            check_region_size(region)
        s = self.get(vm, device)
        name = vm if len(self.of_vm(vm)) == 1 else f"vGPU {device} of {vm!r}"
        new_mem = s.mem if mem is None else mem
        new_compute = s.compute if compute is None else compute
        if new_mem < in_use:
            raise SliceError(f"cannot shrink {name} to {format_size(new_mem)}: its guest "
                             f"uses {format_size(in_use)} now")
        room = next((r for r in self.rooms(exclude=s.key) if r.gpu.uuid == s.gpu_uuid), None)
        if room is None:
            raise SliceError(f"the GPU of {name} ({s.gpu_uuid}) is no longer on this host")
        if new_mem > room.mem_free or new_compute > room.compute_free:
            raise NoRoom(f"cannot grow {name} to {format_size(new_mem)}"
                         + (f", {new_compute}% compute" if new_compute else "")
                         + f": {room.describe()} besides this slice")
        after = replace(s, mem=new_mem, compute=new_compute,
                        region=s.region if region is None else region)
        if after == s:
            return NOTHING
        (after,) = self.store.put(after)  # stored first: a failure leaves s as it was
        self._slices[s.key] = after
        return StoreChange(changed=((s, after),))

    def removable(self, vm: str, device: int | None = None) -> list[Slice]:
        """What detach(vm, device) would remove; raises what it would raise."""
        mine = self.of_vm(vm)
        if not mine:
            self.get(vm)  # raises UnknownVm
        if device is not None:
            check_device(device)
        if device is None:
            return mine
        s = self.get(vm, device)
        if device != mine[-1].device:
            raise SliceError(f"detach vGPU {mine[-1].device} of {vm!r} first: the "
                             f"guest numbers its devices 0..{len(mine) - 1} without gaps")
        return [s]

    def detach(self, vm: str, device: int | None = None) -> StoreChange:
        """All of the VM's vGPUs, or its last one (``device``): CUDA numbers a VM's
        devices 0..N-1 without gaps."""
        self.guard()
        gone = self.removable(vm, device)
        self.store.delete(vm, device)
        for s in gone:
            del self._slices[s.key]
        return StoreChange(removed=tuple(gone))
