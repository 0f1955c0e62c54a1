"""What each vGPU and GPU uses, as immutable snapshots, and the sampler of utilisation.

The agent's loop adds up what each executor reports on the executor lane
(:func:`take_stats`) into its vGPU's record, and publishes a :class:`Snapshot`
of every vGPU and GPU about once a second (:func:`snapshot`). Other threads
(the metrics server, a benchmark) read the latest snapshot and nothing else:
they never touch the registry while the loop changes it, and never wait for
the loop.

The :class:`Sampler` thread reads NVML (through inventory.Sampling, which owns
it) for the executors' processes named in the latest snapshot, and posts what
it read to the loop (Agent.post), which keeps it in the records: each vGPU's
utilisation (the lane's USAGE answer carries it to the guest) and the GPUs'
memory and utilisation. Its reading of the GPUs (:class:`Readings`) says whether
NVML answered, so that a host without a GPU (NVML answers, no GPU) and a broken
one (NVML cannot be opened or read) are told apart.

Must not import NVML (inventory.py does) or prometheus-client (metrics.py
does), change a vGPU, or block the agent's loop.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from hvgpu import __version__
from hvgpu.errors import HvgpuError
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

COUNTERS = ("launches", "round_trips", "to_gpu", "from_gpu")
UNKNOWN_STATUS = "UNKNOWN"  # a status no table names: counted together, one series
PUBLISH_EVERY = 1.0  # seconds between the loop's snapshots
SAMPLE_EVERY = 2.0  # seconds between NVML readings
NVML_RETRY = 60.0  # seconds before trying NVML again where it could not be opened


@dataclass(frozen=True)
class VgpuUsage:
    vm: str
    device: int
    gpu: int  # the GPU's index
    uuid: str  # the GPU's UUID
    limit: int  # bytes of its memory quota
    used: int  # bytes its executors reserved in its ledger (what the driver allocated)
    compute: int  # percent of the SMs (0: none reserved, time-shared)
    connections: int
    launches: int
    round_trips: int
    to_gpu: int  # bytes copied to the GPU
    from_gpu: int  # ... and back
    restarts: int  # executors started for it after its first
    errors: tuple  # ((status name, calls that failed with it), ...)
    pids: tuple  # its executors' processes now
    util: int | None  # percent, from NVML's per-process figures; None: no figure


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    name: str
    memory_total: int | None  # None: NVML not read (yet)
    memory_used: int | None
    memory_reserved: int  # the slices' quotas on it
    utilization: int | None


@dataclass(frozen=True)
class Snapshot:
    taken: float  # time.time() when the loop made it
    slices: int  # vGPUs (each is a slice of one GPU)
    vgpus: tuple = ()
    gpus: tuple = ()
    version: str = __version__
    gpus_read: int | None = None  # GPUs in the sampler's latest reading; None: none yet
    nvml: bool | None = None  # whether that reading came from NVML; None: none yet
    nvml_error: str = ""  # why it did not


class Readings(tuple):
    """The sampler's reading of the GPUs: a tuple of inventory.Gpu that also says
    where it came from. ``nvml``: True when NVML answered; False when NVML could not
    be opened or read (``why`` says what failed; the GPUs are then the fallback's, the
    agent's inventory, without memory in use or utilisation). The agent keeps it as
    it came and hands it to :func:`snapshot`; before the first reading it holds a
    plain ``()``."""

    def __new__(cls, gpus=(), *, nvml: bool, why: str = ""):
        self = super().__new__(cls, gpus)
        self.nvml, self.why = nvml, why
        return self


EMPTY = Snapshot(0.0, 0)


@dataclass(frozen=True)
class Sampled:
    """What the sampler read, posted to the loop: the GPUs (:class:`Readings`) and
    each vGPU's utilisation ((vm, device) -> percent or None)."""

    gpus: tuple
    util: dict


def status_label(status: int) -> str:
    return P.status_name(status) if status in P.STATUSES else UNKNOWN_STATUS


def take_stats(record, ex, msg: dict) -> None:
    """Add what an executor's STATS says it did since its previous one to its vGPU's
    counters. Reports are totals since that executor started; a smaller number than
    it reported before changes nothing (counters never go back), and statuses are
    named by the table (the rest as one), so what a broken executor sends can neither
    lower a counter nor grow the number of series."""
    seen = ex.reported
    for name in COUNTERS:
        new, old = msg[name], seen.get(name, 0)
        if new > old:
            record.counters[name] = record.counters.get(name, 0) + new - old
            seen[name] = new
    errors: dict[str, int] = {}
    for key, n in msg["errors"].items():
        label = status_label(int(key))
        errors[label] = errors.get(label, 0) + n
    before = seen.setdefault("errors", {})
    for label, new in errors.items():
        old = before.get(label, 0)
        if new > old:
            record.errors[label] = record.errors.get(label, 0) + new - old
            before[label] = new


def snapshot(registry, gpus: tuple) -> Snapshot:
    """Every vGPU and GPU as the loop knows them now (call on the loop). ``gpus``: the
    sampler's latest reading (:class:`Readings`; a plain tuple: nothing read yet)."""
    vgpus, reserved, seen = [], {}, {}
    for key, record in sorted(registry.records.items()):
        s = record.slice
        reserved[s.gpu_uuid] = reserved.get(s.gpu_uuid, 0) + s.mem
        seen.setdefault(s.gpu_uuid, s.gpu_index)
        c = record.counters
        vgpus.append(VgpuUsage(
            vm=key.vm, device=key.device, gpu=s.gpu_index, uuid=s.gpu_uuid,
            limit=record.ledger.limit, used=record.ledger.used, compute=s.compute,
            connections=record.connections, launches=c.get("launches", 0),
            round_trips=c.get("round_trips", 0), to_gpu=c.get("to_gpu", 0),
            from_gpu=c.get("from_gpu", 0), restarts=max(0, record.generations - 1),
            errors=tuple(sorted(record.errors.items())),
            # An MPS client's work is the MPS server's in NVML's per-process figures: a
            # vGPU served under MPS has no figure of its own (None, never a 0).
            pids=tuple(e.process.pid for e in record.executors() if not e.mps),
            util=record.util))
    out = [GpuUsage(g.index, g.uuid, g.name, g.memory_total, g.memory_used,
                    reserved.get(g.uuid, 0), g.utilization) for g in gpus]
    read = {g.uuid for g in gpus}
    out += [GpuUsage(index, uuid, "", None, None, reserved[uuid], None)
            for uuid, index in seen.items() if uuid not in read]
    nvml = getattr(gpus, "nvml", None)
    return Snapshot(time.time(), len(vgpus), tuple(vgpus), tuple(out),
                    gpus_read=None if nvml is None else len(gpus), nvml=nvml,
                    nvml_error=getattr(gpus, "why", ""))


class Sampler:
    """A thread reading NVML every ``every`` seconds; it posts :class:`Sampled`.

    ``latest``: the loop's latest snapshot (which processes are whose);
    ``post``: Agent.post; ``nvml``: a pynvml-like module (tests' double), else
    pynvml; ``fallback``: where GPUs are read when NVML cannot be opened (the
    agent's inventory, a test double's)."""

    def __init__(self, latest: Callable[[], Snapshot], post: Callable[[object], None],
                 nvml=None, fallback: Callable | None = None, every: float = SAMPLE_EVERY):
        self.latest, self.post, self.nvml, self.fallback = latest, post, nvml, fallback
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._source = None
        self._retry = 0.0  # when to try opening NVML again
        self._said = False
        self._why = ""  # why NVML was not read, when it was not

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="hvgpu-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends soon (an NVML call under way finishes first; nobody waits for it)."""
        self._stop.set()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.every):
                try:
                    self.post(self.sample())
                except Exception:  # a reading lost is a metric late, never the agent's end
                    log.debug("reading GPU utilisation failed", exc_info=True)
                    self._close()
        finally:
            self._close()

    def _close(self) -> None:
        source, self._source = self._source, None
        if source is not None:
            source.close()
            self._retry = time.monotonic() + NVML_RETRY

    def _open(self):
        if self._source is None and time.monotonic() >= self._retry:
            from hvgpu.host.inventory import Sampling

            try:
                self._source = Sampling(self.nvml)
            except HvgpuError as exc:
                self._why = str(exc)
                self._retry = time.monotonic() + NVML_RETRY
                if not self._said:
                    self._said = True
                    log.info("no GPU utilisation for metrics: %s", exc)
        return self._source

    def sample(self) -> Sampled:
        snap = self.latest()
        source = self._open()
        gpus = None
        if source is not None:
            try:
                gpus = Readings(source.gpus(), nvml=True)
            except Exception as exc:  # NVML opened, then failed: a broken driver or GPU
                self._why = f"reading the GPUs through NVML failed: {exc}"
                log.warning("metrics: %s (tried again in %.0f s)", self._why, NVML_RETRY)
                self._close()
                source = None
        if gpus is None:
            try:
                found = tuple(self.fallback()) if self.fallback is not None else ()
            except HvgpuError:
                found = ()
            gpus = Readings(found, nvml=False, why=self._why)
        figures: dict[int, dict | None] = {}
        util = {}
        for v in snap.vgpus:
            if source is None:
                util[(v.vm, v.device)] = None
                continue
            if v.gpu not in figures:
                figures[v.gpu] = source.process_utilization(v.gpu)
            known = figures[v.gpu] or {}
            ours = [known[pid] for pid in v.pids if pid in known]
            util[(v.vm, v.device)] = min(100, sum(ours)) if ours else None
        return Sampled(gpus, util)
