"""hypervisor.py against libvirt's real test:///default driver."""

from __future__ import annotations

import threading
import time

import pytest

libvirt = pytest.importorskip("libvirt")

from hvgpu.host import hypervisor as hv  # noqa: E402
from hvgpu.host.hypervisor import (EventKind, Hypervisor, LifecycleEvent, NoSuchVm,  # noqa: E402
                                   NotSupported, Scope)

hv.start_event_loop()  # before the first connection, as libvirt requires

DOMAIN = """<domain type='test'><name>{name}</name><memory>1048576</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><devices>{devices}</devices></domain>"""


def raw():
    """A connection of the test's own to the same test host, for what hvgpu never does."""
    return libvirt.open("test:///default")


@pytest.fixture
def h():
    # test:///default is one host shared by the whole process: each test
    # defines its own domains and removes them
    hyper = Hypervisor("test:///default")
    before = set(hyper.names())
    yield hyper
    for dom in hyper.domains():
        if dom.name not in before:
            if dom.is_active():
                dom.destroy()
            dom.undefine()
    hyper.close()


def test_finds_domains_by_name_and_uuid(h):
    dom = h.define(DOMAIN.format(name="hv-a", devices=""))
    assert h.domain(dom.uuid).name == "hv-a" and h.domain(dom.uuid) == dom
    with pytest.raises(NoSuchVm, match="libvirt has no domain 'nope'"):
        h.domain("nope")


def test_reads_the_cid_of_an_existing_vsock_device(h):
    dom = h.define(DOMAIN.format(
        name="hv-b", devices="<vsock model='virtio'><cid auto='no' address='7'/></vsock>"))
    assert dom.has_vsock() and dom.vsock_cid() == 7
    assert dom.plug_vsock() is False  # one per domain: reuse it


def test_hot_plug_is_translated_when_the_driver_cannot(h):
    dom = h.define(DOMAIN.format(name="hv-c", devices=""))
    with pytest.raises(NotSupported, match="cannot do that"):
        dom.plug_vsock()


def test_slice_metadata_round_trips_on_running_and_defined_domains(h):
    running = h.define(DOMAIN.format(name="hv-d", devices=""))
    running.start()
    running.write_slice("GPU-abc", 1, 4 << 30, 25)
    s = running.read_slice()
    assert (s.vm, s.gpu_uuid, s.gpu_index, s.mem, s.compute) == ("hv-d", "GPU-abc", 1, 4 << 30, 25)
    assert "urn:x-hvgpu:slice:1" in running.xml()  # virsh dumpxml shows it
    off = h.define(DOMAIN.format(name="hv-e", devices=""))
    off.write_slice("GPU-def", 0, 1 << 30, 0)
    assert [s.vm for s in h.recorded_slices()] == ["hv-d", "hv-e"]
    running.clear_slice()
    assert running.read_slice() is None


def test_every_vgpu_of_a_vm_round_trips_through_its_metadata(h):
    dom = h.define(DOMAIN.format(name="hv-f", devices=""))
    dom.write_slice("GPU-abc", 0, 4 << 30, 25,
                    [dict(device=1, gpu_uuid="GPU-def", gpu_index=1, mem=2 << 30, compute=50)])
    assert [(d.device, d.gpu_uuid, d.mem, d.compute) for d in dom.read_vgpus()] == [
        (0, "GPU-abc", 4 << 30, 25), (1, "GPU-def", 2 << 30, 50)]
    assert dom.read_slice().device == 0


def test_lifecycle_events_arrive(h):
    seen = []
    got = threading.Event()

    def on_event(event):
        seen.append(event)
        got.set()

    h.watch(on_event)
    dom = h.define(DOMAIN.format(name="hv-f", devices=""))
    dom.start()
    assert got.wait(10)
    got.clear()
    dom.destroy()
    assert got.wait(10)
    got.clear()
    dom.start()
    assert got.wait(10)
    dom.destroy()
    dom.undefine()
    undefined = LifecycleEvent("hv-f", dom.uuid, EventKind.UNDEFINED)
    deadline = time.monotonic() + 10
    while undefined not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert LifecycleEvent("hv-f", dom.uuid, EventKind.STOPPED) in seen
    assert LifecycleEvent("hv-f", dom.uuid, EventKind.STARTED) in seen
    assert undefined in seen and all(isinstance(e.kind, EventKind) for e in seen)


SHMEM = "<shmem name='{name}'><model type='ivshmem-plain'/><size unit='M'>{mib}</size></shmem>"


def test_region_size_round_trips_through_the_metadata_and_is_0_without_it(h):
    dom = h.define(DOMAIN.format(name="hv-s", devices=""))
    dom.write_slice("GPU-abc", 0, 4 << 30, 25,
                    [dict(device=1, gpu_uuid="GPU-def", gpu_index=1, mem=2 << 30, compute=50,
                          region=2 << 20)], region=1 << 30)
    assert [(d.device, d.region) for d in dom.read_vgpus()] == [(0, 1 << 30), (1, 2 << 20)]
    dom.write_slice("GPU-abc", 0, 4 << 30, 25)  # as a release without regions wrote it
    assert "region" not in raw().lookupByName("hv-s").metadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT, hv.NAMESPACE, 0)
    assert dom.read_slice().region == 0


