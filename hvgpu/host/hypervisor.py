"""libvirt: find VMs, give them a vsock device and region devices, keep their
slice on the domain, report lifecycle events and a lost connection.

The only module in hvgpu that imports libvirt or holds a libvirt object (a test
fails otherwise): the rest of hvgpu sees ``Hypervisor`` (one connection),
``Domain`` (one domain), ``LifecycleEvent`` records and hvgpu errors. libvirt
errors are translated by error code (``libvirtError.get_error_code()``) at the
edge of those classes into hvgpu errors that say what to do. The slice is
written into the domain's own metadata, in hvgpu's private namespace, so it
follows the domain and survives agent restarts. Lifecycle events and the loss
of the connection come from libvirt's event loop (never hook scripts: a hook
that calls back into libvirt deadlocks); the callables that receive them run on
that loop's thread and must only hand them on. Must not decide placement or
quotas, nor act on an event itself.
"""

from __future__ import annotations

import enum
import logging
import threading
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.names import MAX_VGPUS
from hvgpu.host.render import NAMESPACE, PREFIX, shmem_xml, slice_metadata_xml, vsock_xml
from hvgpu.units import BadValue, check_region_size, format_size

try:
    import libvirt
except ImportError:  # reported when a hypervisor is first asked for
    libvirt = None

log = logging.getLogger(__name__)

DEFAULT_URI = "qemu:///system"


class HypervisorError(HvgpuError):
    code = "libvirt"


class Unreachable(HypervisorError):
    """libvirtd does not answer, or the connection to it is lost."""

    code = "libvirt-unreachable"


class NoSuchVm(HypervisorError):
    code = "no-such-domain"  # libvirt has no domain of that name


class NotSupported(HypervisorError):
    code = "not-supported"


class NoVhostVsock(HypervisorError):
    code = "no-vhost-vsock"


class ShmemHotPlugFailed(HypervisorError):
    code = "shmem-hot-plug"


class ShmemMismatch(HypervisorError):
    code = "shmem-mismatch"


def _codes():
    return {
        "no_domain": libvirt.VIR_ERR_NO_DOMAIN,
        "no_support": libvirt.VIR_ERR_NO_SUPPORT,
        "no_metadata": libvirt.VIR_ERR_NO_DOMAIN_METADATA,
        "system": libvirt.VIR_ERR_SYSTEM_ERROR,
        "operation_invalid": libvirt.VIR_ERR_OPERATION_INVALID,
        "operation_unsupported": libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        "config_unsupported": libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        "internal": libvirt.VIR_ERR_INTERNAL_ERROR,
    }


def _lost(exc) -> bool:
    """Whether a libvirt error says the connection to libvirtd is gone."""
    if exc.get_error_code() in (libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_ERR_INVALID_CONN):
        return True
    return exc.get_error_domain() in (libvirt.VIR_FROM_RPC, libvirt.VIR_FROM_REMOTE) and \
        exc.get_error_code() in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_INTERNAL_ERROR,
                                 libvirt.VIR_ERR_RPC)


def translate(exc, doing: str, vm: str = "") -> HypervisorError:
    """One libvirt error as the hvgpu error an operator can act on."""
    code = exc.get_error_code()
    c = _codes()
    detail = exc.get_error_message() or str(exc)
    if _lost(exc):
        return Unreachable(f"{doing}: the connection to libvirtd is lost ({detail}); the "
                           "agent connects again once libvirtd answers")
    if code == c["no_domain"]:
        return NoSuchVm(f"libvirt has no domain {vm!r} (virsh list --all shows them)")
    if code in (c["no_support"], c["operation_unsupported"]):
        return NotSupported(f"{doing}: this libvirt driver cannot do that ({detail})")
    if doing.startswith("hot-plugging a vsock") and code in (
            c["config_unsupported"], c["system"], c["internal"]):
        # QEMU reports a host without /dev/vhost-vsock as an unsupported configuration
        return NoVhostVsock(f"{doing}: the host could not open /dev/vhost-vsock; load the "
                           f"vhost_vsock kernel module (modprobe vhost_vsock), or, where it "
                           f"cannot be loaded, give the domain a vhost-user vsock (hvgpu "
                           f"domain-xml --vhost-user-vsock) and bind its hybrid-vsock socket "
                           f"to it (hvgpu agent --listen hvsock://UDS:5170=VM) ({detail})")
    return HypervisorError(f"{doing}: {detail} (libvirt error {code})")


