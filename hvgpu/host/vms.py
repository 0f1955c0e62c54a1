"""libvirt-managed VMs and their slices: the steps between the slice manager
and ``hypervisor``.

Finds which VM a vsock CID belongs to (libvirt assigns automatic CIDs at each
start, so this is looked up, never stored), plugs the vsock device, a
region device per vGPU that has a region, and writes the slice into the
domain when a slice is attached, and reconciles the agent's state with the
domains' metadata at start and after a lost connection to libvirt is regained.

A region's file in /dev/shm is QEMU's: it creates it when the device appears,
and neither it nor libvirt removes it when the device or the domain goes. So
a file left there is removed before its device is added again (QEMU would use
it as it is: an old size it refuses to grow, the old bytes) and after the
device is removed (it holds host RAM and the guest's data).

Must not import libvirt or hold its objects (``hypervisor`` does; its ``Domain``
is what this module handles) or decide placement (the slice manager does).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.hypervisor import Domain, Hypervisor, NoSuchVm, Scope
from hvgpu.host.names import BadDevice, BadVmName, VgpuKey, region_name, region_path
from hvgpu.host.slices import SliceManager, StoreChange
from hvgpu.host.state import Slice
from hvgpu.host.transaction import Transaction

log = logging.getLogger(__name__)


class RegionBusy(HvgpuError):
    code = "shm-live"


@dataclass
class Reconciled:
    """What reconciling with libvirt said (each line for the log) and the changes of
    the slice manager it made, for the agent to apply."""

    said: list[str] = field(default_factory=list)
    changes: list[StoreChange] = field(default_factory=list)


_COMPARED = ("gpu_uuid", "gpu_index", "mem", "compute", "region")


def _differences(mine: list[Slice], recorded: list) -> list[str]:
    """How a domain's recorded vGPUs differ from the agent's, in words ([]: they agree)."""
    if not recorded:
        return ["no record"]
    theirs = {d.device: d for d in recorded}
    out = []
    if sorted(theirs) != [s.device for s in mine]:
        out.append(f"the domain records {len(theirs)} vGPU(s), the agent has {len(mine)}")
    for s in mine:
        d = theirs.get(s.device)
        if d is None:
            continue
        for name in _COMPARED:
            if getattr(d, name) != getattr(s, name):
                out.append(f"vGPU {s.device}'s {name}: the domain said {getattr(d, name)!r}, "
                           f"the agent has {getattr(s, name)!r}")
    return out


class VmDirectory:
    def __init__(self, hypervisor: Hypervisor):
        self.hv = hypervisor
        self._cids: dict[int, str] = {}
        self._lock = threading.Lock()

    def knows(self, vm: str) -> bool:
        try:
            self.hv.domain(vm)
        except NoSuchVm:
            return False
        return True

    def canonical(self, name_or_uuid: str) -> str:
        """The domain's name, given its name or its UUID; NoSuchVm when there is none."""
        return self.hv.domain(name_or_uuid).name

    def vsock_cid(self, vm: str) -> int | None:
        """The CID of the domain's vsock device (None: none, or not yet assigned)."""
        return self.hv.domain(vm).vsock_cid()

    def vm_for_cid(self, cid: int) -> str | None:
        with self._lock:
            vm = self._cids.get(cid)
        if vm is not None:
            return vm
        found = {}
        for dom in self.hv.domains():
            if not dom.is_active():
                continue
            c = dom.vsock_cid()
            if c is not None:
                found[c] = dom.name
        with self._lock:
            self._cids = found
        return found.get(cid)

    def forget_cids(self) -> None:
        with self._lock:
            self._cids = {}

    def prepare(self, vm: str, tx: Transaction,
                hybrid_for: Callable[[str], str | None] = lambda name: None
                ) -> tuple[str, str | None]:
        """Give the domain a vsock device if it has none; returns its canonical name and
        the hybrid-vsock listener bound to it (``hybrid_for(name)``), if any.

        A VM with such a listener has a vhost-user vsock (vhost-device-vsock,
        Firecracker, Cloud Hypervisor) that libvirt does not see, and a second, kernel
        vsock device would be no use to it (a guest has one vsock transport to its
        host), so nothing is hot-plugged.
        """
        dom = self.hv.domain(vm)
        hybrid = hybrid_for(dom.name)
        if hybrid is not None:
            log.info("%s: served by the hybrid-vsock listener %s; no vsock device is "
                     "hot-plugged", dom.name, hybrid)
        elif dom.plug_vsock():
            tx.on_undo(dom.unplug_vsock, "vsock hot-plug")
        return dom.name, hybrid

    # -- regions --------------------------------------------------------

    def plug_regions(self, vgpus: list[Slice], tx: Transaction) -> None:
        """Give each vGPU that has a region its ivshmem-plain device, live when the domain
        runs and in its config; each undone in reverse if a later step fails."""
        for s in vgpus:
            if not s.region:
                continue
            dom = self.hv.domain(s.vm)
            name = region_name(s.key)
            if dom.shmem_size(name, live=True) is None:
                self._remove_region_file(s.key, stale=True)  # no QEMU of this domain maps it
            added = dom.plug_shmem(name, s.region)
            if added:
                tx.on_undo(lambda d=dom, k=s.key, a=added: self._unplug(d, k, a),
                           f"region device {name}")

    def unplug_regions(self, vgpus: list[Slice]) -> None:
        """Remove the devices of these vGPUs' regions (live and from the config) and their
        files. A retry after a failure goes on where it stopped."""
        for s in sorted(vgpus, key=lambda s: -s.device):
            if not s.region:
                continue
            try:
                dom = self.hv.domain(s.vm)
            except NoSuchVm:
                continue
            self._unplug(dom, s.key)

    def resize_region(self, s: Slice, region: int, tx: Transaction) -> None:
        """Give the vGPU's region ``region`` bytes (0: none) in the domain's config. ivshmem
        cannot be resized live, so a running domain is refused with what to do instead."""
        dom = self.hv.domain(s.vm)
        if dom.is_active():
            raise RegionBusy(
                f"cannot change the region of {s.key} while {dom.name} runs: "
                "an ivshmem device cannot be resized live. Stop the guest (virsh shutdown "
                f"{dom.name}) and resize again, or detach the slice and attach it again "
                "with the new --region")
        name, old = region_name(s.key), s.region
        if old:
            if self._unplug(dom, s.key):
                tx.on_undo(lambda: dom.plug_shmem(name, old),
                           f"region device {name}")
        if region:
            self.plug_regions([Slice(**{**s.as_dict(), "region": region})], tx)

    def _unplug(self, dom: Domain, key: VgpuKey, only: Scope | None = None) -> Scope:
        removed = dom.unplug_shmem(region_name(key), only)
        # Also while QEMU still maps it (a guest releases a device at its own pace): the
        # mapping outlives the name, and the RAM is freed when QEMU lets go of it.
        self._remove_region_file(key)
        return removed

    def _remove_region_file(self, key: VgpuKey, stale: bool = False) -> None:
        """Remove /dev/shm/hvgpu-VM[#N] when the domains are this host's. ``stale``: before
        its device is added, when a file that stays would be used by QEMU as it is, so
        one that cannot be removed stops the attach."""
        if not self.hv.is_local():
            return
        path = region_path(key)
        try:
            os.unlink(path)  # never follows a link: a link planted there goes, not its target
        except FileNotFoundError:
            return
        except OSError as exc:
            if not stale:
                log.warning("%s: cannot remove the region file %s: %s", key, path, exc)
                return
            raise HvgpuError(f"{path} is left from an earlier run of {key.vm} and cannot be "
                             f"removed ({os.strerror(exc.errno or errno.EIO)}); QEMU would map "
                             "it as it is: remove it (as root), then attach again") from None
        log.info("%s: region file %s removed", key, path)

    # -- slice metadata ---------------------------------------------------------------

    def record(self, vgpus: list[Slice], tx: Transaction | None = None) -> None:
        """Write all of one VM's vGPUs (device 0 first) into its domain."""
        first, *more = sorted(vgpus, key=lambda s: s.device)
        dom = self.hv.domain(first.vm)
        before = dom.read_vgpus() if tx is not None else []
        dom.write_slice(first.gpu_uuid, first.gpu_index, first.mem, first.compute,
                        [dict(device=s.device, gpu_uuid=s.gpu_uuid, gpu_index=s.gpu_index,
                              mem=s.mem, compute=s.compute, region=s.region) for s in more],
                        region=first.region)
        if tx is not None:
            tx.on_undo(lambda: self._restore(dom, before), "slice metadata")

    @staticmethod
    def _restore(dom: Domain, before: list) -> None:
        if not before:
            dom.clear_slice()
            return
        first, *more = before
        dom.write_slice(first.gpu_uuid, first.gpu_index, first.mem, first.compute,
                        [vars(d) for d in more], region=first.region)

    def forget(self, vm: str, unplug: bool) -> None:
        try:
            dom = self.hv.domain(vm)
        except NoSuchVm:
            return
        if unplug:  # first: the step that can fail on a live domain
            dom.unplug_vsock()
        dom.clear_slice()

    def running(self) -> set[str]:
        """The names of the domains that run now."""
        return {d.name for d in self.hv.domains() if d.is_active()}

    def reconnect(self, slices: SliceManager) -> "Reconciled":
        """After the connection to libvirt was lost: connect again, then reconcile (a
        domain may have been undefined, or its metadata changed, while nobody listened).
        What it said is also logged; raises Unreachable while libvirtd is down."""
        self.hv.reconnect()
        self.forget_cids()  # CIDs may have been reassigned meanwhile
        reconciled = self.reconcile(slices)
        for said in reconciled.said:
            log.info("reconciled with libvirt after reconnecting: %s", said)
        return reconciled

    def reconcile(self, slices: SliceManager) -> "Reconciled":
        """Make the agent's state and the domains' metadata agree, value by value; says
        what differed and what was done, and returns the slice manager's changes for
        the agent to apply.

        A slice recorded on a domain but missing here is restored; one here whose
        domain lacks the record, or records other values (another size, share, GPU or
        region, or another number of vGPUs), gets the agent's written, since the agent's
        state is what its guests are served by; a slice of a domain that no longer
        exists (and that was not attached by CID) is removed.
        """
        said: list[str] = []
        changes: list[StoreChange] = []
        recorded: dict[str, list] = {}
        for d in self.hv.recorded_slices():
            try:
                VgpuKey.of(d.vm, d.device)
            except (BadVmName, BadDevice) as exc:
                log.warning("domain %r carries hvgpu metadata that is ignored: %s", d.vm, exc)
                said.append(f"{d.vm!r}: its metadata was ignored ({exc})")
                continue
            recorded.setdefault(d.vm, []).append(d)
        known: dict[str, list[Slice]] = {}
        for s in slices.list():
            known.setdefault(s.vm, []).append(s)
        for vm, ds in recorded.items():
            if vm not in known:
                for d in ds:
                    changes.append(slices.adopt(Slice(
                        vm=vm, gpu_uuid=d.gpu_uuid, gpu_index=d.gpu_index, mem=d.mem,
                        compute=d.compute, device=d.device, region=d.region)))
                said.append(f"{vm}: slice restored from the domain's metadata"
                            + (f" ({len(ds)} vGPUs)" if len(ds) > 1 else ""))
        for vm, mine in known.items():
            differs = _differences(mine, recorded.get(vm, []))
            if not differs:
                continue
            if self.knows(vm):
                self.record(mine)
                said.append(f"{vm}: slice written into the domain's metadata"
                            + (f" ({'; '.join(differs)})" if vm in recorded else ""))
            elif mine[0].cid is None:
                changes.append(slices.detach(vm))
                said.append(f"{vm}: the domain no longer exists; its slice was removed")
        return Reconciled(said, changes)
