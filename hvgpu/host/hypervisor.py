"""libvirt: find VMs, give them a vsock device and shared-memory devices, keep their
slice on the domain.

The only module in hvgpu that imports libvirt. libvirt errors are translated
by error code (``libvirtError.get_error_code()``) into hvgpu errors that say
what to do. The slice is written into the domain's own metadata, in hvgpu's
private namespace, so it follows the domain and survives agent restarts.
Lifecycle events come from libvirt's event loop (never hook scripts: a hook
that calls back into libvirt deadlocks). Must not decide placement or quotas.
"""

from __future__ import annotations

import logging
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.names import MAX_VGPUS
from hvgpu.host.render import NAMESPACE, PREFIX, shmem_xml, slice_metadata_xml, vsock_xml
from hvgpu.units import BadValue, check_shm_size, format_size

try:
    import libvirt
except ImportError:  # reported when a hypervisor is first asked for
    libvirt = None

log = logging.getLogger(__name__)

DEFAULT_URI = "qemu:///system"


class HypervisorError(HvgpuError):
    code = "libvirt"


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


def translate(exc, doing: str, vm: str = "") -> HypervisorError:
    """One libvirt error as the hvgpu error an operator can act on."""
    code = exc.get_error_code()
    c = _codes()
    detail = exc.get_error_message() or str(exc)
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
    shm: int = 0  # bytes; metadata without it (written before it existed) reads as 0


def _recorded(vm: str, element, device: int) -> DomainSlice:
    """One vGPU from the metadata; ValueError when a value is not one hvgpu writes."""
    gpu = element.find("gpu")
    d = DomainSlice(vm=vm, gpu_uuid=gpu.get("uuid"), gpu_index=int(gpu.get("index")),
                    mem=int(element.findtext("memory")),
                    compute=int(element.findtext("compute") or 0), device=device,
                    shm=int(element.findtext("shm") or 0))
    if not d.gpu_uuid or d.gpu_index < 0 or d.mem <= 0 or not 0 <= d.compute <= 100 \
            or not 0 <= d.device < MAX_VGPUS:
        raise ValueError(f"out of range: {d}")
    try:
        check_shm_size(d.shm)
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