@dataclass
class DomainSlice:
    """A slice as recorded in a domain's metadata."""

    vm: str
    gpu_uuid: str
    gpu_index: int
    mem: int
    compute: int
    device: int = 0
    region: int = 0  # bytes; metadata without it (written before it existed) reads as 0


# The element that metadata written before the region had its name carries it in.
OLD_REGION = "shm"


def _recorded(vm: str, element, device: int) -> DomainSlice:
    """One vGPU from the metadata; ValueError when a value is not one hvgpu writes."""
    gpu = element.find("gpu")
    d = DomainSlice(vm=vm, gpu_uuid=gpu.get("uuid"), gpu_index=int(gpu.get("index")),
                    mem=int(element.findtext("memory")),
                    compute=int(element.findtext("compute") or 0), device=device,
                    region=int(element.findtext("region") or element.findtext(OLD_REGION)
                               or 0))
    if not d.gpu_uuid or d.gpu_index < 0 or d.mem <= 0 or not 0 <= d.compute <= 100 \
            or not 0 <= d.device < MAX_VGPUS:
        raise ValueError(f"out of range: {d}")
    try:
        check_region_size(d.region)
    except BadValue as exc:
        raise ValueError(str(exc)) from None
    return d


# libvirt's units for a <size> (it writes 'M' = MiB itself)
_SIZE_UNITS = {"b": 1, "bytes": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
               "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40, "kb": 10 ** 3,
               "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


def _shmem_size(node) -> int:
    size = node.find("size")
    if size is None:
        return 4 << 20  # QEMU's default when libvirt names none
    return int(size.text) * _SIZE_UNITS[size.get("unit", "b").lower()]


class Scope(enum.IntFlag):
    """Where a device change applies: the running domain, its persistent config."""

    LIVE = 1
    CONFIG = 2


def _affect(scope: Scope) -> int:
    """libvirt's VIR_DOMAIN_AFFECT_* flags for a scope."""
    flags = 0
    if scope & Scope.LIVE:
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    if scope & Scope.CONFIG:
        flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
    return flags


@contextmanager
def _translated(doing: str, vm: str = ""):
    """The edge: a libvirt error raised inside leaves as the hvgpu error translate() makes."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise translate(exc, doing, vm) from None


class Domain:
    """One libvirt domain as hvgpu uses it: its identity, its vsock and region
    devices, and the slice recorded in its metadata.

    Every method raises hvgpu errors only. A domain looked up before the hypervisor
    reconnected is looked up again by its UUID on the new connection when next used.
    """

    def __init__(self, hv: Hypervisor, virdom):
        self._hv = hv
        self._virdom = virdom
        self._conn = hv._conn  # the connection it was looked up on
        with _translated("reading a domain's identity"):
            self.name: str = virdom.name()
            self.uuid: str = virdom.UUIDString()

    def __repr__(self) -> str:
        return f"<Domain {self.name} {self.uuid}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, Domain) and other.uuid == self.uuid

    def __hash__(self) -> int:
        return hash(self.uuid)

    @property
    def _dom(self):
        if self._conn is not self._hv._conn:
            with _translated(f"looking up {self.name} again", self.name):
                self._virdom = self._hv._conn.lookupByUUIDString(self.uuid)
            self._conn = self._hv._conn
        return self._virdom

    def _edge(self, doing: str):
        return _translated(f"{doing} {self.name}", self.name)

    # -- state ----------------------------------------------------------------------------

    def is_active(self) -> bool:
        with _translated(f"asking whether {self.name} runs", self.name):
            return bool(self._dom.isActive())

    def is_persistent(self) -> bool:
        with _translated(f"asking whether {self.name} is defined", self.name):
            return bool(self._dom.isPersistent())

    def xml(self, inactive: bool = False) -> str:
        """What ``virsh dumpxml [--inactive]`` shows."""
        with self._edge("reading the XML of"):
            return self._dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0)

    def start(self) -> None:
        with self._edge("starting"):
            self._dom.create()

    def destroy(self) -> None:
        """Stop the domain at once (``virsh destroy``)."""
        with self._edge("stopping"):
            self._dom.destroy()

    def undefine(self) -> None:
        with self._edge("undefining"):
            self._dom.undefine()

    def _scope(self) -> Scope:
        """Where a change must go: the config of a defined domain, and the running one."""
        scope = Scope.CONFIG if self.is_persistent() else Scope(0)
        if self.is_active():
            scope |= Scope.LIVE
        return scope

    # -- vsock device --------------------------------------------------------------------

    def vsock_cid(self) -> int | None:
        """The guest CID of the domain's vsock device, from its live XML when running.

        None when the domain has no vsock device, or an automatic CID not yet
        assigned (a domain that is shut off).
        """
        cid = ET.fromstring(self.xml()).find("./devices/vsock/cid")
        if cid is None or cid.get("address") is None:
            return None
        return int(cid.get("address"))

    def has_vsock(self, inactive: bool = False) -> bool:
        return ET.fromstring(self.xml(inactive)).find("./devices/vsock") is not None

    def plug_vsock(self) -> bool:
        """Add ``<vsock model='virtio'><cid auto='yes'/></vsock>`` live and to the config.

        False when the domain already has one (libvirt allows one per domain).
        """
        if self.has_vsock() or (self.is_persistent() and self.has_vsock(inactive=True)):
            return False
        with self._edge("hot-plugging a vsock device into"):
            self._dom.attachDeviceFlags(vsock_xml(), _affect(self._scope()))
        log.info("%s: vsock device added", self.name)
        return True

    def unplug_vsock(self) -> bool:
        for inactive in (False, True):
            if not inactive and not self.is_active():
                continue
            node = ET.fromstring(self.xml(inactive)).find("./devices/vsock")
            if node is None:
                continue
            with self._edge("hot-unplugging the vsock device of"):
                self._dom.detachDeviceFlags(ET.tostring(node, encoding="unicode"),
                                            _affect(Scope.CONFIG if inactive else Scope.LIVE))
        log.info("%s: vsock device removed", self.name)
        return True

    # -- region devices ---------------------------------------------------------

    def _shmem_nodes(self, name: str) -> dict[Scope, ET.Element]:
        """The domain's <shmem name=NAME> element by where it is."""
        found = {}
        where = []
        if self.is_active():
            where.append((Scope.LIVE, False))
        if self.is_persistent():
            where.append((Scope.CONFIG, True))
        for scope, inactive in where:
            for node in ET.fromstring(self.xml(inactive)).findall("./devices/shmem"):
                if node.get("name") == name:
                    found[scope] = node
        return found

    def shmem_size(self, name: str, live: bool = False) -> int | None:
        """The size in bytes of the domain's <shmem name=NAME> device, live if it runs,
        else in its config (``live``: only the running domain's); None when it has none."""
        nodes = self._shmem_nodes(name)
        node = nodes.get(Scope.LIVE)
        if node is None and not live:
            node = nodes.get(Scope.CONFIG)
        return None if node is None else _shmem_size(node)

    def plug_shmem(self, name: str, size: int) -> Scope:
        """Add ``<shmem name=NAME>`` (ivshmem-plain, ``size`` bytes) to the running domain
        and to its config, where it is missing; returns where it was added (empty: it
        was there already), for unplug_shmem to undo.

        A device of that name with another size is refused: ivshmem cannot be resized.
        """
        nodes = self._shmem_nodes(name)
        for node in nodes.values():
            if _shmem_size(node) != size:
                have = _shmem_size(node)
                raise ShmemMismatch(
                    f"{self.name} already has the region device {name} of "
                    f"{format_size(have)}, not {format_size(size)}, and ivshmem cannot be "
                    f"resized: give --region {format_size(have).replace(' ', '')}, or remove the "
                    f"device from the domain first (virsh edit {self.name})")
        scope = self._scope()
        for there in nodes:  # add it only where it is missing
            scope &= ~there
        if not scope:
            return Scope(0)
        try:
            self._dom.attachDeviceFlags(shmem_xml(name, size >> 20), _affect(scope))
        except libvirt.libvirtError as exc:
            if scope & Scope.LIVE and not _lost(exc) and exc.get_error_code() not in (
                    libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED):
                raise ShmemHotPlugFailed(
                    f"hot-plugging the region device {name} into the running domain "
                    f"{self.name} failed: {exc.get_error_message() or exc} (libvirt error "
                    f"{exc.get_error_code()}). The usual cause: ivshmem-plain is a "
                    "conventional PCI device, which a running q35 guest takes only in a free "
                    "slot of a pcie-to-pci-bridge (or pci-bridge), and libvirt cannot add "
                    f"one to a running domain. Shut the guest down (virsh shutdown "
                    f"{self.name}) and attach again: libvirt then adds the bridge to its "
                    "config and the device comes with its next start; or attach without "
                    "--region (copies then go through the socket)") from None
            raise translate(exc, f"adding the region device {name} to {self.name}",
                            self.name) from None
        log.info("%s: region device %s (%s) added", self.name, name, format_size(size))
        return scope

    def unplug_shmem(self, name: str, only: Scope | None = None) -> Scope:
        """Remove ``<shmem name=NAME>`` from the running domain and from its config (or
        only from where ``only`` says); returns where it was removed (empty: nowhere)."""
        removed = Scope(0)
        for scope, node in sorted(self._shmem_nodes(name).items()):
            if only is not None and not scope & only:
                continue
            with _translated(f"removing the region device {name} from {self.name}",
                             self.name):
                self._dom.detachDeviceFlags(ET.tostring(node, encoding="unicode"),
                                            _affect(scope))
            removed |= scope
        if removed:
            log.info("%s: region device %s removed", self.name, name)
        return removed

    # -- slice metadata ---------------------------------------------------------------

    def write_slice(self, gpu_uuid: str, gpu_index: int, mem: int, compute: int,
                    more: list[dict] = (), region: int = 0) -> None:
        """The VM's vGPU 0, and its others in ``more`` (see render.slice_metadata_xml)."""
        xml = slice_metadata_xml(gpu_uuid, gpu_index, mem, compute, more, region)
        scope = self._scope()
        with self._edge("writing the slice into the metadata of"):
            self._dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, PREFIX, NAMESPACE,
                                  _affect(scope))

    def clear_slice(self) -> None:
        scope = self._scope()
        with self._edge("removing the slice from the metadata of"):
            self._dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NAMESPACE,
                                  _affect(scope))

    def read_slice(self) -> DomainSlice | None:
        """The VM's vGPU 0 as recorded, or None."""
        vgpus = self.read_vgpus()
        return vgpus[0] if vgpus else None

    def read_vgpus(self) -> list[DomainSlice]:
        """Every vGPU recorded in the domain, by device number."""
        flags = 0 if self.is_active() else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        try:
            xml = self._dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, flags)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                return []
            raise translate(exc, f"reading {self.name}'s metadata", self.name) from None
        root = ET.fromstring(xml)
        try:
            out = [_recorded(self.name, root, 0)]
            out += [_recorded(self.name, v, int(v.get("device"))) for v in root.findall("vgpu")]
        except (AttributeError, TypeError, ValueError):
            log.warning("%s: hvgpu metadata is malformed, ignored: %s", self.name, xml)
            return []
        return sorted(out, key=lambda d: d.device)


