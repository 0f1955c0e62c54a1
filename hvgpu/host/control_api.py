"""ControlAPI: the one set of operations behind the CLI, the gRPC lane and tests.

Each method takes plain values, validates them, drives the slice manager and
the agent, and returns plain dicts (what ``--json`` prints). Expected failures
raise ``HvgpuError`` subclasses with stable codes. A VM is named by its name or,
for a libvirt domain, its UUID: every method resolves it to libvirt's name
first. ``connect``, where a caller gives it, is the libvirt URI the caller
means; a call meant for another libvirt than the agent's is refused. Must not
format output or import gRPC: the adapters do.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.agent import Agent
from hvgpu.host.hypervisor import NoSuchVm
from hvgpu.host.inventory import Gpu, host_memory
from hvgpu.host.names import MAX_VGPUS, VgpuKey, check_vm_name, region_name
from hvgpu.host.slices import SliceError, UnknownVm, check_cid
from hvgpu.host.transaction import Transaction
from hvgpu.units import BadValue, format_size, parse_mem, parse_share, parse_region_size

log = logging.getLogger(__name__)

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


class NotBuilt(HvgpuError):
    code = "not-built"


class OtherLibvirt(HvgpuError):
    code = "other-libvirt"


class NotEnforced(HvgpuError):
    code = "compute-not-enforced"


def _renamed(region, shm):
    """The region size a call gave, under its name or under ``shm``, the name earlier
    versions' clients (and their scripts) send it by; both at once must agree."""
    if shm in (None, ""):
        return region
    if region not in (None, "") and region != shm:
        raise BadValue(f"region {region!r} and shm {shm!r} (its earlier name) disagree: "
                       "give one")
    return shm


