"""The host agent: one loop that owns every vGPU and routes each guest to its executor.

The agent is a single thread running one selector loop. It owns the registry
(registry.py: every vGPU's slice, quota ledger, current and retiring
executors), and it alone changes it. Everything from outside enters the loop
as a typed record and waits on a future if it needs an answer: control
operations (the gRPC control lane, the CLI in-process, tests: :class:`Command`,
run by :meth:`Agent.call`), libvirt's lifecycle events and the news that
libvirtd went away (posted from libvirt's thread). Each command is written to
the audit log (logger ``hvgpu.audit``): who, what, and the result.

The loop accepts guests (router.py decides the vGPU from the transport's
identity: a vsock CID, a listener bound to ``ADDR=VM``) and hands each
connection, socket and all, to its vGPU's executor (supervisor.py starts
them: one MPS client per vGPU with the slice's limits), and answers the
executors' messages on the executor lane (executor/messages.py's table; a bad
message ends that executor, never the agent). About once a second it
publishes an immutable snapshot of what every vGPU uses (usage.py), which the
metrics server (metrics.py, with --metrics) and benchmarks read from their own
threads; a sampler thread reads NVML utilisation off the loop and posts it. It never reads guest traffic,
except the first frame of a refused peer, so one guest's copy or crash cannot
stall another; a process's exit frees everything it held on the GPU.

Must not import CUDA (executors do) or NVML (the inventory does), and must
not block on a guest or an executor.
"""

from __future__ import annotations

import inspect
import logging
import os
import selectors
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.host.executor import messages
from hvgpu.host.executor import sandbox
from hvgpu.host import arguments
from hvgpu.host import regions as regions_host
from hvgpu.host import sdnotify
from hvgpu.host.spawn import Launcher
from hvgpu.host.mps import MpsDaemon
from hvgpu.host.names import REGION_DIR, VgpuKey
from hvgpu.host.registry import Registry, SliceExecutor, VgpuRecord
from hvgpu.host.router import Router, split_binding  # noqa: F401  (split_binding: public)
from hvgpu.host.slices import NOTHING, SliceManager, StoreChange
from hvgpu.host.state import StateStore, lock_state_dir
from hvgpu.host.supervisor import Supervisor
from hvgpu.host import usage
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import Listener, receive_message, send_message

log = logging.getLogger(__name__)
audit = logging.getLogger("hvgpu.audit")

DEFAULT_CACHE_DIR = "/var/cache/hvgpu"

LIBVIRT_RETRY_FIRST, LIBVIRT_RETRY_MOST = 0.5, 30.0  # seconds between reconnect attempts

# Control operations that change nothing: audited at DEBUG (monitoring polls them).
QUERIES = frozenset({"gpus", "list", "status"})
# A vGPU's executors that may still be ending (retired after a fault or a resize, each
# with the connections that saw it) before its new connections are refused: each is a
# process and a CUDA context, which a guest could otherwise multiply by reconnecting.
MAX_RETIRING = 4
# Faults within FAULT_MEMORY s of the last count as one run; from the second on, a new
# executor waits RESTART_BACKOFF s, doubling with each, at most RESTART_BACKOFF_MOST.
FAULT_MEMORY = 300.0
RESTART_BACKOFF = 0.5
RESTART_BACKOFF_MOST = 60.0


@dataclass
class AgentConfig:
    listen: list[str] = field(default_factory=list)  # "ADDR" or "ADDR=VM"
    vsock_port: int | None = P.DEFAULT_PORT  # None: no vsock listener
    gpu: int = 0  # GPU of executors for listeners bound to no VM
    cache_dir: str | None = DEFAULT_CACHE_DIR
    state_dir: str | None = None  # slices persist here; None: no slices at all
    mps: bool = True  # start/join an MPS control daemon when it is installed
    device: str | None = None  # executor's GpuDevice factory; tests use a double
    log_level: str = "INFO"
    log_format: str = "text"  # logs.FORMATS, resolved: what executors write to our stderr
    env: dict = field(default_factory=dict)  # extra environment for executors
    connect: str | None = None  # libvirt URI; None: VMs are known by CID or bound socket only
    placement: str = "best-fit"  # slices.PLACEMENTS: how attach chooses a GPU
    max_connections_per_vm: int = 64  # open at once, over all of a VM's vGPUs
    # Executors run as this user (as root; `hvgpu agent` says "hvgpu"); None: as the
    # agent's own user (tests, the demo). See hvgpu.host.spawn.
    executor_user: str | None = None
    # MPS pipes and logs, executors' empty cwd (`hvgpu agent`: spawn.default_run_dir());
    # None: a private temporary one
    run_dir: str | None = None
    confine: str = "auto"  # executor/sandbox.MODES; "none" for tests and debugging only
    executor_read: list[str] = field(default_factory=list)  # more paths executors may read
    executor_write: list[str] = field(default_factory=list)  # ... and write (tests' doubles)
    # Regions (memfds) a host-local connection may have its executor map
    # and page-lock; a VM's limit is its slice's (hvgpu attach --region).
    local_region: int = 1 << 30
    region_dir: str = REGION_DIR  # where QEMU keeps a VM's ivshmem file (libvirt's <shmem>)
    metrics: str | None = None  # HOST:PORT to serve Prometheus metrics on; None: none
    sample_seconds: float = usage.SAMPLE_EVERY  # between NVML utilisation readings