# -- lifecycle events -------------------------------------------------------------------


class EventKind(enum.Enum):
    """What happened to a domain, as hvgpu tells lifecycle events apart."""

    DEFINED = "defined"
    UNDEFINED = "undefined"
    STARTED = "started"
    RESUMED = "resumed"
    SUSPENDED = "suspended"
    MIGRATING = "migrating"  # paused for an outgoing migration
    SHUTDOWN = "shutdown"  # the guest shut itself down; "stopped" follows
    STOPPED = "stopped"  # no longer runs (crashed included)


@dataclass(frozen=True)
class LifecycleEvent:
    """One lifecycle event of one domain."""

    vm: str
    uuid: str
    kind: EventKind


_CLOSE_REASONS = {0: "an error on the connection", 1: "libvirtd closed the connection",
                  2: "libvirtd stopped answering keepalive messages",
                  3: "the connection was closed on this side"}


def _event_kind(event: int, detail: int) -> EventKind | None:
    if event == libvirt.VIR_DOMAIN_EVENT_SUSPENDED and \
            detail == libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED:
        return EventKind.MIGRATING
    return {
        libvirt.VIR_DOMAIN_EVENT_STARTED: EventKind.STARTED,
        libvirt.VIR_DOMAIN_EVENT_RESUMED: EventKind.RESUMED,
        libvirt.VIR_DOMAIN_EVENT_STOPPED: EventKind.STOPPED,
        libvirt.VIR_DOMAIN_EVENT_CRASHED: EventKind.STOPPED,
        libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: EventKind.SHUTDOWN,
        libvirt.VIR_DOMAIN_EVENT_UNDEFINED: EventKind.UNDEFINED,
        libvirt.VIR_DOMAIN_EVENT_DEFINED: EventKind.DEFINED,
        libvirt.VIR_DOMAIN_EVENT_SUSPENDED: EventKind.SUSPENDED,
    }.get(event)


