"""The registry: what runs for every vGPU the agent serves, in one place.

Each vGPU has one record: the runtime half of it (its quota ledger's charges,
its current executor and the older ones still ending their guests'
connections, what they reported). The slice itself (limits, GPU, CID) is the
slice manager's, the one store: a record holds the immutable Slice the store
last gave it, and its ledger's limit is that slice's memory, never a copy.
The agent's loop is the only writer; it hands every StoreChange the slice
manager returns to :meth:`Registry.apply`, the one place records are made,
changed and dropped, so the list of vGPUs and their ledgers cannot drift
apart.

Must not start or stop processes (supervisor.py does), talk to sockets or
libvirt, or choose where a slice goes (slices.py).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

from hvgpu.host.names import VgpuKey
from hvgpu.host.quota import QuotaLedger
from hvgpu.host.slices import SliceManager, StoreChange
from hvgpu.host.state import Slice


@dataclass
class Executor:
    """An executor of a host-local connection (a listener bound to no VM): the
    whole GPU, no ledger."""

    process: subprocess.Popen
    peer: str
    started: float


@dataclass(eq=False)
class SliceExecutor:
    """One executor process of a vGPU; a resize under MPS or a poisoned context starts
    a newer generation, and the older one retires."""

    key: VgpuKey
    process: subprocess.Popen
    ctrl: object  # the agent's end of the executor lane
    generation: int
    mem: int
    compute: int
    mps: bool
    connections: int = 0
    retiring: bool = False
    regions_refused: int = 0  # REGION requests answered with an error (logged once)
    region_given: bool = False  # it was sent the VM's region file (and may have it mapped)
    started: float = field(default_factory=time.monotonic)
    gone: float | None = None  # when its channel ended
    record: object = field(default=None, repr=False)  # the VgpuRecord it was started for
    reported: dict = field(default_factory=dict)  # its last STATS (usage.take_stats)


@dataclass(eq=False)
class VgpuRecord:
    slice: Slice  # the store's, as of the last change applied
    ledger: QuotaLedger = field(init=False)
    current: SliceExecutor | None = None
    retiring: list[SliceExecutor] = field(default_factory=list)
    generations: int = 0  # executors started for it so far
    # What its executors did, added up over all of them (usage.take_stats): counters
    # by name, and failed calls by status name
    counters: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    util: int | None = None  # GPU utilisation of its executors, as NVML last said
    # Faults that poisoned its executors, counted while they come in quick succession,
    # and when a new executor may next be started (time.monotonic())
    faults: int = 0
    last_fault: float = 0.0
    restart_after: float = 0.0

    def __post_init__(self):
        self.ledger = QuotaLedger(lambda: self.slice.mem)  # follows resizes at once

    @property
    def key(self) -> VgpuKey:
        return self.slice.key

    def executors(self) -> list[SliceExecutor]:
        return ([self.current] if self.current is not None else []) + self.retiring

    @property
    def connections(self) -> int:
        return sum(e.connections for e in self.executors())


@dataclass
class Changes:
    """What :meth:`Registry.apply` did: new records, records whose vGPU changed (with
    the slice it had), and dropped ones (whose executors must end)."""

    added: list[VgpuRecord] = field(default_factory=list)
    changed: list[tuple[VgpuRecord, Slice]] = field(default_factory=list)
    removed: list[VgpuRecord] = field(default_factory=list)


class Registry:
    def __init__(self, slices: SliceManager | None):
        self.records: dict[VgpuKey, VgpuRecord] = {}
        self.sliced = slices is not None  # False: whole-GPU mode, no vGPUs to route to
        if slices is not None:
            self.apply(StoreChange(added=tuple(slices.list())))

    def apply(self, change: StoreChange) -> Changes:
        """Make, change and drop records as the store did."""
        done = Changes()
        for s in change.removed:
            record = self.records.pop(s.key, None)
            if record is not None:
                done.removed.append(record)
        for s in change.added:
            record = self.records.get(s.key)
            if record is None:
                record = self.records[s.key] = VgpuRecord(s)
                done.added.append(record)
            else:  # adopted over what was there: a change of that vGPU
                done.changed.append((record, record.slice))
                record.slice = s
        for before, after in change.changed:
            record = self.records.get(after.key)
            if record is None:
                record = self.records[after.key] = VgpuRecord(after)
                done.added.append(record)
            else:
                record.slice = after
                done.changed.append((record, before))
        return done

    def get(self, key: VgpuKey) -> VgpuRecord | None:
        return self.records.get(key)

    def keys_of(self, vm: str) -> list[VgpuKey]:
        return sorted(k for k in self.records if k.vm == vm)

    def connections_of(self, vm: str) -> int:
        return sum(r.connections for k, r in self.records.items() if k.vm == vm)

    def by_cid(self, cid: int) -> VgpuRecord | None:
        return next((r for k, r in sorted(self.records.items()) if r.slice.cid == cid), None)

    def executors(self) -> list[SliceExecutor]:
        return [e for r in self.records.values() for e in r.executors()]
