"""libvirt-managed VMs and their slices: the steps between the slice manager
and ``hypervisor``.

Finds which VM a vsock CID belongs to (libvirt assigns automatic CIDs at each
start, so this is looked up, never stored), plugs the vsock device and writes
the slice into the domain when a slice is attached, reconciles the agent's
state with the domains' metadata at start, and turns lifecycle events into
agent actions. Must not import libvirt (``hypervisor`` does) or decide
placement (the slice manager does).
"""

from __future__ import annotations

import logging
import threading

from hvgpu.host.hypervisor import Hypervisor, NoSuchVm
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import Slice
from hvgpu.host.transaction import Transaction

log = logging.getLogger(__name__)


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

    def vm_for_cid(self, cid: int) -> str | None:
        with self._lock:
            vm = self._cids.get(cid)
        if vm is not None:
            return vm
        found = {}
        for dom in self.hv.conn.listAllDomains():
            if not dom.isActive():
                continue
            c = self.hv.vsock_cid(dom)
            if c is not None:
                found[c] = dom.name()
        with self._lock:
            self._cids = found
        return found.get(cid)

    def forget_cids(self) -> None:
        with self._lock:
            self._cids = {}

    def prepare(self, vm: str, tx: Transaction) -> str:
        """Give the domain a vsock device if it has none; returns its canonical name."""
        dom = self.hv.domain(vm)
        if self.hv.plug_vsock(dom):
            tx.on_undo(lambda: self.hv.unplug_vsock(dom), "vsock hot-plug")
        return dom.name()

    def record(self, s: Slice, tx: Transaction | None = None) -> None:
        dom = self.hv.domain(s.vm)
        self.hv.write_slice(dom, s.gpu_uuid, s.gpu_index, s.mem, s.compute)
        if tx is not None:
            tx.on_undo(lambda: self.hv.clear_slice(dom), "slice metadata")

    def forget(self, vm: str, unplug: bool) -> None:
        try:
            dom = self.hv.domain(vm)
        except NoSuchVm:
            return
        if unplug:  # first: the step that can fail on a live domain
            self.hv.unplug_vsock(dom)
        self.hv.clear_slice(dom)

    def reconcile(self, slices: SliceManager) -> list[str]:
        """Make the agent's state and the domains' metadata agree; says what changed.

        A slice recorded on a domain but missing here is restored; one here whose
        domain lacks the record gets it written; a slice of a domain that no
        longer exists (and that was not attached by CID) is removed.
        """
        changes = []
        recorded = {d.vm: d for d in self.hv.recorded_slices()}
        known = {s.vm: s for s in slices.list()}
        for vm, d in recorded.items():
            if vm not in known:
                slices.adopt(Slice(vm=vm, gpu_uuid=d.gpu_uuid, gpu_index=d.gpu_index,
                                   mem=d.mem, compute=d.compute))
                changes.append(f"{vm}: slice restored from the domain's metadata")
        for vm, s in known.items():
            if vm in recorded:
                continue
            if self.knows(vm):
                self.record(s)
                changes.append(f"{vm}: slice written into the domain's metadata")
            elif s.cid is None:
                slices.detach(vm)
                changes.append(f"{vm}: the domain no longer exists; its slice was removed")
        return changes
