"""libvirt: find VMs, give them a vsock device, keep their slice on the domain.

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
from hvgpu.host.render import NAMESPACE, PREFIX, slice_metadata_xml, vsock_xml

try:
    import libvirt
except ImportError:  # reported when a hypervisor is first asked for
    libvirt = None

log = logging.getLogger(__name__)

DEFAULT_URI = "qemu:///system"


class HypervisorError(HvgpuError):
    code = "libvirt"


class NoSuchVm(HypervisorError):
    code = "unknown-vm"


class NotSupported(HypervisorError):
    code = "not-supported"


class NoVhostVsock(HypervisorError):
    code = "no-vhost-vsock"


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
    if doing.startswith("hot-plug") and code in (c["config_unsupported"], c["system"],
                                                  c["internal"]):
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


def _recorded(vm: str, element, device: int) -> DomainSlice:
    """One vGPU from the metadata; ValueError when a value is not one hvgpu writes."""
    gpu = element.find("gpu")
    d = DomainSlice(vm=vm, gpu_uuid=gpu.get("uuid"), gpu_index=int(gpu.get("index")),
                    mem=int(element.findtext("memory")),
                    compute=int(element.findtext("compute") or 0), device=device)
    if not d.gpu_uuid or d.gpu_index < 0 or d.mem <= 0 or not 0 <= d.compute <= 100 \
            or not 0 <= d.device < MAX_VGPUS:
        raise ValueError(f"out of range: {d}")
    return d


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

    # -- slice metadata ---------------------------------------------------------------

    def write_slice(self, dom, gpu_uuid: str, gpu_index: int, mem: int, compute: int,
                    more: list[dict] = ()) -> None:
        """The VM's vGPU 0, and its others in ``more`` (see render.slice_metadata_xml)."""
        xml = slice_metadata_xml(gpu_uuid, gpu_index, mem, compute, more)
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