class ControlAPI:
    def __init__(self, agent: Agent, gpus: Callable[[], list[Gpu]]):
        if agent.slices is None:
            raise HvgpuError("the agent runs without a state directory, so it has no slices")
        self.agent = agent
        self.slices = agent.slices
        self._gpus = gpus

    def _check_connect(self, connect: str | None) -> None:
        """One agent manages the VMs of one libvirt: a call meant for another (``hvgpu -c
        URI``) is refused rather than answered about this agent's VMs."""
        if connect in (None, ""):
            return
        ours = self.agent.config.connect
        if connect == ours:
            return
        ours = ours or "no libvirt (VMs by --cid or a bound socket only)"
        raise OtherLibvirt(
            f"this agent manages VMs through {ours}, not {connect}: one agent serves one "
            f"libvirt. Give the control socket of the agent started with -c {connect} "
            "(hvgpu --control PATH), or leave out -c")

    def _resolve(self, vm: str, new: bool = False) -> str:
        """The VM ``vm`` names: a libvirt domain's name or UUID as libvirt's name; a VM
        attached by CID or bound to a socket by its own name. ``new``: a name for a VM
        of neither kind that has no slice yet may stand as it is."""
        check_vm_name(vm)
        if self.slices.of_vm(vm) or any(k.vm == vm for k in self.agent.bindings.values()):
            return vm
        vms = self.agent.vms
        if vms is not None:
            try:
                return check_vm_name(vms.canonical(vm))
            except NoSuchVm:
                pass
        if _UUID.match(vm) and not new:
            if vms is None:
                raise UnknownVm(
                    f"{vm!r} looks like a domain UUID, but libvirt is not available to the "
                    f"agent ({self.agent.libvirt_reason}) to say which domain has it, and no "
                    "slice is named so: name the VM instead (hvgpu list shows them)")
            raise UnknownVm(f"no libvirt domain has the UUID {vm} and no slice is named so "
                            "(virsh list --all --uuid; hvgpu list)")
        return vm

    def _libvirt_cid(self, vm: str) -> int | None:
        """The vsock CID libvirt gave the domain (None: none yet, or no such domain)."""
        vms = self.agent.vms
        try:
            return vms.vsock_cid(vm)
        except NoSuchVm:
            return None

    def _not_enforced(self, gpu_uuid: str | None, gpus: list[Gpu] | None = None) -> str | None:
        """Why a compute share on this GPU (None: on any) would not be enforced; None when
        MPS does (as far as can be said without the GPU). ``gpus``: the inventory, when
        it was read already."""
        if not self.agent.mps.running:
            return self.agent.mps.reason or "MPS is not running"
        if gpu_uuid is None:
            return None
        gpu = next((g for g in (self._gpus() if gpus is None else gpus)
                    if g.uuid == gpu_uuid), None)
        if gpu is not None and gpu.mps:
            return None
        return (gpu.mps_reason if gpu is not None else "") or "MPS cannot serve this GPU"

    def _unenforced(self, vm: str, share: int, gpus: list[str | None],
                    allow: bool) -> str | None:
        """Where and why the compute share ``share`` of ``vm`` on these GPUs (by UUID;
        None: any) would not be enforced (None: MPS enforces it). Refused unless
        ``allow``."""
        if not share:
            return None
        for uuid in gpus:
            reason = self._not_enforced(uuid)
            if reason is None:
                continue
            where = uuid or "this host"
            if not allow:
                raise NotEnforced(
                    f"a compute share ({share}%) for {vm!r} cannot be enforced on {where}: "
                    f"{reason}. Without MPS every slice's kernels time-share the GPU, so the "
                    "share would be a number on paper. Run MPS (hvgpu gpus says why it is "
                    "not running), leave out --compute, or pass --allow-time-shared to "
                    "record the share unenforced")
            return f"{where} ({reason})"
        return None

    def _enforced(self, share: int, gpu_uuid: str, inventory) -> bool | None:
        """Whether MPS enforces the compute share ``share`` on that GPU (None: no share,
        or the GPUs could not be read to say)."""
        if not share:
            return None
        try:
            gpus = self._inventory(inventory)
        except HvgpuError:
            return None if self.agent.mps.running else False
        return self._not_enforced(gpu_uuid, gpus) is None

    @staticmethod
    def _warn_time_shared(vm: str, share: int, where: str) -> str:
        """The warning for a share taken with --allow-time-shared: logged, and returned for
        the caller to print."""
        warning = (f"{vm}: compute share {share}% is NOT enforced on {where}: its kernels "
                   "time-share the GPU with every other slice's (--allow-time-shared)")
        log.warning("%s", warning)
        return warning

    def _check_sizes(self, size: int | None, region: int | None, inventory,
                     gpu_uuid: str | None = None) -> None:
        """Refuse a memory quota no GPU could hold (``gpu_uuid``: the slice's own GPU,
        which a resize cannot leave) and a region larger than this host's
        RAM, naming what there is. Where NVML cannot be read, the slice manager's own
        refusal (no room) stands."""
        if size is not None:
            try:
                gpus = self._inventory(inventory)
            except HvgpuError:
                gpus = []
            if gpu_uuid is not None:
                gpus = [g for g in gpus if g.uuid == gpu_uuid]
            if gpus:
                largest = max(gpus, key=lambda g: g.memory_total)
                if size > largest.memory_total:
                    which = "the slice's" if gpu_uuid is not None else "the largest here"
                    raise BadValue(
                        f"--mem {format_size(size)} is more than any GPU could give: "
                        f"{which}, GPU {largest.index} ({largest.name}), has "
                        f"{format_size(largest.memory_total)} in all")
        if region:
            ram = host_memory()
            if ram is not None and region > ram:
                raise BadValue(f"--region {format_size(region)} is more than this host's memory "
                               f"({format_size(ram)}): a region is host RAM, "
                               "in /dev/shm")

    def read_inventory(self):
        """The GPUs as NVML lists them now, or the error reading them: read before a
        query is run on the agent's loop (Agent.commands does), so that a slow or hung
        NVML holds up only the caller, never the loop."""
        try:
            return self._gpus()
        except HvgpuError as exc:
            return exc

    def _inventory(self, given):
        got = self._gpus() if given is None else given
        if isinstance(got, BaseException):
            raise got
        return got

    def gpus(self, connect: str | None = None, *, _inventory=None) -> list[dict]:
        self._check_connect(connect)
        inventory = self._inventory(_inventory)
        rooms = {r.gpu.uuid: r for r in self.slices.rooms(gpus=inventory)}
        out = []
        for g in inventory:
            room = rooms.get(g.uuid)
            d = g.as_dict()
            d.update(reserved_mem=room.mem_reserved if room else 0,
                     reserved_compute=room.compute_reserved if room else 0,
                     enforcement=self._enforcement(g))
            out.append(d)
        return out

    def _enforcement(self, g: Gpu) -> str:
        if self.agent.mps.running and g.mps:
            return "MPS: memory and compute enforced by the driver, memory also accounted"
        reason = self.agent.mps.reason or g.mps_reason or "MPS is not running"
        return f"memory enforced by accounting; compute time-shared ({reason})"

    def attach(self, vm: str, mem, compute=None, gpu=None, cid: int | None = None,
               placement: str | None = None, count: int = 1, add: bool = False,
               region=None, allow_time_shared: bool = False, connect: str | None = None,
               shm=None, *, _inventory=None) -> dict:
        """Reserve ``count`` vGPUs for ``vm`` (with ``add``, besides those it has), each
        with a region of ``region`` (a size; none by default); a libvirt
        domain also gets a vsock device (hot-plugged, live and in its config, when
        missing and no hybrid-vsock listener is bound to it), an ivshmem-plain device per
        region (likewise, bound or not) and its vGPUs in its metadata. Every step is
        undone if a later one fails. Returns the first new vGPU, with all new ones under
        "vgpus".

        ``cid`` (a VM libvirt does not manage) must be a guest's CID that no other VM
        has: neither another slice nor a running libvirt domain. A compute share that
        MPS will not enforce is refused unless ``allow_time_shared``; then the result
        carries the "warning" said. ``shm`` is ``region``'s name in earlier versions'
        clients."""
        region = _renamed(region, shm)
        self._check_connect(connect)
        if cid is not None:
            check_cid(cid)
        vm = self._resolve(vm, new=True)
        vms = self.agent.vms
        bound = any(k.vm == vm for k in self.agent.bindings.values())
        by_libvirt = cid is None and vms is not None and (not bound or vms.knows(vm))
        hybrid = None
        if cid is None and not bound and vms is None:
            raise NotBuilt(f"cannot find VM {vm!r}: libvirt is not available to the agent "
                           f"({self.agent.libvirt_reason}); pass --cid N (the VM's vsock "
                           f"CID), or bind a socket to it (--listen unix:///PATH={vm})")
        size = parse_mem(mem)
        share = parse_share(compute) if compute not in (None, "") else 0
        region = parse_region_size(region) if region not in (None, "") else 0
        self._check_sizes(size, region, _inventory)
        if share and not self.agent.mps.running:  # refused before anything changes
            self._unenforced(vm, share, [None], allow_time_shared)
        if cid is not None and vms is not None:
            owner = vms.vm_for_cid(cid)
            if owner is not None and owner != vm:
                raise SliceError(f"CID {cid} is libvirt domain {owner!r}'s (libvirt gave it "
                                 f"to the running domain): a CID names one VM; give {vm!r} "
                                 "its own")
        unenforced = None
        with Transaction() as tx:
            if by_libvirt:
                vm, hybrid = vms.prepare(vm, tx, self._hybrid_listener)
                vm = check_vm_name(vm)  # libvirt's canonical name
                live = self._libvirt_cid(vm)
                other = self.slices.by_cid(live) if live is not None else None
                if other is not None and other.vm != vm:
                    raise SliceError(f"{vm!r} has vsock CID {live}, which {other.vm!r} was "
                                     "attached with (--cid): a CID names one VM; detach "
                                     f"{other.vm!r} or give the domain another CID")
            if region:  # a name too long for a file in /dev/shm: refused before any change
                last = len(self.slices.of_vm(vm)) + count - 1 if add else count - 1
                region_name(VgpuKey.of(vm, min(last, MAX_VGPUS - 1)))
            change = self.slices.attach(vm, size, share, gpu, cid, placement, count, add,
                                        region=region)
            new = list(change.added)
            for s in new:  # undone in reverse: the last vGPU first, as detach requires
                # the registry follows too, whether or not it had seen the vGPU
                tx.on_undo(lambda d=s.device: self.agent.apply(self.slices.detach(vm, d)),
                           "slice record")
            unenforced = self._unenforced(vm, share, [s.gpu_uuid for s in new],
                                          allow_time_shared)
            if by_libvirt:
                vms.plug_regions(new, tx)
                vms.record(self.slices.of_vm(vm), tx)
            self.agent.apply(change)
        d = new[0].as_dict()
        d["compute_enforced"] = self._enforced(share, new[0].gpu_uuid, _inventory)
        d["vgpus"] = [dict(s.as_dict(), compute_enforced=self._enforced(share, s.gpu_uuid,
                                                                         _inventory))
                      for s in new]
        if by_libvirt and hybrid is not None:
            d["hybrid_vsock"] = hybrid
        elif by_libvirt:
            d["vsock_cid"] = self._libvirt_cid(vm)
        if unenforced:
            d["warning"] = self._warn_time_shared(vm, share, unenforced)
        return d

    def _hybrid_listener(self, vm: str) -> str | None:
        """The hybrid-vsock listener bound to the VM's vGPU 0 (its guest's vsock is then
        served by a vhost-user backend, not by a vsock device libvirt knows)."""
        for listener, key in self.agent.bindings.items():
            if key.vm == vm and key.device == 0 and listener.address.scheme == "hvsock":
                return str(listener.address)
        return None

    def detach(self, vm: str, unplug: bool = False, device: int | None = None,
               connect: str | None = None) -> dict:
        """Remove the VM's vGPUs, or only its last one (``device``); with ``unplug``
        (all of them only), also the domain's vsock device.

        The domain is changed first, so a failure there leaves everything as it was.
        Returns the first removed vGPU, with all removed ones under "vgpus".
        """
        self._check_connect(connect)
        vm = self._resolve(vm)
        gone = self.slices.removable(vm, device)  # refused here, before the domain changes
        s = gone[0]
        vms = self.agent.vms
        if unplug and (vms is None or s.cid is not None):
            raise HvgpuError(f"{vm!r} is not a libvirt domain known to the agent: nothing "
                             "to unplug (run without --unplug to remove its slice)")
        if unplug and self._hybrid_listener(vm) is not None:
            raise HvgpuError(f"{vm!r} reaches the agent through the hybrid-vsock listener "
                             f"{self._hybrid_listener(vm)}, not a vsock device hvgpu added: "
                             "nothing to unplug (run without --unplug to remove its slice)")
        if unplug and device is not None:
            raise HvgpuError("--unplug removes the VM's vsock device, which all its vGPUs "
                             "use: detach them all (no --device) to unplug it")
        libvirt_vm = vms is not None and s.cid is None
        rest = [x for x in self.slices.of_vm(vm) if x not in gone]
        if libvirt_vm:  # first: the step that can fail on a live domain
            vms.unplug_regions(gone)
        if libvirt_vm and rest:
            vms.record(rest)
        elif libvirt_vm:
            vms.forget(vm, unplug)
        # the vGPUs' guests are disconnected, their executors end
        self.agent.apply(self.slices.detach(vm, device))
        d = gone[0].as_dict()
        d["vgpus"] = [g.as_dict() for g in gone]
        return d

    def resize(self, vm: str, mem=None, compute=None, device: int = 0, region=None,
               allow_time_shared: bool = False, connect: str | None = None, shm=None, *,
               _inventory=None) -> dict:
        """New limits for one vGPU. Its region (``region``) changes only while
        its guest cannot use it: a libvirt domain that is shut off (in its config), a
        VM of another kind with no CUDA connection open. A compute share that MPS will
        not enforce is refused unless ``allow_time_shared`` (see attach). ``shm``: as
        attach's."""
        region = _renamed(region, shm)
        self._check_connect(connect)
        vm = self._resolve(vm)
        if all(v in (None, "") for v in (mem, compute, region)):
            raise HvgpuError("nothing to change: give --mem, --compute and/or --region")
        old = self.slices.get(vm, device)
        key = old.key
        size = parse_mem(mem) if mem not in (None, "") else None
        share = parse_share(compute) if compute not in (None, "") else None
        region = parse_region_size(region) if region not in (None, "") else None
        self._check_sizes(size, region, _inventory, old.gpu_uuid)
        unenforced = self._unenforced(vm, share, [old.gpu_uuid], allow_time_shared)
        vms = self.agent.vms
        by_libvirt = vms is not None and old.cid is None and vms.knows(vm)
        used, executors = self.agent.slice_usage(key)
        with Transaction() as tx:
            if region is not None and region != old.region:
                if region:
                    region_name(key)  # a name too long for a file in /dev/shm is refused
                if by_libvirt:
                    vms.resize_region(old, region, tx)
                elif any(e.connections for e in executors):
                    raise HvgpuError(
                        f"cannot change the region of {key} while its guest "
                        "has CUDA connections open (the region is mapped on both sides): "
                        "end its CUDA programs, or detach the slice and attach it again with "
                        "the new --region")
            before = (old.mem, old.compute, old.region)
            change = self.slices.resize(vm, size, share, in_use=used, device=device,
                                        region=region)
            s = change.now[0] if change.now else old
            tx.on_undo(lambda: self.agent.apply(self.slices.resize(
                vm, *before[:2], device=device, region=before[2])), "slice record")
            if by_libvirt:
                vms.record(self.slices.of_vm(vm), tx)
        pending = key in self.agent.apply(change)
        d = s.as_dict()
        d["compute_enforced"] = self._enforced(s.compute, s.gpu_uuid, _inventory)
        d["pending"] = pending
        if unenforced:
            d["warning"] = self._warn_time_shared(vm, s.compute, unenforced)
        return d

    def _described(self, slices, inventory) -> list[dict]:
        """Each vGPU as a dict; a libvirt domain's with "vsock_cid", the CID libvirt gave
        it (what attach printed; "cid" is the one a VM was attached with, by --cid), and
        "compute_enforced": whether MPS enforces its compute share (None: it has none)."""
        cids: dict[str, int | None] = {}
        out = []
        for s in slices:
            d = s.as_dict()
            d["compute_enforced"] = self._enforced(s.compute, s.gpu_uuid, inventory)
            if s.cid is None and self.agent.vms is not None:
                if s.vm not in cids:
                    cids[s.vm] = self._libvirt_cid(s.vm)
                d["vsock_cid"] = cids[s.vm]
            out.append(d)
        return out

    def list(self, connect: str | None = None, *, _inventory=None) -> list[dict]:
        self._check_connect(connect)
        return self._described(self.slices.list(), _inventory)

    def status(self, connect: str | None = None, *, _inventory=None) -> list[dict]:
        """Per slice; ``utilization`` is the slice's own (its executors' share of the GPU
        as NVML last sampled it, what the guest's VGPU_UTILIZATION says; None where NVML
        has no figure for it, as under MPS), ``gpu_utilization`` the whole GPU's."""
        self._check_connect(connect)
        try:
            inventory = self._inventory(_inventory)
            util = {g.uuid: g.utilization for g in inventory}
        except HvgpuError as exc:
            inventory, util = exc, {}
        out = []
        slices = self.slices.list()
        for s, d in zip(slices, self._described(slices, inventory)):
            used, executors = self.agent.slice_usage(s.key)
            record = self.agent.registry.get(s.key)
            d.update(mem_used=used, connections=sum(e.connections for e in executors),
                     utilization=getattr(record, "util", None),
                     gpu_utilization=util.get(s.gpu_uuid),
                     executors=[{"pid": e.process.pid, "generation": e.generation,
                                 "connections": e.connections, "retiring": e.retiring,
                                 "mem_limit": e.mem, "compute_limit": e.compute,
                                 "mps": e.mps} for e in executors])
            out.append(d)
        return out