class Hypervisor:
    def __init__(self, uri: str = DEFAULT_URI):
        if libvirt is None:
            raise HypervisorError("libvirt-python is not installed on the host "
                                  "(pip install 'hvgpu[host]')")
        self.uri = uri
        # Errors come back as exceptions and are translated; libvirt's default
        # handler would also print each one to stderr.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise HypervisorError(f"cannot connect to libvirt at {uri}: "
                                  f"{exc.get_error_message()}; is libvirtd running, and may "
                                  "you use it?") from None
        self._events: threading.Thread | None = None

    # -- lookup ------------------------------------------------------------------

    def domain(self, name_or_uuid: str):
        try:
            try:
                return self.conn.lookupByName(name_or_uuid)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN or len(name_or_uuid) != 36:
                    raise
                return self.conn.lookupByUUIDString(name_or_uuid)
        except libvirt.libvirtError as exc:
            raise translate(exc, f"looking up {name_or_uuid}", name_or_uuid) from None

    def names(self) -> list[str]:
        return sorted(d.name() for d in self.conn.listAllDomains())

    @staticmethod
    def is_active(dom) -> bool:
        return bool(dom.isActive())

    def vsock_cid(self, dom) -> int | None:
        """The guest CID of the domain's vsock device, from its live XML when running.

        None when the domain has no vsock device, or an automatic CID not yet
        assigned (a domain that is shut off).
        """
        root = ET.fromstring(dom.XMLDesc(0))
        cid = root.find("./devices/vsock/cid")
        if cid is None or cid.get("address") is None:
            return None
        return int(cid.get("address"))

    def has_vsock(self, dom, inactive: bool = False) -> bool:
        flags = libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
        return ET.fromstring(dom.XMLDesc(flags)).find("./devices/vsock") is not None

    # -- vsock device --------------------------------------------------------------

    def _flags(self, dom) -> int:
        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG if dom.isPersistent() else 0
        if self.is_active(dom):
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        return flags

    def plug_vsock(self, dom) -> bool:
        """Add ``<vsock model='virtio'><cid auto='yes'/></vsock>`` live and to the config.

        False when the domain already has one (libvirt allows one per domain).
        """
        if self.has_vsock(dom) or (dom.isPersistent() and self.has_vsock(dom, inactive=True)):
            return False
        try:
            dom.attachDeviceFlags(vsock_xml(), self._flags(dom))
        except libvirt.libvirtError as exc:
            raise translate(exc, f"hot-plugging a vsock device into {dom.name()}",
                            dom.name()) from None
        log.info("%s: vsock device added", dom.name())
        return True

    def unplug_vsock(self, dom) -> bool:
        for inactive in (False, True):
            flags = libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
            node = ET.fromstring(dom.XMLDesc(flags)).find("./devices/vsock")
            if node is None:
                continue
            which = libvirt.VIR_DOMAIN_AFFECT_CONFIG if inactive else libvirt.VIR_DOMAIN_AFFECT_LIVE
            if not inactive and not self.is_active(dom):
                continue
            try:
                dom.detachDeviceFlags(ET.tostring(node, encoding="unicode"), which)
            except libvirt.libvirtError as exc:
                raise translate(exc, f"hot-unplugging the vsock device of {dom.name()}",
                                dom.name()) from None
        log.info("%s: vsock device removed", dom.name())
        return True

    # -- shared-memory devices ---------------------------------------------------------

    def _shmem_nodes(self, dom, name: str) -> dict[int, object]:
        """The domain's <shmem name=NAME> element by where it is: VIR_DOMAIN_AFFECT_LIVE
        (the running domain) and VIR_DOMAIN_AFFECT_CONFIG (its persistent config)."""
        found = {}
        where = []
        if self.is_active(dom):
            where.append((libvirt.VIR_DOMAIN_AFFECT_LIVE, 0))
        if dom.isPersistent():
            where.append((libvirt.VIR_DOMAIN_AFFECT_CONFIG, libvirt.VIR_DOMAIN_XML_INACTIVE))
        for scope, flags in where:
            for node in ET.fromstring(dom.XMLDesc(flags)).findall("./devices/shmem"):
                if node.get("name") == name:
                    found[scope] = node
        return found

    def shmem_size(self, dom, name: str, live: bool = False) -> int | None:
        """The size in bytes of the domain's <shmem name=NAME> device, live if it runs,
        else in its config (``live``: only the running domain's); None when it has none."""
        nodes = self._shmem_nodes(dom, name)
        node = nodes.get(libvirt.VIR_DOMAIN_AFFECT_LIVE)
        if node is None and not live:
            node = nodes.get(libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        return None if node is None else _shmem_size(node)

    def plug_shmem(self, dom, name: str, size: int) -> int:
        """Add ``<shmem name=NAME>`` (ivshmem-plain, ``size`` bytes) to the running domain
        and to its config, where it is missing; returns where it was added (libvirt's
        VIR_DOMAIN_AFFECT_* flags; 0: it was there already), for unplug_shmem to undo.

        A device of that name with another size is refused: ivshmem cannot be resized.
        """
        nodes = self._shmem_nodes(dom, name)
        for node in nodes.values():
            if _shmem_size(node) != size:
                have = _shmem_size(node)
                raise ShmemMismatch(
                    f"{dom.name()} already has the shared-memory device {name} of "
                    f"{format_size(have)}, not {format_size(size)}, and ivshmem cannot be "
                    f"resized: give --shm {format_size(have).replace(' ', '')}, or remove the "
                    f"device from the domain first (virsh edit {dom.name()})")
        flags = self._flags(dom)
        for scope in nodes:  # add it only where it is missing
            flags &= ~scope
        if not flags:
            return 0
        try:
            dom.attachDeviceFlags(shmem_xml(name, size >> 20), flags)
        except libvirt.libvirtError as exc:
            if flags & libvirt.VIR_DOMAIN_AFFECT_LIVE and exc.get_error_code() not in (
                    libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED):
                raise ShmemHotPlugFailed(
                    f"hot-plugging the shared-memory device {name} into the running domain "
                    f"{dom.name()} failed: {exc.get_error_message() or exc} (libvirt error "
                    f"{exc.get_error_code()}). The usual cause: ivshmem-plain is a "
                    "conventional PCI device, which a running q35 guest takes only in a free "
                    "slot of a pcie-to-pci-bridge (or pci-bridge), and libvirt cannot add "
                    f"one to a running domain. Shut the guest down (virsh shutdown "
                    f"{dom.name()}) and attach again: libvirt then adds the bridge to its "
                    "config and the device comes with its next start; or attach without "
                    "--shm (copies then go through the socket)") from None
            raise translate(exc, f"adding the shared-memory device {name} to {dom.name()}",
                            dom.name()) from None
        log.info("%s: shared-memory device %s (%s) added", dom.name(), name, format_size(size))
        return flags

    def unplug_shmem(self, dom, name: str, only: int | None = None) -> int:
        """Remove ``<shmem name=NAME>`` from the running domain and from its config (or
        only from where ``only`` says); returns where it was removed (0: nowhere)."""
        removed = 0
        for scope, node in sorted(self._shmem_nodes(dom, name).items()):
            if only is not None and not scope & only:
                continue
            try:
                dom.detachDeviceFlags(ET.tostring(node, encoding="unicode"), scope)
            except libvirt.libvirtError as exc:
                raise translate(exc, f"removing the shared-memory device {name} from "
                                f"{dom.name()}", dom.name()) from None
            removed |= scope
        if removed:
            log.info("%s: shared-memory device %s removed", dom.name(), name)
        return removed

    def qemu_uid(self) -> int | None:
        """The uid libvirt runs QEMU as (its DAC security model's base label), or None
        where the driver does not say."""
        try:
            caps = ET.fromstring(self.conn.getCapabilities())
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

    # -- slice metadata ---------------------------------------------------------------

    def write_slice(self, dom, gpu_uuid: str, gpu_index: int, mem: int, compute: int,
                    more: list[dict] = (), shm: int = 0) -> None:
        """The VM's vGPU 0, and its others in ``more`` (see render.slice_metadata_xml)."""
        xml = slice_metadata_xml(gpu_uuid, gpu_index, mem, compute, more, shm)
        try:
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, PREFIX, NAMESPACE,
                            self._flags(dom))
        except libvirt.libvirtError as exc:
            raise translate(exc, f"writing the slice into {dom.name()}'s metadata",
                            dom.name()) from None

    def clear_slice(self, dom) -> None:
        try:
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NAMESPACE,
                            self._flags(dom))
        except libvirt.libvirtError as exc:
            raise translate(exc, f"removing the slice from {dom.name()}'s metadata",
                            dom.name()) from None

    def read_slice(self, dom) -> DomainSlice | None:
        """The VM's vGPU 0 as recorded, or None."""
        vgpus = self.read_vgpus(dom)
        return vgpus[0] if vgpus else None

    def read_vgpus(self, dom) -> list[DomainSlice]:
        """Every vGPU recorded in the domain, by device number."""
        flags = 0 if self.is_active(dom) else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        try:
            xml = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, flags)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                return []
            raise translate(exc, f"reading {dom.name()}'s metadata", dom.name()) from None
        root = ET.fromstring(xml)
        try:
            out = [_recorded(dom.name(), root, 0)]
            out += [_recorded(dom.name(), v, int(v.get("device"))) for v in root.findall("vgpu")]
        except (AttributeError, TypeError, ValueError):
            log.warning("%s: hvgpu metadata is malformed, ignored: %s", dom.name(), xml)
            return []
        return sorted(out, key=lambda d: d.device)

    def recorded_slices(self) -> list[DomainSlice]:
        out = []
        for dom in sorted(self.conn.listAllDomains(), key=lambda d: d.name()):
            out += self.read_vgpus(dom)
        return out

    # -- lifecycle events -----------------------------------------------------------------

    def watch(self, on_event: Callable[[str, str], None]) -> None:
        """Call ``on_event(vm, what)`` with what in started/stopped/undefined/migrating.

        Runs libvirt's default event loop in a daemon thread. Must be called
        before any other connection is opened in this process (libvirt's rule).
        """
        kinds = {
            libvirt.VIR_DOMAIN_EVENT_STARTED: "started",
            libvirt.VIR_DOMAIN_EVENT_RESUMED: "resumed",
            libvirt.VIR_DOMAIN_EVENT_STOPPED: "stopped",
            libvirt.VIR_DOMAIN_EVENT_CRASHED: "stopped",
            libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: "shutdown",
            libvirt.VIR_DOMAIN_EVENT_UNDEFINED: "undefined",
            libvirt.VIR_DOMAIN_EVENT_DEFINED: "defined",
            libvirt.VIR_DOMAIN_EVENT_SUSPENDED: "suspended",
        }

        def callback(conn, dom, event, detail, opaque):
            what = kinds.get(event)
            if event == libvirt.VIR_DOMAIN_EVENT_SUSPENDED and \
                    detail == libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED:
                what = "migrating"
            if what:
                try:
                    on_event(dom.name(), what)
                except Exception:
                    log.exception("handling %s of %s failed", what, dom.name())

        self.conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                         callback, None)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
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