@dataclass(eq=False)
class Command:
    """A control operation for the loop: ``run()`` there, its result or error set on
    ``future`` for the caller waiting in another thread."""

    name: str
    args: dict
    who: str
    run: Callable[[], object]
    future: Future = field(default_factory=Future)


@dataclass(frozen=True)
class LibvirtLost:
    """libvirt's connection closed (posted from libvirt's thread)."""

    reason: str


class AgentStopped(HvgpuError):
    code = "agent-stopped"


class AgentBusy(HvgpuError):
    """A change of slices from outside the agent's loop (a bug of the caller)."""

    code = "not-on-agent-loop"
    expected = False


class Agent:
    def __init__(self, config: AgentConfig, gpus: Callable | None = None, nvml=None):
        """``gpus``: the inventory (inventory.read_gpus; tests: a double); ``nvml``: a
        pynvml-like module for the utilisation sampler (tests: a double; None: pynvml)."""
        self.config = config
        self._selector = selectors.DefaultSelector()
        self.router = Router(self._selector)
        self.slices: SliceManager | None = None
        self._state_lock = None
        if config.state_dir:
            if gpus is None:
                from hvgpu.host.inventory import read_gpus as gpus
            self._state_lock = lock_state_dir(config.state_dir)  # first: before any change
            try:
                self.slices = SliceManager(StateStore(config.state_dir), gpus,
                                           config.placement)
            except BaseException:
                self._state_lock.close()
                raise
            for problem in self.slices.store.problems:
                log.warning("slice state: %s", problem)
        self.registry = Registry(self.slices)
        if self.slices is not None:
            self.slices.guard = self._check_on_loop
        self.vms = None  # VmDirectory once libvirt answers
        self._qemu_uid: int | None = None  # libvirt's QEMU user; -1: libvirt did not say
        self.libvirt_reason = "no libvirt URI configured"
        self.launcher = Launcher(config.executor_user, config.run_dir, config.cache_dir)
        self.mps = MpsDaemon(self.launcher.run_dir / "mps")
        self._mps_started = False
        self.supervisor = Supervisor(config, self.launcher, self.mps, self._watch_lane,
                                     self._unwatch)
        self._inbox: deque = deque()  # Commands, LifecycleEvents, LibvirtLost
        # reentrant: stop() may run in a signal handler while this thread holds it
        self._inbox_lock = threading.RLock()
        self._loop_thread: int | None = None
        self._stopped = False  # no command is taken any more
        self._libvirt_retry: float | None = None  # when to reconnect; None: connected
        self._libvirt_delay = LIBVIRT_RETRY_FIRST
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already means "wake up"
        # What other threads read (usage.Snapshot, immutable; replaced, never changed)
        self.snapshot: usage.Snapshot = usage.EMPTY
        self._published = 0.0
        self._gpu_readings: tuple = ()  # the sampler's latest inventory.Gpu readings
        self.sampler = usage.Sampler(lambda: self.snapshot, self.post, nvml=nvml,
                                     fallback=gpus, every=config.sample_seconds)
        self.metrics = None  # metrics.MetricsServer with --metrics

    @property
    def bindings(self) -> dict[Listener, VgpuKey]:
        return self.router.bindings

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Open every listener; raise if none could be opened, or if a binding names
        a VM by a name hvgpu refuses (before anything is opened). On a raise nothing
        stays open: no listener, socket file or state-directory lock."""
        try:
            self._start()
        except BaseException:
            self._shutdown()
            raise

    def _start(self) -> None:
        self.router.open(self.config, slices=self.slices is not None)
        self.launcher.prepare(self.config.env)  # on failure, start() closes what was opened
        if self.launcher.user.switch:
            self.mps.group = self.launcher.user.gid
            self.mps.owner = self.launcher.user.uid
        log.log(logging.WARNING if self.launcher.requested == "root" else logging.INFO,
                "executors run %s; confined by %s", self.launcher.describe(),
                sandbox.available(self.config.confine))
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        if self.slices is not None:
            if self.config.mps:
                self._mps_started = self.mps.start()
            else:
                self.mps.reason = "MPS is turned off (--no-mps); compute is time-shared"
            log.info("%d slices restored from %s", len(self.slices.list()),
                     self.slices.store.path)
            if self.config.connect:
                self._open_libvirt(self.config.connect)
        self._publish()
        if self.config.metrics:
            from hvgpu.host.metrics import MetricsServer

            self.metrics = MetricsServer(self.config.metrics, lambda: self.snapshot)
        if self.slices is not None or self.metrics is not None:
            self.sampler.start()

    def _open_libvirt(self, uri: str) -> None:
        from hvgpu.host.hypervisor import Hypervisor, start_event_loop
        from hvgpu.host.vms import VmDirectory

        try:
            start_event_loop()
            hypervisor = Hypervisor(uri)
            self.vms = VmDirectory(hypervisor)
            reconciled = self.vms.reconcile(self.slices)
            for said in reconciled.said:
                log.info("reconciled with libvirt: %s", said)
            self.apply(*reconciled.changes)
            # libvirt's thread only posts: the loop does the work
            hypervisor.watch(self.post, lambda reason: self.post(LibvirtLost(reason)))
        except HvgpuError as exc:
            self.vms = None
            self.libvirt_reason = str(exc)
            log.warning("libvirt is not available (%s); VMs can be attached by --cid only", exc)
            return
        log.info("libvirt at %s: watching domain lifecycle events", uri)

    def serve_forever(self) -> None:
        self._loop_thread = threading.get_ident()
        try:
            while not self._stop.is_set():
                timeout = 0.5
                deadline = self.router.next_deadline()
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - time.monotonic()))
                if self._libvirt_retry is not None:
                    timeout = min(timeout, max(0.0, self._libvirt_retry - time.monotonic()))
                for key, _ in self._selector.select(timeout=timeout):
                    kind, obj = key.data
                    if kind == "wake":
                        os.read(self._wake_r, 4096)
                    elif kind == "listen":
                        self._accept(obj)
                    elif kind == "refusal":
                        self.router.on_refusal(obj)
                    else:
                        self._on_lane(obj)
                self._run_inbox()
                self._reconnect_libvirt()
                self.router.expire_refusals()
                self.router.wake_listeners()
                self.supervisor.reap()
                if time.monotonic() - self._published >= usage.PUBLISH_EVERY:
                    self._publish()
        finally:
            self._shutdown()

    def stop(self) -> None:
        """From any thread (or a signal handler): the loop ends and closes everything."""
        sdnotify.stopping()  # systemd: the stop is ours, not a crash (a no-op elsewhere)
        self._stop.set()
        self._wake()

    def _check_on_loop(self) -> None:
        """Slices change on the loop only (before it runs: at start, in one thread)."""
        owner = self._loop_thread
        if owner is not None and owner != threading.get_ident() and not self._stopped:
            raise AgentBusy("slices change only on the agent's loop: call the control API "
                            "through Agent.commands (or the control socket)")

    def _wake(self) -> None:
        # Under the lock, with _shutdown closing the pipe under it too: once closed its
        # number may belong to another file, which must not get the byte.
        with self._inbox_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: a wake is pending anyway
                pass

    # -- what enters the loop from other threads --------------------------------------

    def call(self, name: str, run: Callable[[], object], args: dict | None = None,
             who: str = "in-process"):
        """Run ``run`` on the loop as the control operation ``name`` and return what it
        returns (or raise what it raised). From the loop's own thread it runs at once."""
        command = Command(name, args or {}, who, run)
        if self._stopped:
            raise AgentStopped(f"the agent has stopped; {name} was not run")
        if threading.get_ident() == self._loop_thread:
            self._execute(command)
        else:
            with self._inbox_lock:
                if self._stopped:
                    raise AgentStopped("the agent is stopping; nothing was changed")
                self._inbox.append(command)
            self._wake()
        return command.future.result()

    def post(self, record) -> None:
        """An event for the loop (libvirt's thread posts them); nobody waits for it."""
        with self._inbox_lock:
            if self._stopped:
                return
            self._inbox.append(record)
        self._wake()

    def commands(self, api, who: str = "in-process") -> "Commands":
        """``api`` (a ControlAPI) as seen from outside the loop: each method call is a
        Command run on the loop."""
        return Commands(self, api, who)

    def _run_inbox(self) -> None:
        while True:
            with self._inbox_lock:
                if not self._inbox:
                    return
                item = self._inbox.popleft()
            try:
                if isinstance(item, Command):
                    self._execute(item)
                elif isinstance(item, LibvirtLost):
                    self._on_libvirt_lost(item)
                elif isinstance(item, usage.Sampled):
                    self._on_sampled(item)
                else:
                    self._on_vm_event(item)
            except Exception:  # a bug: logged, and the loop goes on serving every VM
                log.exception("handling %r failed", item)

    def _execute(self, command: Command) -> None:
        if not command.future.set_running_or_notify_cancel():
            return
        level = logging.DEBUG if command.name in QUERIES else logging.INFO
        try:
            result = command.run()
        except HvgpuError as exc:
            _audit(level, command, f"refused ({exc.code}): {exc}")
            command.future.set_exception(exc)
            return
        except BaseException as exc:  # a bug: the caller hears of it, the agent goes on
            log.exception("control %s failed", command.name)
            _audit(level, command, f"failed: {exc!r}")
            command.future.set_exception(exc)
            return
        _audit(level, command, "ok" + _summary(result))
        command.future.set_result(result)

    # -- libvirt ---------------------------------------------------------------------

    def _on_vm_event(self, event) -> None:
        """A hypervisor.LifecycleEvent."""
        from hvgpu.host.hypervisor import EventKind

        vm = event.vm
        if self.vms is not None:
            self.vms.forget_cids()
        keys = self.registry.keys_of(vm)
        if not keys:
            return
        if event.kind is EventKind.STOPPED:
            log.info("%s stopped: releasing its slice's executors and GPU memory "
                     "(the reservation stays until hvgpu detach)", vm)
            self.release_vm(vm)
        elif event.kind in (EventKind.STARTED, EventKind.RESUMED):
            for key in keys:
                record = self.registry.get(key)
                if record.current is None:
                    log.info("%s started: restoring the executor of %s", vm, key)
                    self._start_slice(record)
        elif event.kind is EventKind.UNDEFINED:
            log.info("%s was undefined: its slice is removed", vm)
            try:
                gone = self.slices.detach(vm)
            except HvgpuError:  # it had none
                gone = NOTHING
            self.apply(gone)
        elif event.kind is EventKind.MIGRATING:
            log.error("%s is migrating: hvgpu does not support migrating a VM with a GPU "
                      "slice; its slice stays on this host and its CUDA connections will end. "
                      "hvgpu-libvirt-hook, installed as /etc/libvirt/hooks/qemu on the "
                      "destination, refuses such migrations", vm)

    def _on_libvirt_lost(self, lost: LibvirtLost) -> None:
        if self.vms is None or self._libvirt_retry is not None:
            return
        log.warning("%s; connecting again", lost.reason)
        self._libvirt_delay = LIBVIRT_RETRY_FIRST
        self._libvirt_retry = time.monotonic()

    def _reconnect_libvirt(self) -> None:
        """While libvirt's connection is lost: try again, backing off; once connected,
        reconcile, and end the executors of VMs that stopped meanwhile (their events were
        missed)."""
        if self._libvirt_retry is None or time.monotonic() < self._libvirt_retry:
            return
        try:
            reconciled = self.vms.reconnect(self.slices)  # logs what reconciling changed
            running = self.vms.running()
        except Exception as exc:  # HvgpuError as a rule; anything else must not stop the loop
            if not isinstance(exc, HvgpuError):
                log.exception("reconnecting to libvirt failed")
            log.warning("%s; trying again in %g s", exc, self._libvirt_delay)
            self._libvirt_retry = time.monotonic() + self._libvirt_delay
            self._libvirt_delay = min(self._libvirt_delay * 2, LIBVIRT_RETRY_MOST)
            return
        self._libvirt_retry = None
        self.apply(*reconciled.changes)
        for vm in sorted({k.vm for k in self.registry.records}):
            record = self.registry.get(VgpuKey(vm, 0))
            if record.slice.cid is None and vm not in running and any(
                    self.registry.get(k).executors() for k in self.registry.keys_of(vm)):
                log.info("%s stopped while libvirt's connection was down: releasing its "
                         "slice's executors", vm)
                self.release_vm(vm)
        log.info("libvirt at %s: connected again", self.vms.hv.uri)

    # -- usage: what other threads may read -----------------------------------------

    def _publish(self) -> None:
        self.snapshot = usage.snapshot(self.registry, self._gpu_readings)
        self._published = time.monotonic()

    def _on_sampled(self, sampled: usage.Sampled) -> None:
        self._gpu_readings = sampled.gpus
        for (vm, device), util in sampled.util.items():
            record = self.registry.get(VgpuKey(vm, device))
            if record is not None:
                record.util = util

    # -- guests ------------------------------------------------------------------------

    def _accept(self, listener: Listener) -> None:
        try:
            conn, peer = listener.accept()
        except OSError as exc:
            self.router.accept_failed(listener, exc)
            return
        status = P.HV_NO_SLICE
        try:
            route, detail = self.router.route(
                listener, peer, self.registry,
                self.vms.vm_for_cid if self.vms is not None else None)
            if route == "slice":
                open_now = self.registry.connections_of(detail.vm)
                record = self.registry.get(detail)
                held_back = self._held_back(record)
                if open_now < self.config.max_connections_per_vm and held_back is None:
                    self._to_slice(record, conn, peer)
                    return
                route, status = "refuse", P.HV_TOO_MANY_CONNECTIONS
                detail = held_back or (
                    f"VM {detail.vm!r} has {open_now} connections open, as many as the host "
                    "agent allows (hvgpu agent --max-connections-per-vm); close one and "
                    "connect again")
        except Exception as exc:  # one guest's failure never stops the agent
            if isinstance(exc, (HvgpuError, OSError)):
                log.error("cannot serve %s: %s", peer, exc)
            else:
                log.exception("cannot serve %s", peer)
            route, detail = "refuse", f"the agent could not serve this connection: {exc}"
        if route == "refuse":
            self.router.log_refusal(peer, detail)
            self.router.refuse(conn, peer, status, detail)
            return
        try:
            ex = self.supervisor.start_whole(conn.fileno(), peer)
        except OSError as exc:
            log.error("cannot start an executor for %s: %s", peer, exc)
            conn.close()
            return
        conn.close()  # the executor holds its own copy
        log.info("%s connected on %s: executor pid %d", peer, listener.address, ex.process.pid)

    def _to_slice(self, record: VgpuRecord, conn, peer: str) -> None:
        try:
            for attempt in (1, 2):
                ex = record.current
                if ex is None or ex.process.poll() is not None:
                    ex = self._start_slice(record)
                try:
                    send_message(ex.ctrl, messages.encode(messages.CONN, peer=peer), [conn.fileno()])
                except OSError as exc:
                    # Its lane is full (it reads none of it) or gone: it cannot serve, and
                    # must not linger outside the vGPU's books with guests of its own.
                    log.warning("slice %s: executor pid %d did not take %s (%s): ended",
                                record.key, ex.process.pid, peer, exc)
                    self.supervisor.kill(ex)
                    self._executor_gone(ex)
                    continue
                ex.connections += 1
                log.info("%s connected: slice %s, executor pid %d", peer, record.key,
                         ex.process.pid)
                break
        finally:
            conn.close()

    def _held_back(self, record: VgpuRecord) -> str | None:
        """Why a connection that needs a new executor for the vGPU cannot have one now:
        too many of its executors are still ending, or faults came in quick succession
        and the next start waits. None when it may."""
        current = record.current
        if current is not None and current.process.poll() is None:
            return None  # no new executor needed
        if len(record.retiring) >= MAX_RETIRING:
            return (f"slice {record.key} has {len(record.retiring)} executors still ending "
                    f"(after faults or resizes), as many as the agent keeps; its new "
                    "connections are refused until one ends: close the connections that saw "
                    "the fault")
        wait = record.restart_after - time.monotonic()
        if wait > 0:
            return (f"slice {record.key}'s executors hit {record.faults} faults in quick "
                    f"succession; a new one starts in {wait:.1f} s: connect again then")
        return None

    def _start_slice(self, record: VgpuRecord) -> SliceExecutor:
        old = record.current
        if old is not None:  # exited on its own: its lane ends in the loop soon
            record.current = None
            record.retiring.append(old)
        return self.supervisor.start_slice(record)

    # -- the executor lane ------------------------------------------------------------

    def _watch_lane(self, sock, ex: SliceExecutor) -> None:
        self._selector.register(sock, selectors.EVENT_READ, ("lane", ex))

    def _unwatch(self, sock) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _record_of(self, ex: SliceExecutor) -> VgpuRecord | None:
        """The vGPU it serves, while that vGPU is in the registry."""
        record = self.registry.get(ex.key)
        return record if record is not None and record is ex.record else None

    def _on_lane(self, ex: SliceExecutor) -> None:
        """One message from a slice's executor. Whatever it sends, the agent goes on:
        a message the lane does not allow is that executor's failure."""
        data, fds = receive_message(ex.ctrl)
        for fd in fds:  # no executor message carries descriptors
            os.close(fd)
        if not data and not fds:
            self._executor_gone(ex)
            return
        try:
            message, msg = messages.decode(data, len(fds), messages.TO_AGENT)
            reply = self._answer(ex, message, msg)
        except messages.LaneError as exc:
            self._executor_failed(ex, str(exc))
            return
        except BlockingIOError:  # an answer (REGION's) found the channel full
            self._executor_failed(ex, "it reads none of the agent's answers")
            return
        except Exception as exc:  # a bug here must not end every VM's service
            log.exception("slice %s: handling a message of executor pid %d failed", ex.key,
                          ex.process.pid)
            self._executor_failed(ex, f"its message could not be handled ({exc!r})")
            return
        if reply is None:
            return
        try:
            send_message(ex.ctrl, messages.encode(messages.REPLY, id=msg["id"], **reply))
        except BlockingIOError:
            self._executor_failed(ex, "it reads none of the agent's answers")
        except OSError:
            self._executor_gone(ex)

    def _answer(self, ex: SliceExecutor, message: messages.Message, msg: dict) -> dict | None:
        """The reply's fields for a request; None for a message that has none."""
        record = self._record_of(ex)
        ledger = record.ledger if record is not None else None
        if message is messages.RESERVE:
            try:
                if ledger is None:
                    raise CudaError(P.HV_NO_SLICE, f"the slice {str(ex.key)!r} was detached")
                ledger.reserve(ex, msg["n"])
                return {"ok": True}
            except CudaError as exc:
                return {"ok": False, "status": exc.status,
                        "message": exc.detail[:messages.REPLY_MESSAGE_MAX]}
        if message is messages.USAGE:
            reply = {"used": ledger.used if ledger else 0, "limit": ledger.limit if ledger else 0}
            if record is not None and record.util is not None:
                reply["util"] = record.util
            return reply
        if message is messages.VGPUS:  # the guest's device count: every vGPU of the VM
            return {"count": len(self.registry.keys_of(ex.key.vm))}
        if message is messages.REGION:
            self._send_region(ex, record, msg["id"])
            return None
        if message is messages.RELEASE:
            if ledger is not None:
                ledger.release(ex, msg["n"])
        elif message is messages.STATS:
            if record is not None:
                usage.take_stats(record, ex, msg)
        elif message is messages.CLOSED:
            ex.connections = max(0, ex.connections - 1)
            log.info("%s disconnected from slice %s", msg["peer"], ex.key)
        elif message is messages.POISONED:
            log.warning("slice %s: executor pid %d hit %s, which poisons every CUDA context "
                        "of its process; the VM's next connections get a new executor, its %d "
                        "open ones keep the error until they close", ex.key, ex.process.pid,
                        P.status_name(msg["status"]), ex.connections)
            self.supervisor.retire(record, ex)
            if record is not None:
                now = time.monotonic()
                record.faults = record.faults + 1 if now - record.last_fault < FAULT_MEMORY \
                    else 1
                record.last_fault = now
                if record.faults > 1:  # the first fault restarts at once; a loop slows down
                    record.restart_after = now + min(RESTART_BACKOFF_MOST, RESTART_BACKOFF
                                                     * 2 ** (record.faults - 2))
        return None

    def _region_owners(self) -> frozenset[int]:
        """Who besides root may own a VM's region file: libvirt's QEMU user (asked once)."""
        if self._qemu_uid is None and self.vms is not None:
            self._qemu_uid = self.vms.hv.qemu_uid() or -1
        return frozenset({self._qemu_uid} if self._qemu_uid not in (None, -1) else ())

    def _send_region(self, ex: SliceExecutor, record: VgpuRecord | None, rid: int) -> None:
        """The VM's region device file, opened here (executors open no host
        file): the one its slice names, a regular file of the slice's size, never a
        link."""
        try:
            slice_ = self.slices.by_key(ex.key) if record is not None else None
            # Each executor keeps its own book of the region's rooms: two of one vGPU
            # (a newer generation after a resize or a fault) would give two programs
            # the same bytes. The newer one has it once the older one has ended.
            others = [*(record.executors() if record else ()), *self.supervisor.released,
                      *self.supervisor.ending]
            older = [e for e in others if e is not ex and e.key == ex.key and e.region_given
                     and e.process.poll() is None]
            if older:
                raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                                f"the VM's region is in use by an older "
                                f"executor of the vGPU (pid {older[0].process.pid}) until "
                                "its programs end; copies travel on the socket meanwhile")
            fd, size = regions_host.open_region(self.config.region_dir, ex.key, slice_,
                                                self._region_owners())
        except CudaError as exc:
            # Each guest REGION_ATTACH may ask again: said once per executor, not per ask.
            ex.regions_refused += 1
            log.log(logging.WARNING if ex.regions_refused == 1 else logging.DEBUG,
                    "slice %s: no region for its guest: %s", ex.key,
                    exc.detail)
            send_message(ex.ctrl, messages.encode(messages.REPLY, id=rid, ok=False, status=exc.status,
                                              message=exc.detail[:messages.REPLY_MESSAGE_MAX]))
            return
        ex.region_given = True
        try:
            send_message(ex.ctrl, messages.encode(messages.REGION_FD, id=rid, size=size), [fd])
        finally:
            os.close(fd)

    def _executor_failed(self, ex: SliceExecutor, why: str) -> None:
        """An executor sent what the lane does not allow: it may be compromised. Kill
        it, release what it held; the VM's next connection starts a new one."""
        log.error("slice %s: executor pid %d sent a bad message on the executor lane (%s): "
                  "killed; its guests' connections end, its reservations are released and "
                  "the VM's next connection gets a new executor", ex.key, ex.process.pid, why)
        self.supervisor.kill(ex)
        self._executor_gone(ex)

    def _executor_gone(self, ex: SliceExecutor) -> None:
        """Its lane ended: forget it now; the supervisor collects its exit."""
        freed = self.supervisor.gone(self._record_of(ex), ex)
        log.info("slice %s: executor pid %d left; %d MiB of its reservations released",
                 ex.key, ex.process.pid, freed >> 20)

    # -- slice changes (the control API, on the loop) --------------------------------

    def apply(self, *changes: StoreChange) -> set[VgpuKey]:
        """After the slice manager changed (each StoreChange it returned, in order): bring
        the registry and executors in step; returns the vGPUs whose open connections
        keep older MPS limits for now."""
        pending: set[VgpuKey] = set()
        for change in changes:
            pending |= self._act(self.registry.apply(change))
        return pending

    def _act(self, changes) -> set[VgpuKey]:
        """Act on what changed in the registry: a dropped vGPU's guests are disconnected
        and its executors end; a vGPU whose limits changed keeps serving under the new
        memory limit at once, and under MPS (whose limits are fixed per process) its
        executor retires so new connections get the new limits. Returns the vGPUs whose
        open connections keep older MPS limits for now."""
        pending = set()
        for record in changes.removed:
            self.supervisor.end(record)
        for record, old in changes.changed:
            ex = record.current
            s = record.slice
            if ex is None or not ex.mps or (ex.mem, ex.compute) == (s.mem, s.compute):
                continue
            self.supervisor.retire(record, ex)
            if ex.connections > 0:
                pending.add(record.key)
        return pending

    def release_vm(self, vm: str) -> None:
        """End the executors of every vGPU of a VM; its slices and ledgers stay."""
        for key in self.registry.keys_of(vm):
            self.supervisor.end(self.registry.get(key))

    def slice_usage(self, key: VgpuKey) -> tuple[int, list[SliceExecutor]]:
        record = self.registry.get(key)
        if record is None:
            return 0, []
        return record.ledger.used, record.executors()

    # -- the end -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        with self._inbox_lock:
            self._stopped = True
            waiting, self._inbox = list(self._inbox), deque()
        for item in waiting:
            if isinstance(item, Command) and item.future.set_running_or_notify_cancel():
                item.future.set_exception(AgentStopped("the agent stopped before running "
                                                       f"{item.name}; nothing was changed"))
        self.sampler.stop()
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        self.router.close()
        self.supervisor.shutdown(self.registry.executors())
        for record in self.registry.records.values():
            record.current, record.retiring = None, []
        if self._mps_started:
            self.mps.stop()
            self._mps_started = False
        if self.vms is not None:  # its callbacks would keep posting to a stopped agent
            try:
                self.vms.hv.close()
            except HvgpuError:
                pass
        with self._inbox_lock:
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._wake_r = self._wake_w = -1
        try:
            self._selector.close()
        except (OSError, ValueError):
            pass
        if self._state_lock is not None:
            self._state_lock.close()
            self._state_lock = None
        self.launcher.close()  # any executor still alive ends on its lifeline
        log.info("agent stopped")


