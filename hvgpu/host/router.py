"""The router: the agent's listeners, and which vGPU an accepted peer belongs to.

Listeners are vsock (vGPU N of a VM at the agent's port + N), unix,
hybrid-vsock or tcp addresses; one may be bound to a VM's vGPU
(``ADDR=VM`` or ``ADDR=VM#N``). A peer's identity comes from the transport
(its vsock CID, the listener it came in on), never from what it says. A peer
that cannot be served is refused from the agent's loop: it may hold a few
KiB of the agent's for two seconds, and gets an error reply to its first
frame.

Must not start executors (supervisor.py) or change vGPUs (the registry).
"""

from __future__ import annotations

import errno
import logging
import selectors
import time
from collections import deque
from dataclasses import dataclass, field

from hvgpu.errors import HvgpuError, TransportError
from hvgpu.host.logs import Budget
from hvgpu.host.names import MAX_VGPUS, VgpuKey
from hvgpu.host.registry import Registry
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.address import VMADDR_CID_ANY, Address
from hvgpu.virtio.framing import pack_header
from hvgpu.virtio.transport import Listener, listen, vsock_available

log = logging.getLogger("hvgpu.host.agent")

# A refused peer is answered from the selector loop, never by a thread of its own:
# it may hold this many bytes of the agent's for this long, and no more than this
# many refused peers wait at once (the oldest is closed first).
REFUSAL_DEADLINE = 2.0
REFUSAL_BUDGET = 4096
MAX_REFUSALS = 64
REFUSAL_LOG_EVERY = 10.0
# An accept that fails for want of descriptors or memory fails again at once, every
# turn of the loop: the listener rests this long, and failures are logged once in
# ACCEPT_LOG_EVERY seconds with the count of the others (784,000 lines in 30 s
# otherwise, and a core spent on them).
ACCEPT_PAUSE = 0.5
ACCEPT_LOG_EVERY = 10.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


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