class Hypervisor:
    """One connection to libvirt at ``uri``; hands out ``Domain``s."""

    def __init__(self, uri: str = DEFAULT_URI):
        if libvirt is None:
            raise HypervisorError("libvirt-python is not installed on the host "
                                  "(pip install 'hvgpu[host]')")
        self.uri = uri
        # Errors come back as exceptions and are translated; libvirt's default
        # handler would also print each one to stderr.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self._conn = self._open()
        self._on_event: Callable[[LifecycleEvent], None] | None = None
        self._on_closed: Callable[[str], None] | None = None
        self._event_id: int | None = None
        self._closed_here = False

    def _open(self):
        try:
            return libvirt.open(self.uri)
        except libvirt.libvirtError as exc:
            raise Unreachable(f"cannot connect to libvirt at {self.uri}: "
                              f"{exc.get_error_message()}; is libvirtd running, and may "
                              "you use it?") from None

    # -- lookup ------------------------------------------------------------------

    def domain(self, name_or_uuid: str) -> Domain:
        with _translated(f"looking up {name_or_uuid}", name_or_uuid):
            try:
                return Domain(self, self._conn.lookupByName(name_or_uuid))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN or len(name_or_uuid) != 36:
                    raise
                return Domain(self, self._conn.lookupByUUIDString(name_or_uuid))

    def domains(self) -> list[Domain]:
        """Every domain, running or defined, by name."""
        with _translated("listing the domains"):
            found = [Domain(self, d) for d in self._conn.listAllDomains()]
        return sorted(found, key=lambda d: d.name)

    def names(self) -> list[str]:
        return [d.name for d in self.domains()]

    def define(self, xml: str) -> Domain:
        """Define (or redefine) a domain from its XML, as ``virsh define`` does."""
        with _translated("defining a domain"):
            return Domain(self, self._conn.defineXML(xml))

    def recorded_slices(self) -> list[DomainSlice]:
        out = []
        for dom in self.domains():
            out += dom.read_vgpus()
        return out

    def qemu_uid(self) -> int | None:
        """The uid libvirt runs QEMU as (its DAC security model's base label), or None
        where the driver does not say."""
        try:
            caps = ET.fromstring(self._conn.getCapabilities())
        except (libvirt.libvirtError, ET.ParseError):
            return None
        for model in caps.findall("./host/secmodel"):
            if model.findtext("model") != "dac":
                continue
            for label in model.findall("baselabel"):
                uid = (label.text or "").split(":", 1)[0].lstrip("+")
                if uid.isdigit():
                    return int(uid)
        return None

    def is_local(self) -> bool:
        """Whether the domains run on this machine (their /dev/shm is this one's)."""
        return "://" in self.uri and self.uri.split("://", 1)[1].startswith("/")

    # -- events and the connection ------------------------------------------------------

    def watch(self, on_event: Callable[[LifecycleEvent], None],
              on_closed: Callable[[str], None] | None = None) -> None:
        """Call ``on_event(LifecycleEvent)`` for each lifecycle event of any domain, and
        ``on_closed(reason)`` when the connection to libvirt is lost.

        Both are called on libvirt's event loop thread (start_event_loop(), which must
        run before the first connection is opened: libvirt's rule) and must only hand
        the record on: while one runs, no other event is delivered. After the
        connection is lost nothing more arrives until reconnect() succeeds.
        """
        self._on_event, self._on_closed = on_event, on_closed
        self._register(self._conn)

    def _register(self, conn) -> None:
        with _translated(f"watching the domains of {self.uri}"):
            self._event_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._lifecycle, None)
            if self._on_closed is not None:
                conn.registerCloseCallback(self._closed, None)

    def _lifecycle(self, _conn, dom, event, detail, _opaque) -> None:
        kind = _event_kind(event, detail)
        if kind is None or self._on_event is None:
            return
        try:  # name and UUID are held by the object: no call to libvirtd
            record = LifecycleEvent(vm=dom.name(), uuid=dom.UUIDString(), kind=kind)
            self._on_event(record)
        except Exception:
            log.exception("handing on the lifecycle event %s of a domain failed", kind.value)

    def _closed(self, conn, reason: int, _opaque) -> None:
        if conn is not self._conn or self._on_closed is None:
            return  # a connection already replaced by reconnect()
        why = _CLOSE_REASONS.get(reason, f"reason {reason}")
        try:
            self._on_closed(f"the connection to libvirt at {self.uri} is lost: {why}")
        except Exception:
            log.exception("handing on the loss of the connection to libvirt failed")

    def reconnect(self) -> None:
        """Open a new connection to the same URI and watch it as the old one was watched.

        Raises Unreachable, and keeps the old connection, while libvirtd does not answer.
        Domains looked up before are looked up again on the new connection when used.
        """
        new = self._open()
        old, old_id = self._conn, self._event_id
        self._conn = new
        if self._on_event is not None:
            try:
                self._register(new)
            except HypervisorError:
                self._conn, self._event_id = old, old_id
                _quietly(new.close)
                raise
        self._forget(old, old_id)
        log.info("libvirt at %s: connected again", self.uri)

    def _forget(self, conn, event_id: int | None) -> None:
        """Stop watching a connection and close it (quietly: it may be dead already)."""
        if event_id is not None:
            _quietly(lambda: conn.domainEventDeregisterAny(event_id))
        _quietly(conn.unregisterCloseCallback)
        _quietly(conn.close)

    def close(self) -> None:
        """Close the connection (the domains already looked up stay usable)."""
        if self._closed_here:
            return
        self._closed_here = True
        self._on_event = self._on_closed = None  # a deliberate close is no loss
        self._forget(self._conn, self._event_id)


def _quietly(call) -> None:
    try:
        call()
    except libvirt.libvirtError:
        pass


_loop_started = False


def start_event_loop() -> None:
    """libvirt's default event loop, once per process, in a daemon thread."""
    global _loop_started
    if _loop_started or libvirt is None:
        return
    libvirt.virEventRegisterDefaultImpl()

    def run():
        while True:
            libvirt.virEventRunDefaultImpl()

    threading.Thread(target=run, name="libvirt-events", daemon=True).start()
    _loop_started = True
