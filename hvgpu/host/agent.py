"""The host agent: accept guests, route each to its slice's executor.

The agent listens on vsock and any configured unix / hybrid-vsock / tcp
address and learns each peer's identity from the transport. A connection that
belongs to a slice (a vsock CID attached with ``--cid``, or a listener bound to
a VM with ``ADDR=VM``) is handed, socket and all, to that slice's executor
process: one MPS client per slice, started with the slice's limits, whose
memory reservations the agent keeps in the slice's ledger. A connection on a
listener bound to no VM gets an executor of its own with the whole GPU
(host-local use). A vsock peer with no slice is refused with a clear error.
The agent never reads guest traffic, so one guest's copy or crash cannot stall
another; a process's exit frees everything it held on the GPU.

Must not import CUDA (executors do) or NVML (the inventory does).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hvgpu.errors import CudaError, HvgpuError, TransportError
from hvgpu.host.executor import sandbox
from hvgpu.host.launch import Launcher
from hvgpu.host.mps import MpsDaemon
from hvgpu.host.quota import QuotaLedger
from hvgpu.host.slices import MAX_VGPUS, SliceManager
from hvgpu.host.state import StateStore, slice_key, split_key
from hvgpu.virtio import protocol as P
from hvgpu.virtio.address import VMADDR_CID_ANY, Address
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
    # Executors run as this user (as root; `hvgpu agent` says "hvgpu"); None: as the
    # agent's own user (tests, the demo). See hvgpu.host.launch.
    executor_user: str | None = None
    # MPS pipes and logs, executors' empty cwd (`hvgpu agent`: launch.default_run_dir());
    # None: a private temporary one
    run_dir: str | None = None
    confine: str = "auto"  # executor/sandbox.MODES; "none" for tests and debugging only
    executor_read: list[str] = field(default_factory=list)  # more paths executors may read
    executor_write: list[str] = field(default_factory=list)  # ... and write (tests' doubles)


@dataclass
class Executor:
    process: subprocess.Popen
    peer: str
    started: float


@dataclass(eq=False)
class SliceExecutor:
    """One executor process of a vGPU (a VM's slice of one GPU); a resize may start a
    newer generation."""

    key: str  # the vGPU: Slice.key
    process: subprocess.Popen
    ctrl: object  # the agent's end of the control channel
    generation: int
    mem: int
    compute: int
    mps: bool
    connections: int = 0
    retiring: bool = False
    started: float = field(default_factory=time.monotonic)


def split_binding(text: str) -> tuple[str, str | None]:
    """'unix:///run/vm1.sock=vm1' -> ('unix:///run/vm1.sock', 'vm1'); a binding to
    'vm1#1' serves that VM's vGPU 1."""
    address, eq, vm = text.rpartition("=")
    if eq and vm and "/" not in vm and ":" not in vm:
        return address, vm
    return text, None


class Agent:
    def __init__(self, config: AgentConfig, gpus: Callable | None = None):
        self.config = config
        self.listeners: list[Listener] = []
        self.bindings: dict[Listener, str] = {}  # -> the vGPU key it serves
        self.device_ports: dict[Listener, int] = {}  # vsock listener -> the vGPU it reaches
        self.executors: dict[int, Executor] = {}
        self.slice_executors: list[SliceExecutor] = []
        self.current: dict[str, SliceExecutor] = {}  # by vGPU key
        self.ledgers: dict[str, QuotaLedger] = {}  # by vGPU key
        self.ending: list[SliceExecutor] = []  # channel closed, process not yet reaped
        self.lock = threading.RLock()
        self.slices: SliceManager | None = None
        if config.state_dir:
            if gpus is None:
                from hvgpu.host.inventory import read_gpus as gpus
            self.slices = SliceManager(StateStore(config.state_dir), gpus, config.placement)
            for s in self.slices.list():
                self.ledgers[s.key] = QuotaLedger(s.mem)
        self.vms = None  # VmDirectory once libvirt answers
        self.libvirt_reason = "no libvirt URI configured"
        self.launcher = Launcher(config.executor_user, config.run_dir, config.cache_dir)
        self.mps = MpsDaemon(self.launcher.run_dir / "mps")
        self._mps_started = False
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Open every listener; raise if none could be opened or executors could not run."""
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
            address, vm = split_binding(text)
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
        try:
            self.launcher.prepare()
        except HvgpuError:
            for listener in self.listeners:
                listener.close()
            raise
        if self.launcher.user.switch:
            self.mps.group = self.launcher.user.gid
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
        from hvgpu.host.hypervisor import Hypervisor, start_event_loop
        from hvgpu.host.vms import VmDirectory

        try:
            start_event_loop()
            hypervisor = Hypervisor(uri)
            self.vms = VmDirectory(hypervisor)
            for change in self.vms.reconcile(self.slices):
                log.info("reconciled with libvirt: %s", change)
            with self.lock:
                self.ledgers = {s.key: self.ledgers.get(s.key) or QuotaLedger(s.mem)
                                for s in self.slices.list()}
            hypervisor.watch(self._on_vm_event)
        except HvgpuError as exc:
            self.vms = None
            self.libvirt_reason = str(exc)
            log.warning("libvirt is not available (%s); VMs can be attached by --cid only", exc)
            return
        log.info("libvirt at %s: watching domain lifecycle events", uri)

    def _on_vm_event(self, vm: str, what: str) -> None:
        """Lifecycle events, from libvirt's event loop thread."""
        if self.vms is not None:
            self.vms.forget_cids()
        keys = self._keys_of(vm)
        if not keys:
            return
        if what == "stopped":
            log.info("%s stopped: releasing its slice's executors and GPU memory "
                     "(the reservation stays until hvgpu detach)", vm)
            self.release_vm(vm)
        elif what in ("started", "resumed"):
            with self.lock:
                for key in keys:
                    if key not in self.current and self.slices is not None:
                        log.info("%s started: restoring the executor of %s", vm, key)
                        self._spawn_slice(key)
        elif what == "undefined":
            log.info("%s was undefined: its slice is removed", vm)
            try:
                self.slices.detach(vm)
            except HvgpuError:
                pass
            for key in keys:
                self.slice_detached(key)
        elif what == "migrating":
            log.error("%s is migrating: hvgpu does not support migrating a VM with a GPU "
                      "slice; its slice stays on this host and its CUDA connections will end. "
                      "hvgpu-libvirt-hook, installed as /etc/libvirt/hooks/qemu on the "
                      "destination, refuses such migrations", vm)

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.5):
                    kind, obj = key.data
                    if kind == "wake":
                        os.read(self._wake_r, 64)
                    elif kind == "listen":
                        self._accept(obj)
                    else:
                        self._on_control(obj)
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
        try:
            with self.lock:
                route, detail = self._route(listener, peer)
                if route == "slice":
                    self._to_slice(detail, conn, peer)
                    return
        except (HvgpuError, OSError) as exc:  # one guest's failure never stops the agent
            log.error("cannot serve %s: %s", peer, exc)
            route, detail = "refuse", f"the agent could not serve this connection: {exc}"
        if route == "refuse":
            log.warning("refused %s: %s", peer, detail)
            threading.Thread(target=refuse, args=(conn, P.HV_NO_SLICE, detail),
                             daemon=True).start()
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

    def _keys_of(self, vm: str) -> list[str]:
        with self.lock:
            return sorted(k for k in self.ledgers if split_key(k)[0] == vm)

    def _route(self, listener: Listener, peer: str) -> tuple[str, str]:
        """("slice", vGPU key), ("whole", "") or ("refuse", why)."""
        if self.slices is None:
            return "whole", ""
        key = self.bindings.get(listener)
        if key is not None:
            if key not in self.ledgers:
                return "refuse", self._no_vgpu(*split_key(key))
            return "slice", key
        if listener.address.scheme == "vsock":
            device = self.device_ports.get(listener, 0)
            cid = int(peer.split(":")[1])
            s = self.slices.by_cid(cid)
            vm = s.vm if s is not None else (
                self.vms.vm_for_cid(cid) if self.vms is not None else None)
            if vm is not None and self._keys_of(vm):
                if slice_key(vm, device) not in self.ledgers:
                    return "refuse", self._no_vgpu(vm, device)
                return "slice", slice_key(vm, device)
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

    def _to_slice(self, key: str, conn, peer: str) -> None:
        for attempt in (1, 2):
            ex = self.current.get(key)
            if ex is None or ex.process.poll() is not None:
                ex = self._spawn_slice(key)
            try:
                send_message(ex.ctrl, json.dumps({"op": "conn", "peer": peer}).encode(),
                             [conn.fileno()])
            except OSError as exc:
                log.warning("slice %s: executor pid %d did not take %s (%s)", key,
                            ex.process.pid, peer, exc)
                self.current.pop(key, None)
                continue
            ex.connections += 1
            log.info("%s connected: slice %s, executor pid %d", peer, key, ex.process.pid)
            break
        conn.close()

    def _spawn_slice(self, key: str) -> SliceExecutor:
        s = self.slices.by_key(key)
        ours, theirs = control_pair()
        env = {"CUDA_VISIBLE_DEVICES": s.gpu_uuid}
        if self.mps.running:
            env.update(self.mps.client_env(s.mem, s.compute))
        proc = self._start_executor(theirs.fileno(), ["--control-fd", str(theirs.fileno()),
                                                      "--slice", key, "--compute", str(s.compute),
                                                      "--gpu", "0"], env, vm=split_key(key)[0])
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
        data, fds = receive_message(ex.ctrl)
        for fd in fds:
            os.close(fd)
        if not data:
            self._executor_gone(ex)
            return
        msg = json.loads(data)
        op = msg.get("op")
        ledger = self.ledgers.get(ex.key)
        if op == "reserve":
            try:
                if ledger is None:
                    raise CudaError(P.HV_NO_SLICE, f"the slice {ex.key!r} was detached")
                ledger.reserve(ex, int(msg["n"]))
                reply = {"ok": True}
            except CudaError as exc:
                reply = {"ok": False, "status": exc.status, "message": exc.detail}
        elif op == "usage":
            reply = {"used": ledger.used if ledger else 0, "limit": ledger.limit if ledger else 0}
        elif op == "vgpus":  # the guest's device count: every vGPU of the VM
            reply = {"count": len(self._keys_of(split_key(ex.key)[0]))}
        else:
            if op == "release" and ledger is not None:
                ledger.release(ex, int(msg["n"]))
            elif op == "closed":
                ex.connections = max(0, ex.connections - 1)
                log.info("%s disconnected from slice %s", msg.get("peer"), ex.key)
            return
        reply.update(op="reply", id=msg.get("id"))
        try:
            send_message(ex.ctrl, json.dumps(reply).encode())
        except OSError:
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
            self.ending.append(ex)
        log.info("slice %s: executor pid %d left; %d MiB of its reservations released",
                 ex.key, ex.process.pid, freed >> 20)

    # -- slice changes (called by the control API) ---------------------------------

    def slice_attached(self, key: str, mem: int) -> None:
        with self.lock:
            self.ledgers[key] = QuotaLedger(mem)

    def slice_detached(self, key: str) -> None:
        """Disconnect the vGPU's guests and end its executors."""
        with self.lock:
            self.ledgers.pop(key, None)
            self._release(lambda k: k == key)

    def release_vm(self, vm: str) -> None:
        """End the executors of every vGPU of a VM; the slices and ledgers stay."""
        self._release(lambda k: split_key(k)[0] == vm)

    def _release(self, which) -> None:
        with self.lock:
            for key in [k for k in self.current if which(k)]:
                del self.current[key]
            for ex in [e for e in self.slice_executors if which(e.key)]:
                try:
                    ex.ctrl.shutdown(2)  # the executor sees the end of its channel
                except OSError:
                    pass

    def slice_resized(self, key: str, mem: int, compute: int) -> bool:
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
            ex.retiring = True
            del self.current[key]
            try:
                send_message(ex.ctrl, json.dumps({"op": "retire"}).encode())
            except OSError:
                pass
            return ex.connections > 0

    def slice_usage(self, key: str) -> tuple[int, list[SliceExecutor]]:
        with self.lock:
            ledger = self.ledgers.get(key)
            return (ledger.used if ledger else 0,
                    [e for e in self.slice_executors if e.key == key])

    def _spawn(self, fd: int, peer: str) -> subprocess.Popen:
        return self._start_executor(fd, ["--fd", str(fd), "--peer", peer,
                                         "--gpu", str(self.config.gpu)], {})

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
        self.launcher.close()  # any executor still alive ends on its lifeline
        log.info("agent stopped")


def refuse(conn, status: int, message: str) -> None:
    """Answer a peer's first frame with ``status`` and close (runs in a thread)."""
    from hvgpu.virtio import codec
    from hvgpu.virtio.framing import FrameReader, send_frame

    try:
        conn.settimeout(5)
        hdr, _ = FrameReader(conn, bufsize=1 << 12).read_frame()
        send_frame(conn, hdr.op, P.FLAG_REPLY, hdr.seq, status,
                   codec.encode_error(hdr.op, hdr.seq, message))
    except (HvgpuError, OSError):
        pass
    finally:
        conn.close()


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