def test_metadata_written_by_an_earlier_version_keeps_its_regions(h):
    # golden/slice-metadata-earlier-shm.xml is what the version before regions had one
    # name wrote: the region's element was <shm>
    from pathlib import Path

    earlier = (Path(__file__).parent / "golden" / "slice-metadata-earlier-shm.xml").read_text()
    dom = h.define(DOMAIN.format(name="hv-w", devices=""))
    raw().lookupByName("hv-w").setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, earlier,
                                           hv.PREFIX, hv.NAMESPACE, 0)
    assert [(d.device, d.mem, d.region) for d in dom.read_vgpus()] == [
        (0, 4 << 30, 1 << 30), (1, 2 << 30, 1 << 30), (2, 2 << 30, 0)]
    dom.write_slice("GPU-abc", 0, 4 << 30, 25, region=1 << 30)  # written back: <region>
    xml = raw().lookupByName("hv-w").metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                                              hv.NAMESPACE, 0)
    assert "region" in xml and "shm" not in xml
    assert dom.read_slice().region == 1 << 30


def test_metadata_with_a_region_size_hvgpu_never_writes_is_ignored(h):
    dom = h.define(DOMAIN.format(name="hv-t", devices=""))
    from hvgpu.host.render import slice_metadata_xml

    raw().lookupByName("hv-t").setMetadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT,
        slice_metadata_xml("GPU-abc", 0, 4 << 30, 25, region=3 << 20), hv.PREFIX, hv.NAMESPACE, 0)
    assert dom.read_vgpus() == []  # 3 MiB is no ivshmem size: not hvgpu's, left alone


def test_a_region_device_already_there_is_reused_and_one_of_another_size_refused(h):
    dom = h.define(DOMAIN.format(name="hv-u", devices=SHMEM.format(name="hvgpu-hv-u", mib=4)))
    assert dom.shmem_size("hvgpu-hv-u") == 4 << 20 and dom.shmem_size("other") is None
    assert dom.plug_shmem("hvgpu-hv-u", 4 << 20) == Scope(0)  # nothing to add or undo
    with pytest.raises(hv.ShmemMismatch, match=r"already has the region device "
                       r"hvgpu-hv-u of 4 MiB, not 8 MiB.*give --region 4MiB"):
        dom.plug_shmem("hvgpu-hv-u", 8 << 20)


def test_adding_a_region_device_is_translated_when_the_driver_cannot(h):
    dom = h.define(DOMAIN.format(name="hv-v", devices=""))
    with pytest.raises(NotSupported, match="adding the region device hvgpu-hv-v .*"
                       "cannot do that"):
        dom.plug_shmem("hvgpu-hv-v", 1 << 20)
    assert dom.unplug_shmem("hvgpu-hv-v") == Scope(0)  # none there: nothing to remove


def test_after_reconnecting_domains_found_before_still_work_and_events_come_once(h):
    seen = []
    got = threading.Event()

    def on_event(event):
        seen.append(event)
        got.set()

    h.watch(on_event, lambda reason: None)
    dom = h.define(DOMAIN.format(name="hv-r", devices=""))
    h.reconnect()
    dom.start()  # looked up again on the new connection
    assert dom.is_active() and h.domain("hv-r").is_active()
    dom.destroy()
    stopped = LifecycleEvent("hv-r", dom.uuid, EventKind.STOPPED)
    deadline = time.monotonic() + 10
    while stopped not in seen and time.monotonic() < deadline:
        got.wait(1)
        got.clear()
    # the old connection's registration is gone: each event is seen once (libvirt
    # delivers an event to every registration before the next event); the definition
    # came before reconnecting, its event to the old registration or to none
    assert [e.kind for e in seen if e.vm == "hv-r" and e.kind is not EventKind.DEFINED] == [
        EventKind.STARTED, EventKind.STOPPED]


def test_a_lost_connection_is_reported_once_with_its_reason(h):
    # The test driver never loses its connection: libvirt's close callback is called
    # here as libvirt calls it (tests/host/test_libvirtd.py loses a real one).
    reasons = []
    h.watch(lambda event: None, reasons.append)
    old = h._conn
    h._closed(old, libvirt.VIR_CONNECT_CLOSE_REASON_EOF, None)
    assert reasons == ["the connection to libvirt at test:///default is lost: libvirtd "
                       "closed the connection"]
    h.reconnect()
    h._closed(old, libvirt.VIR_CONNECT_CLOSE_REASON_KEEPALIVE, None)  # replaced: not news
    assert len(reasons) == 1


def test_reconnecting_while_libvirt_cannot_be_reached_says_so_and_keeps_the_old_connection(
        tmp_path):
    host = tmp_path / "host.xml"  # a test driver host of its own, read at each connect
    host.write_text("<node>" + DOMAIN.format(name="hv-own", devices="") + "</node>")
    hyper = Hypervisor(f"test://{host}")
    try:
        hyper.watch(lambda event: None, lambda reason: None)
        host.unlink()
        with pytest.raises(hv.Unreachable, match=f"cannot connect to libvirt at test://{host}"):
            hyper.reconnect()
        assert hyper.names() == ["hv-own"]
    finally:
        hyper.close()


def test_an_error_that_says_the_connection_is_gone_is_translated_as_unreachable():
    exc = libvirt.libvirtError("lost")
    exc.err = (libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_RPC,
               "internal error: client socket is closed", 2, None, None, None, -1, -1)
    err = hv.translate(exc, "reading the XML of vm1", "vm1")
    assert isinstance(err, hv.Unreachable) and err.code == "libvirt-unreachable"
    assert "connection to libvirtd is lost" in str(err)


def test_closing_twice_is_harmless_and_domains_found_before_stay_usable():
    hyper = Hypervisor("test:///default")
    dom = hyper.domain("test")  # the driver's own domain
    hyper.close()
    hyper.close()
    assert "<name>test</name>" in dom.xml()