class Commands:
    """A ControlAPI seen from outside the agent's loop: calling one of its methods
    posts a Command and waits for its result. ``who`` names the caller in the audit
    log."""

    def __init__(self, agent: Agent, api, who: str = "in-process"):
        self._agent, self._api, self._who = agent, api, who

    def as_caller(self, who: str) -> "Commands":
        return Commands(self._agent, self._api, who)

    def __getattr__(self, name: str):
        method = getattr(self._api, name)
        if name.startswith("_") or not callable(method):
            raise AttributeError(name)

        signature = inspect.signature(method)

        def call(*args, **kwargs):
            try:
                if "_inventory" in kwargs:
                    raise TypeError("got an unexpected keyword argument '_inventory'")
                named = dict(signature.bind(*args, **kwargs).arguments)
                arguments.check(method, named)
            except TypeError as exc:  # as the method itself would say, and audited
                refused = TypeError(f"{name}: {exc}")
                _audit(logging.INFO, Command(name, kwargs, self._who, None),
                       f"refused (bad-request): {refused}")
                raise refused from None
            if "_inventory" in signature.parameters:
                kwargs["_inventory"] = self._api.read_inventory()  # NVML: here, not on the loop
            return self._agent.call(name, lambda: method(*args, **kwargs), named, self._who)
        return call


