"""The host agent: accept guests, route each to its slice's executor.

The agent listens on vsock and any configured unix / hybrid-vsock / tcp
address and learns each peer's identity from the transport. A connection that
belongs to a slice (a vsock CID attached with ``--cid``, or a listener bound to
a VM with ``ADDR=VM``) is handed, socket and all, to that slice's executor
process: one MPS client per slice, started with the slice's limits, whose
memory reservations the agent keeps in the slice's ledger. A connection on a
listener bound to no VM gets an executor of its own with the whole GPU
(host-local use). A vsock peer with no slice, or a VM past its limit of open
connections, is refused with a clear error: from the agent's loop, which reads
at most the first frame of such a peer, for at most two seconds, and never
starts a thread for it. Otherwise the agent never reads guest traffic, so one
guest's copy or crash cannot stall another; a process's exit frees everything
it held on the GPU. Every message from an executor is checked against the
executor lane's table (executor/lane.py): a bad one ends that executor, never
the agent.

Must not import CUDA (executors do) or NVML (the inventory does).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.host.executor import lane
from hvgpu.host.executor import sandbox
from hvgpu.host import regions as regions_host
from hvgpu.host.launch import Launcher
from hvgpu.host.mps import MpsDaemon
from hvgpu.host.quota import QuotaLedger
from hvgpu.host.names import MAX_VGPUS, SHM_DIR, VgpuKey
from hvgpu.host.slices import SliceManager
from hvgpu.host.state import StateStore, lock_state_dir
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.address import VMADDR_CID_ANY, Address
from hvgpu.virtio.framing import pack_header
from hvgpu.virtio.transport import (Listener, control_pair, listen, receive_message, send_message,
                                    vsock_available)

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "/var/cache/hvgpu"


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
    env: dict = field(default_factory=dict)  # extra environment for executors
    connect: str | None = None  # libvirt URI; None: VMs are known by CID or bound socket only
    placement: str = "best-fit"  # slices.PLACEMENTS: how attach chooses a GPU
    max_connections_per_vm: int = 64  # open at once, over all of a VM's vGPUs
    # Executors run as this user (as root; `hvgpu agent` says "hvgpu"); None: as the
    # agent's own user (tests, the demo). See hvgpu.host.launch.
    executor_user: str | None = None
    # MPS pipes and logs, executors' empty cwd (`hvgpu agent`: launch.default_run_dir());
    # None: a private temporary one
    run_dir: str | None = None
    confine: str = "auto"  # executor/sandbox.MODES; "none" for tests and debugging only
    executor_read: list[str] = field(default_factory=list)  # more paths executors may read
    executor_write: list[str] = field(default_factory=list)  # ... and write (tests' doubles)
    # Shared memory (memfd regions) a host-local connection may have its executor map
    # and page-lock; a VM's limit is its slice's (hvgpu attach --shm).
    local_shm: int = 1 << 30
    shm_dir: str = SHM_DIR  # where QEMU keeps a VM's ivshmem file (libvirt's <shmem>)


@dataclass
class Executor:
    process: subprocess.Popen
    peer: str
    started: float


@dataclass(eq=False)
class SliceExecutor:
    """One executor process of a vGPU (a VM's slice of one GPU); a resize may start a
    newer generation."""

    key: VgpuKey  # the vGPU: Slice.key
    process: subprocess.Popen
    ctrl: object  # the agent's end of the control channel
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


ENDING_GRACE = 30.0  # an executor whose channel ended exits by itself well within this

# A refused peer is answered from the selector loop, never by a thread of its own:
# it may hold this many bytes of the agent's for this long, and no more than this
# many refused peers wait at once (the oldest is closed first).
REFUSAL_DEADLINE = 2.0
REFUSAL_BUDGET = 4096
MAX_REFUSALS = 64
REFUSAL_LOG_EVERY = 10.0


@dataclass(eq=False)
class Refusal:
    """A refused connection waiting for the header of its first frame (to answer it)."""

    conn: object
    peer: str
    status: int
    message: str
    deadline: float
    got: bytearray = field(default_factory=bytearray)


def split_binding(text: str) -> tuple[str, VgpuKey | None]:
    """'unix:///run/vm1.sock=vm1' -> ('unix:///run/vm1.sock', VgpuKey('vm1', 0)); a
    binding to 'vm1#1' serves that VM's vGPU 1. The VM name is checked
    (names.check_vm_name): a bad one raises BadVmName."""
    address, eq, vm = text.rpartition("=")
    if eq and vm and "/" not in vm and ":" not in vm:
        return address, VgpuKey.parse(vm)
    return text, None


class Agent:
    def __init__(self, config: AgentConfig, gpus: Callable | None = None):
        self.config = config
        self.listeners: list[Listener] = []
        self.bindings: dict[Listener, VgpuKey] = {}  # -> the vGPU it serves
        self.device_ports: dict[Listener, int] = {}  # vsock listener -> the vGPU it reaches
        self.executors: dict[int, Executor] = {}
        self.slice_executors: list[SliceExecutor] = []
        self.current: dict[VgpuKey, SliceExecutor] = {}
        self.ledgers: dict[VgpuKey, QuotaLedger] = {}
        self.ending: list[SliceExecutor] = []  # channel closed, process not yet reaped
        self.refusals: deque[Refusal] = deque()  # oldest first
        self._refusal_log: dict[str, tuple[float, int]] = {}
        self.lock = threading.RLock()
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
            for s in self.slices.list():
                self.ledgers[s.key] = QuotaLedger(s.mem)
        self.vms = None  # VmDirectory once libvirt answers
        self._qemu_uid: int | None = None  # libvirt's QEMU user; -1: libvirt did not say
        self.libvirt_reason = "no libvirt URI configured"
        self.launcher = Launcher(config.executor_user, config.run_dir, config.cache_dir)
        self.mps = MpsDaemon(self.launcher.run_dir / "mps")
        self._mps_started = False
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Open every listener; raise if none could be opened, or if a binding names
        a VM by a name hvgpu refuses (before anything is opened)."""
        try:
            self._start()
        except BaseException:
            self._shutdown()  # what was opened, and the state directory's lock
            raise

    def _start(self) -> None:
        bound = {text: split_binding(text) for text in self.config.listen}
        addresses = list(self.config.listen)
        devices = {}
        if self.config.vsock_port is not None:
            if vsock_available():
                # vGPU N of a VM is reached at the port + N (see hvgpu.guest.client)
                vsock = [str(Address("vsock", cid=VMADDR_CID_ANY, port=self.config.vsock_port + d))
                         for d in range(MAX_VGPUS if self.slices is not None else 1)]
                devices = {a: d for d, a in enumerate(vsock)}
                addresses[:0] = vsock
            else:
                log.warning("vsock is not available on this host (load the vhost_vsock "
                            "module); guests in VMs cannot reach this agent")
        failures = []
        for text in addresses:
            address, vm = bound.get(text) or (text, None)
            try:
                listener = listen(address)
            except HvgpuError as exc:
                failures.append(str(exc))
                log.error("%s", exc)
                continue
            self.listeners.append(listener)
            if vm:
                self.bindings[listener] = vm
            if text in devices:
                self.device_ports[listener] = devices[text]
            self._selector.register(listener, selectors.EVENT_READ, ("listen", listener))
            log.info("listening on %s%s", listener.address, f" for VM {vm}" if vm else "")
        if not self.listeners:
            raise TransportError("the agent has nowhere to listen: "
                                 + ("; ".join(failures) or "no address configured"))
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

    def _open_libvirt(self, uri: str) -> None:
        import queue

        from hvgpu.host.hypervisor import Hypervisor, start_event_loop
        from hvgpu.host.vms import VmDirectory

        def sync_ledgers():
            with self.lock:
                keys = {s.key for s in self.slices.list()}
                for key in [k for k in self.ledgers if k not in keys]:
                    self.slice_detached(key)
                for s in self.slices.list():
                    self.ledgers.setdefault(s.key, QuotaLedger(s.mem))

        lost: queue.Queue[str] = queue.Queue()  # libvirt's thread only puts the reason here
        try:
            start_event_loop()
            hypervisor = Hypervisor(uri)
            self.vms = VmDirectory(hypervisor)
            for change in self.vms.reconcile(self.slices):
                log.info("reconciled with libvirt: %s", change)
            sync_ledgers()
            hypervisor.watch(self._on_vm_event, lost.put)
        except HvgpuError as exc:
            self.vms = None
            self.libvirt_reason = str(exc)
            log.warning("libvirt is not available (%s); VMs can be attached by --cid only", exc)
            return
        log.info("libvirt at %s: watching domain lifecycle events", uri)

        def reconnect_when_lost():
            # Reconnecting waits on libvirtd, so never on libvirt's event thread.
            while not self._stop.is_set():
                try:
                    reason = lost.get(timeout=0.5)
                except queue.Empty:
                    continue
                log.warning("%s; connecting again", reason)
                delay = 0.5
                while not self._stop.is_set():
                    try:
                        self.vms.reconnect(self.slices)  # logs what reconciling changed
                        break
                    except HvgpuError as exc:
                        log.warning("%s; trying again in %g s", exc, delay)
                        self._stop.wait(delay)
                        delay = min(delay * 2, 30)
                sync_ledgers()

        threading.Thread(target=reconnect_when_lost, name="libvirt-reconnect",
                         daemon=True).start()

    def _on_vm_event(self, event) -> None:
        """A LifecycleEvent, from libvirt's event loop thread."""
        from hvgpu.host.hypervisor import EventKind

        if self._stop.is_set():
            # libvirt still delivers to a stopped agent: acting would change a state
            # directory that a new agent may own by now
            return
        vm = event.vm
        if self.vms is not None:
            self.vms.forget_cids()
        keys = self._keys_of(vm)
        if not keys:
            return
        if event.kind is EventKind.STOPPED:
            log.info("%s stopped: releasing its slice's executors and GPU memory "
                     "(the reservation stays until hvgpu detach)", vm)
            self.release_vm(vm)
        elif event.kind in (EventKind.STARTED, EventKind.RESUMED):
            with self.lock:
                for key in keys:
                    if key not in self.current and self.slices is not None:
                        log.info("%s started: restoring the executor of %s", vm, key)
                        self._spawn_slice(key)
        elif event.kind is EventKind.UNDEFINED:
            log.info("%s was undefined: its slice is removed", vm)
            try:
                self.slices.detach(vm)
            except HvgpuError:
                pass
            for key in keys:
                self.slice_detached(key)
        elif event.kind is EventKind.MIGRATING:
            log.error("%s is migrating: hvgpu does not support migrating a VM with a GPU "
                      "slice; its slice stays on this host and its CUDA connections will end. "
                      "hvgpu-libvirt-hook, installed as /etc/libvirt/hooks/qemu on the "
                      "destination, refuses such migrations", vm)

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                timeout = 0.5
                if self.refusals:
                    timeout = min(timeout, max(0.0, self.refusals[0].deadline - time.monotonic()))
                for key, _ in self._selector.select(timeout=timeout):
                    kind, obj = key.data
                    if kind == "wake":
                        os.read(self._wake_r, 64)
                    elif kind == "listen":
                        self._accept(obj)
                    elif kind == "refusal":
                        self._on_refusal(obj)
                    else:
                        self._on_control(obj)
                self._expire_refusals()
                self._reap()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- work ----------------------------------------------------------------

    def _accept(self, listener: Listener) -> None:
        try:
            conn, peer = listener.accept()
        except OSError as exc:
            log.warning("accept on %s failed: %s", listener.address, exc)
            return
        status = P.HV_NO_SLICE
        try:
            with self.lock:
                route, detail = self._route(listener, peer)
                if route == "slice":
                    open_now = self._connections_of(detail.vm)
                    if open_now < self.config.max_connections_per_vm:
                        self._to_slice(detail, conn, peer)
                        return
                    route, status = "refuse", P.HV_TOO_MANY_CONNECTIONS
                    detail = (f"VM {detail.vm!r} has {open_now} connections open, as many as "
                              "the host agent allows (hvgpu agent --max-connections-per-vm); "
                              "close one and connect again")
        except (HvgpuError, OSError) as exc:  # one guest's failure never stops the agent
            log.error("cannot serve %s: %s", peer, exc)
            route, detail = "refuse", f"the agent could not serve this connection: {exc}"
        if route == "refuse":
            self._log_refusal(peer, detail)
            self._refuse(conn, peer, status, detail)
            return
        try:
            proc = self._spawn(conn.fileno(), peer)
        except OSError as exc:
            log.error("cannot start an executor for %s: %s", peer, exc)
            conn.close()
            return
        conn.close()  # the executor holds its own copy
        self.executors[proc.pid] = Executor(proc, peer, time.monotonic())
        log.info("%s connected on %s: executor pid %d", peer, listener.address, proc.pid)

    def _connections_of(self, vm: str) -> int:
        with self.lock:
            return sum(e.connections for e in self.slice_executors if e.key.vm == vm)

    # -- refusals: answered from the loop ---------------------------------------------

    def _log_refusal(self, peer: str, why: str) -> None:
        """One line per reason every REFUSAL_LOG_EVERY seconds: a peer that connects
        in a loop must not flood the log."""
        now = time.monotonic()
        last, quiet = self._refusal_log.get(why, (None, 0))
        if last is not None and now - last < REFUSAL_LOG_EVERY:
            self._refusal_log[why] = (last, quiet + 1)
            return
        if len(self._refusal_log) > 256:
            self._refusal_log.clear()
        self._refusal_log[why] = (now, 0)
        more = f" ({quiet} more refused for this since the last such line)" if quiet else ""
        log.warning("refused %s: %s%s", peer, why, more)

    def _refuse(self, conn, peer: str, status: int, message: str) -> None:
        """Answer the peer's first frame with ``status`` and ``message``, then close;
        close at once if it sends none within REFUSAL_DEADLINE."""
        while len(self.refusals) >= MAX_REFUSALS:
            self._end_refusal(self.refusals[0])
        try:
            conn.setblocking(False)
            r = Refusal(conn, peer, status, message, time.monotonic() + REFUSAL_DEADLINE)
            self._selector.register(conn, selectors.EVENT_READ, ("refusal", r))
        except (OSError, ValueError):
            conn.close()
            return
        self.refusals.append(r)

    def _on_refusal(self, r: Refusal) -> None:
        want = P.HEADER.size
        if len(r.got) >= want:
            want = _first_frame(r.got)
        try:
            chunk = r.conn.recv(want - len(r.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._end_refusal(r)
            return
        r.got += chunk
        if len(r.got) < P.HEADER.size:
            return
        magic, _, _, op, _, seq, _, _, _, _ = P.HEADER.unpack_from(r.got)
        if magic != P.MAGIC:  # not this protocol: nothing to answer
            self._end_refusal(r)
            return
        if len(r.got) < _first_frame(r.got):
            return
        body = codec.encode_error(op, seq, r.message)
        try:
            r.conn.send(pack_header(op, P.FLAG_REPLY, seq, r.status, len(body)) + body)
        except OSError:
            pass
        self._end_refusal(r)

    def _end_refusal(self, r: Refusal) -> None:
        try:
            self.refusals.remove(r)
        except ValueError:
            pass
        try:
            self._selector.unregister(r.conn)
        except (KeyError, ValueError):
            pass
        r.conn.close()

    def _expire_refusals(self) -> None:
        now = time.monotonic()
        while self.refusals and self.refusals[0].deadline <= now:
            self._end_refusal(self.refusals[0])

    def _keys_of(self, vm: str) -> list[VgpuKey]:
        with self.lock:
            return sorted(k for k in self.ledgers if k.vm == vm)

    def _route(self, listener: Listener, peer: str) -> tuple[str, str]:
        """("slice", vGPU key), ("whole", "") or ("refuse", why)."""
        if self.slices is None:
            return "whole", ""
        key = self.bindings.get(listener)
        if key is not None:
            if key not in self.ledgers:
                return "refuse", self._no_vgpu(*key)
            return "slice", key
        if listener.address.scheme == "vsock":
            device = self.device_ports.get(listener, 0)
            cid = int(peer.split(":")[1])
            s = self.slices.by_cid(cid)
            vm = s.vm if s is not None else (
                self.vms.vm_for_cid(cid) if self.vms is not None else None)
            if vm is not None and self._keys_of(vm):
                key = VgpuKey(vm, device)
                if key not in self.ledgers:
                    return "refuse", self._no_vgpu(vm, device)
                return "slice", key
            named = f"VM {vm!r}" if vm else f"the VM with CID {cid}"
            fix = f"hvgpu attach {vm} --mem SIZE" if vm else \
                f"hvgpu attach VM --mem SIZE --cid {cid}"
            return "refuse", f"no GPU slice is attached to {named}; on the host: {fix}"
        if listener.address.scheme == "hvsock":
            return "refuse", ("this hybrid-vsock socket is bound to no VM; start the agent "
                              f"with --listen {listener.address}=VM")
        return "whole", ""

    def _no_vgpu(self, vm: str, device: int) -> str:
        if device == 0 or not self._keys_of(vm):
            return (f"no GPU slice is attached to VM {vm!r}; on the host: "
                    f"hvgpu attach {vm} --mem SIZE")
        return (f"VM {vm!r} has {len(self._keys_of(vm))} vGPU(s), not a device {device}; on "
                f"the host: hvgpu attach {vm} --mem SIZE --add")

    def _to_slice(self, key: VgpuKey, conn, peer: str) -> None:
        for attempt in (1, 2):
            ex = self.current.get(key)
            if ex is None or ex.process.poll() is not None:
                ex = self._spawn_slice(key)
            try:
                send_message(ex.ctrl, lane.encode(lane.CONN, peer=peer), [conn.fileno()])
            except OSError as exc:
                log.warning("slice %s: executor pid %d did not take %s (%s)", key,
                            ex.process.pid, peer, exc)
                self.current.pop(key, None)
                continue
            ex.connections += 1
            log.info("%s connected: slice %s, executor pid %d", peer, key, ex.process.pid)
            break
        conn.close()

    def _spawn_slice(self, key: VgpuKey) -> SliceExecutor:
        s = self.slices.by_key(key)
        ours, theirs = control_pair()
        # The agent never waits on an executor: one that asks and reads none of the
        # answers fills its channel, and is then killed instead of stopping every VM.
        ours.setblocking(False)
        env = {"CUDA_VISIBLE_DEVICES": s.gpu_uuid}
        if self.mps.running:
            env.update(self.mps.client_env(s.mem, s.compute))
        proc = self._start_executor(theirs.fileno(), ["--control-fd", str(theirs.fileno()),
                                                      "--vm", key.vm, "--vgpu", str(key.device), "--compute", str(s.compute),
                                                      "--shm", str(s.shm),
                                                      "--gpu", "0"], env, vm=key.vm)
        theirs.close()
        generation = 1 + max((e.generation for e in self.slice_executors if e.key == key),
                             default=0)
        ex = SliceExecutor(key, proc, ours, generation, s.mem, s.compute, self.mps.running)
        self.slice_executors.append(ex)
        self.current[key] = ex
        self._selector.register(ours, selectors.EVENT_READ, ("ctrl", ex))
        log.info("slice %s: executor pid %d (generation %d) on %s, %d MiB%s", key, proc.pid,
                 generation, s.gpu_uuid, s.mem >> 20,
                 f", {s.compute}% of the SMs (MPS)" if self.mps.running and s.compute else "")
        return ex

    def _on_control(self, ex: SliceExecutor) -> None:
        """One message from a slice's executor. Whatever it sends, the agent goes on:
        a message the lane does not allow is that executor's failure."""
        data, fds = receive_message(ex.ctrl)
        for fd in fds:  # no executor message carries descriptors
            os.close(fd)
        if not data and not fds:
            self._executor_gone(ex)
            return
        try:
            message, msg = lane.decode(data, len(fds), lane.TO_AGENT)
            reply = self._answer(ex, message, msg)
        except lane.LaneError as exc:
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
            send_message(ex.ctrl, lane.encode(lane.REPLY, id=msg["id"], **reply))
        except BlockingIOError:
            self._executor_failed(ex, "it reads none of the agent's answers")
        except OSError:
            self._executor_gone(ex)

    def _answer(self, ex: SliceExecutor, message: lane.Message, msg: dict) -> dict | None:
        """The reply's fields for a request; None for a message that has none."""
        ledger = self.ledgers.get(ex.key)
        if message is lane.RESERVE:
            try:
                if ledger is None:
                    raise CudaError(P.HV_NO_SLICE, f"the slice {str(ex.key)!r} was detached")
                ledger.reserve(ex, msg["n"])
                return {"ok": True}
            except CudaError as exc:
                return {"ok": False, "status": exc.status,
                        "message": exc.detail[:lane.REPLY_MESSAGE_MAX]}
        if message is lane.USAGE:
            return {"used": ledger.used if ledger else 0, "limit": ledger.limit if ledger else 0}
        if message is lane.VGPUS:  # the guest's device count: every vGPU of the VM
            return {"count": len(self._keys_of(ex.key.vm))}
        if message is lane.REGION:
            self._send_region(ex, msg["id"])
            return None
        if message is lane.RELEASE:
            if ledger is not None:
                ledger.release(ex, msg["n"])
        elif message is lane.CLOSED:
            ex.connections = max(0, ex.connections - 1)
            log.info("%s disconnected from slice %s", msg["peer"], ex.key)
        elif message is lane.POISONED:
            log.warning("slice %s: executor pid %d hit %s, which poisons every CUDA context "
                        "of its process; the VM's next connections get a new executor, its %d "
                        "open ones keep the error until they close", ex.key, ex.process.pid,
                        P.status_name(msg["status"]), ex.connections)
            with self.lock:
                self._retire(ex)
        return None

    def _region_owners(self) -> frozenset[int]:
        """Who besides root may own a VM's region file: libvirt's QEMU user (asked once)."""
        if self._qemu_uid is None and self.vms is not None:
            self._qemu_uid = self.vms.hv.qemu_uid() or -1
        return frozenset({self._qemu_uid} if self._qemu_uid not in (None, -1) else ())

    def _send_region(self, ex: SliceExecutor, rid: int) -> None:
        """The VM's shared-memory device file, opened here (executors open no host
        file): the one its slice names, a regular file of the slice's size, never a
        link."""
        try:
            try:
                slice_ = self.slices.by_key(ex.key) if self.slices is not None else None
            except HvgpuError:  # detached meanwhile
                slice_ = None
            # Each executor keeps its own book of the region's rooms: two of one vGPU
            # (a newer generation after a resize or a fault) would give two programs
            # the same bytes. The newer one has it once the older one has ended.
            with self.lock:
                older = [e for e in (*self.slice_executors, *self.ending)
                         if e is not ex and e.key == ex.key and e.region_given
                         and e.process.poll() is None]
            if older:
                raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                                f"the VM's shared-memory region is in use by an older "
                                f"executor of the vGPU (pid {older[0].process.pid}) until "
                                "its programs end; copies travel on the socket meanwhile")
            fd, size = regions_host.open_region(self.config.shm_dir, ex.key, slice_,
                                                self._region_owners())
        except CudaError as exc:
            # Each guest SHM_ATTACH may ask again: said once per executor, not per ask.
            ex.regions_refused += 1
            log.log(logging.WARNING if ex.regions_refused == 1 else logging.DEBUG,
                    "slice %s: no shared-memory region for its guest: %s", ex.key,
                    exc.detail)
            send_message(ex.ctrl, lane.encode(lane.REPLY, id=rid, ok=False, status=exc.status,
                                              message=exc.detail[:lane.REPLY_MESSAGE_MAX]))
            return
        ex.region_given = True
        try:
            send_message(ex.ctrl, lane.encode(lane.REGION_FD, id=rid, size=size), [fd])
        finally:
            os.close(fd)

    def _executor_failed(self, ex: SliceExecutor, why: str) -> None:
        """An executor sent what the lane does not allow: it may be compromised. Kill
        it, release what it held; the VM's next connection starts a new one."""
        log.error("slice %s: executor pid %d sent a bad message on the executor lane (%s): "
                  "killed; its guests' connections end, its reservations are released and "
                  "the VM's next connection gets a new executor", ex.key, ex.process.pid, why)
        try:
            ex.process.kill()
        except OSError:
            pass
        self._executor_gone(ex)

    def _executor_gone(self, ex: SliceExecutor) -> None:
        """Its control channel ended: forget it now, collect its exit in _reap."""
        with self.lock:
            try:
                self._selector.unregister(ex.ctrl)
            except (KeyError, ValueError):
                pass
            ex.ctrl.close()
            if ex in self.slice_executors:
                self.slice_executors.remove(ex)
            if self.current.get(ex.key) is ex:
                del self.current[ex.key]
            ledger = self.ledgers.get(ex.key)
            freed = ledger.drop(ex) if ledger else 0
            ex.gone = time.monotonic()
            self.ending.append(ex)
        log.info("slice %s: executor pid %d left; %d MiB of its reservations released",
                 ex.key, ex.process.pid, freed >> 20)

    # -- slice changes (called by the control API) ---------------------------------

    def slice_attached(self, key: VgpuKey, mem: int) -> None:
        with self.lock:
            self.ledgers[key] = QuotaLedger(mem)

    def slice_detached(self, key: VgpuKey) -> None:
        """Disconnect the vGPU's guests and end its executors."""
        with self.lock:
            self.ledgers.pop(key, None)
            self._release(lambda k: k == key)

    def release_vm(self, vm: str) -> None:
        """End the executors of every vGPU of a VM; the slices and ledgers stay."""
        self._release(lambda k: k.vm == vm)

    def _release(self, which) -> None:
        with self.lock:
            for key in [k for k in self.current if which(k)]:
                del self.current[key]
            for ex in [e for e in self.slice_executors if which(e.key)]:
                try:
                    ex.ctrl.shutdown(2)  # the executor sees the end of its channel
                except OSError:
                    pass

    def slice_resized(self, key: VgpuKey, mem: int, compute: int) -> bool:
        """Apply new limits; True when running guests keep older MPS limits for now."""
        with self.lock:
            ledger = self.ledgers.get(key)
            if ledger is not None:
                ledger.limit = mem  # accounting: at once, for every connection
            ex = self.current.get(key)
            if ex is None or not ex.mps or (ex.mem, ex.compute) == (mem, compute):
                return False
            # MPS limits are fixed per client process: new connections get a new
            # executor with the new limits; this one ends with its last connection.
            self._retire(ex)
            return ex.connections > 0

    def _retire(self, ex: SliceExecutor) -> None:
        """New connections of its vGPU go to a new executor; this one ends with its last."""
        if ex.retiring:
            return
        ex.retiring = True
        if self.current.get(ex.key) is ex:
            del self.current[ex.key]
        try:
            send_message(ex.ctrl, lane.encode(lane.RETIRE))
        except OSError:
            pass

    def slice_usage(self, key: VgpuKey) -> tuple[int, list[SliceExecutor]]:
        with self.lock:
            ledger = self.ledgers.get(key)
            return (ledger.used if ledger else 0,
                    [e for e in self.slice_executors if e.key == key])

    def _spawn(self, fd: int, peer: str) -> subprocess.Popen:
        return self._start_executor(fd, ["--fd", str(fd), "--peer", peer,
                                         "--gpu", str(self.config.gpu),
                                         "--shm", str(self.config.local_shm)], {})

    def _start_executor(self, fd: int, args: list[str], env: dict,
                        vm: str | None = None) -> subprocess.Popen:
        """An executor process inheriting ``fd``, with the agent's common options; ``vm``:
        whose cache directory it gets (None: a host-local one)."""
        args = [*args, "--log-level", self.config.log_level, "--confine", self.config.confine]
        cache = self.launcher.cache_for(vm)
        if cache:
            args += ["--cache-dir", cache]
        if self.config.device:
            args += ["--device", self.config.device]
        for flag, paths in (("--allow-read", self.config.executor_read),
                            ("--allow-write", self.config.executor_write)):
            for path in paths:
                args += [flag, path]
        return self.launcher.popen(args, fd, self.launcher.environment(self.config.env, env))

    def _reap(self) -> None:
        for sx in list(self.ending):
            code = sx.process.poll()
            if code is None:
                # its reservations are released already: it must not keep serving
                if time.monotonic() - sx.gone > ENDING_GRACE:
                    log.warning("slice %s: executor pid %d did not exit after its channel "
                                "ended; killed", sx.key, sx.process.pid)
                    sx.process.kill()
                continue
            self.ending.remove(sx)
            log.log(logging.INFO if code == 0 else logging.WARNING,
                    "slice %s: executor pid %d ended with %s", sx.key, sx.process.pid,
                    _describe(code))
        for pid, ex in list(self.executors.items()):
            code = ex.process.poll()
            if code is None:
                continue
            del self.executors[pid]
            took = time.monotonic() - ex.started
            if code == 0:
                log.info("executor pid %d for %s finished after %.1fs", pid, ex.peer, took)
            else:
                log.warning("executor pid %d for %s exited with %s after %.1fs; its GPU "
                            "resources went with it", pid, ex.peer, _describe(code), took)

    def _shutdown(self) -> None:
        while self.refusals:
            self._end_refusal(self.refusals[0])
        for ex in list(self.slice_executors) + self.ending:
            try:
                self._selector.unregister(ex.ctrl)
            except (KeyError, ValueError):
                pass
            ex.ctrl.close()
            try:
                ex.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ex.process.kill()
                ex.process.wait()
        self.slice_executors.clear()
        self.ending.clear()
        self.current.clear()
        if self._mps_started:
            self.mps.stop()
        for listener in self.listeners:
            try:
                self._selector.unregister(listener)
            except (KeyError, ValueError):
                pass
            listener.close()
        self.listeners = []
        for ex in self.executors.values():
            if ex.process.poll() is None:
                ex.process.terminate()
        deadline = time.monotonic() + 5
        for ex in self.executors.values():
            try:
                ex.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ex.process.kill()
                ex.process.wait()
        self.executors.clear()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._selector.close()
        if self._state_lock is not None:
            self._state_lock.close()
            self._state_lock = None
        self.launcher.close()  # any executor still alive ends on its lifeline
        log.info("agent stopped")


def _first_frame(got: bytes) -> int:
    """How many bytes of a refused peer to read before answering: its whole first
    frame when that is small (unread bytes can make the close reset the reply),
    else its header alone."""
    size = P.HEADER.size + P.HEADER.unpack_from(got)[7]  # + body_len
    return size if size <= REFUSAL_BUDGET else P.HEADER.size


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


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