class Router:
    def __init__(self, selector: selectors.BaseSelector):
        self._selector = selector
        self.listeners: list[Listener] = []
        self.bindings: dict[Listener, VgpuKey] = {}  # -> the vGPU it serves
        self.device_ports: dict[Listener, int] = {}  # vsock listener -> the vGPU it reaches
        self.refusals: deque[Refusal] = deque()  # oldest first
        self._refusal_log: dict[str, tuple[float, int]] = {}
        self.resting: dict[Listener, float] = {}  # listener -> when it accepts again
        self._accept_log = Budget(lines=1, per=ACCEPT_LOG_EVERY)

    # -- listeners -----------------------------------------------------------------

    def open(self, config, slices: bool) -> None:
        """Open every configured listener; raise if none could be opened, or if a
        binding names a VM by a name hvgpu refuses (before anything is opened). On a
        raise, nothing stays open (the caller's close() is not needed)."""
        bound = {text: split_binding(text) for text in config.listen}
        addresses = list(config.listen)
        devices = {}
        if config.vsock_port is not None:
            if vsock_available():
                # vGPU N of a VM is reached at the port + N (see hvgpu.guest.client)
                vsock = [str(Address("vsock", cid=VMADDR_CID_ANY, port=config.vsock_port + d))
                         for d in range(MAX_VGPUS if slices else 1)]
                devices = {a: d for d, a in enumerate(vsock)}
                addresses[:0] = vsock
            else:
                log.warning("vsock is not available on this host (load the vhost_vsock "
                            "module); guests in VMs cannot reach this agent")
        failures = []
        try:
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
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Every refused peer and listener closed (a unix listener's path removed)."""
        while self.refusals:
            self.end_refusal(self.refusals[0])
        self.resting.clear()
        for listener in self.listeners:
            try:
                self._selector.unregister(listener)
            except (KeyError, ValueError):
                pass
            listener.close()
        self.listeners = []
        self.bindings.clear()
        self.device_ports.clear()

    def hybrid_listener(self, vm: str) -> str | None:
        """The hybrid-vsock listener bound to the VM's vGPU 0."""
        for listener, key in self.bindings.items():
            if key.vm == vm and key.device == 0 and listener.address.scheme == "hvsock":
                return str(listener.address)
        return None

    def accept_failed(self, listener: Listener, exc: OSError) -> None:
        """accept() on ``listener`` failed: say so (within the log budget) and, when
        the agent is out of descriptors or memory, let the listener rest a moment."""
        rest = exc.errno in _OUT_OF_RESOURCES
        if rest and listener not in self.resting:
            try:
                self._selector.unregister(listener)
            except (KeyError, ValueError):
                pass
            self.resting[listener] = time.monotonic() + ACCEPT_PAUSE
        dropped = self._accept_log.take(str(listener.address))
        if dropped is not None:
            more = f" ({dropped} more since the last such line)" if dropped else ""
            log.warning("accept on %s failed: %s%s%s", listener.address,
                        exc.strerror or exc, more,
                        f"; not accepting there for {ACCEPT_PAUSE:g} s" if rest else "")

    def wake_listeners(self) -> None:
        """Listeners whose rest is over accept again."""
        now = time.monotonic()
        for listener, until in list(self.resting.items()):
            if until <= now:
                del self.resting[listener]
                self._selector.register(listener, selectors.EVENT_READ, ("listen", listener))

    def bound(self, vm: str) -> bool:
        return any(k.vm == vm for k in self.bindings.values())

    # -- routing -------------------------------------------------------------------

    def route(self, listener: Listener, peer: str, registry: Registry,
              vm_for_cid) -> tuple[str, object]:
        """("slice", vGPU key), ("whole", "") or ("refuse", why). ``vm_for_cid``: libvirt's
        answer for a CID no slice records (None without libvirt)."""
        if not registry.sliced:
            return "whole", ""
        key = self.bindings.get(listener)
        if key is not None:
            if registry.get(key) is None:
                return "refuse", self._no_vgpu(registry, *key)
            return "slice", key
        if listener.address.scheme == "vsock":
            device = self.device_ports.get(listener, 0)
            cid = int(peer.split(":")[1])
            r = registry.by_cid(cid)
            vm = r.key.vm if r is not None else (vm_for_cid(cid) if vm_for_cid else None)
            if vm is not None and registry.keys_of(vm):
                key = VgpuKey(vm, device)
                if registry.get(key) is None:
                    return "refuse", self._no_vgpu(registry, vm, device)
                return "slice", key
            named = f"VM {vm!r}" if vm else f"the VM with CID {cid}"
            fix = f"hvgpu attach {vm} --mem SIZE" if vm else \
                f"hvgpu attach VM --mem SIZE --cid {cid}"
            return "refuse", f"no GPU slice is attached to {named}; on the host: {fix}"
        if listener.address.scheme == "hvsock":
            return "refuse", ("this hybrid-vsock socket is bound to no VM; start the agent "
                              f"with --listen {listener.address}=VM")
        return "whole", ""

    @staticmethod
    def _no_vgpu(registry: Registry, vm: str, device: int) -> str:
        have = registry.keys_of(vm)
        if device == 0 or not have:
            return (f"no GPU slice is attached to VM {vm!r}; on the host: "
                    f"hvgpu attach {vm} --mem SIZE")
        return (f"VM {vm!r} has {len(have)} vGPU(s), not a device {device}; on "
                f"the host: hvgpu attach {vm} --mem SIZE --add")

    # -- refusals: answered from the loop -------------------------------------------

    def log_refusal(self, peer: str, why: str) -> None:
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

    def refuse(self, conn, peer: str, status: int, message: str) -> None:
        """Answer the peer's first frame with ``status`` and ``message``, then close;
        close at once if it sends none within REFUSAL_DEADLINE."""
        while len(self.refusals) >= MAX_REFUSALS:
            self.end_refusal(self.refusals[0])
        try:
            conn.setblocking(False)
            r = Refusal(conn, peer, status, message, time.monotonic() + REFUSAL_DEADLINE)
            self._selector.register(conn, selectors.EVENT_READ, ("refusal", r))
        except (OSError, ValueError):
            conn.close()
            return
        self.refusals.append(r)

    def on_refusal(self, r: Refusal) -> None:
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
            self.end_refusal(r)
            return
        r.got += chunk
        if len(r.got) < P.HEADER.size:
            return
        magic, _, _, op, _, seq, _, _, _, _ = P.HEADER.unpack_from(r.got)
        if magic != P.MAGIC:  # not this protocol: nothing to answer
            self.end_refusal(r)
            return
        if len(r.got) < _first_frame(r.got):
            return
        body = codec.encode_error(op, seq, r.message)
        try:
            r.conn.send(pack_header(op, P.FLAG_REPLY, seq, r.status, len(body)) + body)
        except OSError:
            pass
        self.end_refusal(r)

    def end_refusal(self, r: Refusal) -> None:
        try:
            self.refusals.remove(r)
        except ValueError:
            pass
        try:
            self._selector.unregister(r.conn)
        except (KeyError, ValueError):
            pass
        r.conn.close()

    def expire_refusals(self) -> None:
        now = time.monotonic()
        while self.refusals and self.refusals[0].deadline <= now:
            self.end_refusal(self.refusals[0])

    def next_deadline(self) -> float | None:
        due = list(self.resting.values())
        if self.refusals:
            due.append(self.refusals[0].deadline)
        return min(due) if due else None


def _first_frame(got: bytes) -> int:
    """How many bytes of a refused peer to read before answering: its whole first
    frame when that is small (unread bytes can make the close reset the reply),
    else its header alone."""
    size = P.HEADER.size + P.HEADER.unpack_from(got)[7]  # + body_len
    return size if size <= REFUSAL_BUDGET else P.HEADER.size
