"""The registry: every vGPU the agent serves, and what runs for it, in one place.

Each vGPU has one record: its slice (as the slice manager keeps and persists
it), its quota ledger, its current executor and the older ones still ending
their guests' connections (retiring). The agent's loop is the only writer;
after any change of slices it calls :meth:`Registry.sync`, which is the one
place records are made, changed and dropped, so the list of vGPUs and their
ledgers cannot drift apart.

Must not start or stop processes (supervisor.py does), talk to sockets or
libvirt, or choose where a slice goes (slices.py).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field, replace

from hvgpu.host.names import VgpuKey
from hvgpu.host.quota import QuotaLedger
from hvgpu.host.slices import SliceManager
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
    slice: Slice  # as it was at the last sync
    ledger: QuotaLedger
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
    """What :meth:`Registry.sync` found: new vGPUs, vGPUs whose limits changed (with
    the slice they had), and dropped ones (whose executors must end)."""

    added: list[VgpuRecord] = field(default_factory=list)
    changed: list[tuple[VgpuRecord, Slice]] = field(default_factory=list)
    removed: list[VgpuRecord] = field(default_factory=list)


class Registry:
    def __init__(self, slices: SliceManager | None):
        self.slices = slices
        self.records: dict[VgpuKey, VgpuRecord] = {}
        if slices is not None:
            self.sync()

    def sync(self) -> Changes:
        """Bring the records in step with the slice manager; ledgers follow their
        slice's memory limit at once (accounting needs no restart)."""
        changes = Changes()
        now = {s.key: s for s in self.slices.list()} if self.slices is not None else {}
        for key in [k for k in self.records if k not in now]:
            changes.removed.append(self.records.pop(key))
        for key, s in now.items():
            record = self.records.get(key)
            if record is None:
                # a copy: the slice manager changes its slices in place
                record = self.records[key] = VgpuRecord(replace(s), QuotaLedger(s.mem))
                changes.added.append(record)
            elif record.slice != s:
                old, record.slice = record.slice, replace(s)
                record.ledger.limit = s.mem
                changes.changed.append((record, old))
        return changes

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