AUDIT_VALUE_MAX = 200  # characters of one argument in an audit line
AUDIT_RESULT_MAX = 600  # ... and of the result or the refusal


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most] + f"... ({len(text)} characters)"


def _audit(level: int, command: Command, result: str) -> None:
    """One line per control operation: who, what, the result. Every argument and the
    result are clipped and newlines escaped (reprs), so it stays one journal record."""
    args = " ".join(f"{k}={_clip(repr(v), AUDIT_VALUE_MAX)}" for k, v in command.args.items()
                    if v not in (None, False))
    result = _clip(result.replace("\n", " ").replace("\r", " "), AUDIT_RESULT_MAX)
    audit.log(level, "control %s by %s: %s -> %s", _clip(command.name, 40),
              _clip(command.who, 160), args, result)


def _summary(result) -> str:
    """A few words of a command's result for the audit line."""
    if isinstance(result, dict):
        several = result.get("vgpus")
        if several:
            return ": " + ", ".join(f"{v['vm']}#{v['device']} on GPU {v['gpu_index']} "
                                    f"({v['mem']} bytes, {v['compute']}%)" for v in several)
        if "vm" in result and "mem" in result:
            return (f": {result['vm']}#{result.get('device', 0)} {result['mem']} bytes, "
                    f"{result.get('compute', 0)}%")
    if isinstance(result, list):
        return f": {len(result)} entries"
    return ""


def default_state_dir() -> str:
    """/var/lib/hvgpu for root, ~/.local/state/hvgpu otherwise."""
    if os.geteuid() == 0:
        return "/var/lib/hvgpu"
    return str(Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "hvgpu")


def default_cache_dir() -> str:
    """/var/cache/hvgpu for root, ~/.cache/hvgpu otherwise."""
    if os.geteuid() == 0:
        return DEFAULT_CACHE_DIR
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hvgpu")
