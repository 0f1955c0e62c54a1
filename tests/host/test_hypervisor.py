"""hypervisor.py against libvirt's real test:///default driver."""

from __future__ import annotations

import threading
import time

import pytest

libvirt = pytest.importorskip("libvirt")

from hvgpu.host import hypervisor as hv  # noqa: E402
from hvgpu.host.hypervisor import Hypervisor, NoSuchVm, NotSupported  # noqa: E402

hv.start_event_loop()  # before the first connection, as libvirt requires

DOMAIN = """<domain type='test'><name>{name}</name><memory>1048576</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><devices>{devices}</devices></domain>"""


@pytest.fixture
def h():
    # test:///default is one host shared by the whole process: each test
    # defines its own domains and removes them
    hyper = Hypervisor("test:///default")
    before = set(hyper.names())
    yield hyper
    for dom in hyper.conn.listAllDomains():
        if dom.name() not in before:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
    hyper.close()


def test_finds_domains_by_name_and_uuid(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-a", devices=""))
    assert h.domain(dom.UUIDString()).name() == "hv-a"
    with pytest.raises(NoSuchVm, match="libvirt has no domain 'nope'"):
        h.domain("nope")


def test_reads_the_cid_of_an_existing_vsock_device(h):
    dom = h.conn.defineXML(DOMAIN.format(
        name="hv-b", devices="<vsock model='virtio'><cid auto='no' address='7'/></vsock>"))
    assert h.has_vsock(dom) and h.vsock_cid(dom) == 7
    assert h.plug_vsock(dom) is False  # one per domain: reuse it


def test_hot_plug_is_translated_when_the_driver_cannot(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-c", devices=""))
    with pytest.raises(NotSupported, match="cannot do that"):
        h.plug_vsock(dom)


def test_slice_metadata_round_trips_on_running_and_defined_domains(h):
    running = h.conn.defineXML(DOMAIN.format(name="hv-d", devices=""))
    running.create()
    h.write_slice(running, "GPU-abc", 1, 4 << 30, 25)
    s = h.read_slice(running)
    assert (s.vm, s.gpu_uuid, s.gpu_index, s.mem, s.compute) == ("hv-d", "GPU-abc", 1, 4 << 30, 25)
    assert "urn:x-hvgpu:slice:1" in running.XMLDesc(0)  # virsh dumpxml shows it
    off = h.conn.defineXML(DOMAIN.format(name="hv-e", devices=""))
    h.write_slice(off, "GPU-def", 0, 1 << 30, 0)
    assert [s.vm for s in h.recorded_slices()] == ["hv-d", "hv-e"]
    h.clear_slice(running)
    assert h.read_slice(running) is None


def test_every_vgpu_of_a_vm_round_trips_through_its_metadata(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-f", devices=""))
    h.write_slice(dom, "GPU-abc", 0, 4 << 30, 25,
                  [dict(device=1, gpu_uuid="GPU-def", gpu_index=1, mem=2 << 30, compute=50)])
    assert [(d.device, d.gpu_uuid, d.mem, d.compute) for d in h.read_vgpus(dom)] == [
        (0, "GPU-abc", 4 << 30, 25), (1, "GPU-def", 2 << 30, 50)]
    assert h.read_slice(dom).device == 0


def test_lifecycle_events_arrive(h):
    seen = []
    got = threading.Event()

    def on_event(vm, what):
        seen.append((vm, what))
        got.set()

    h.watch(on_event)
    dom = h.conn.defineXML(DOMAIN.format(name="hv-f", devices=""))
    dom.create()
    assert got.wait(10)
    got.clear()
    dom.destroy()
    assert got.wait(10)
    got.clear()
    dom.create()
    assert got.wait(10)
    dom.destroy()
    dom.undefine()
    deadline = time.monotonic() + 10
    while ("hv-f", "undefined") not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("hv-f", "stopped") in seen and ("hv-f", "started") in seen
    assert ("hv-f", "undefined") in seen


SHMEM = "<shmem name='{name}'><model type='ivshmem-plain'/><size unit='M'>{mib}</size></shmem>"


def test_shared_memory_size_round_trips_through_the_metadata_and_is_0_without_it(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-s", devices=""))
    h.write_slice(dom, "GPU-abc", 0, 4 << 30, 25,
                  [dict(device=1, gpu_uuid="GPU-def", gpu_index=1, mem=2 << 30, compute=50,
                        shm=2 << 20)], shm=1 << 30)
    assert [(d.device, d.shm) for d in h.read_vgpus(dom)] == [(0, 1 << 30), (1, 2 << 20)]
    h.write_slice(dom, "GPU-abc", 0, 4 << 30, 25)  # as a release without regions wrote it
    assert "shm" not in h.conn.lookupByName("hv-s").metadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT, hv.NAMESPACE, 0)
    assert h.read_slice(dom).shm == 0


def test_metadata_with_a_shared_memory_size_hvgpu_never_writes_is_ignored(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-t", devices=""))
    from hvgpu.host.render import slice_metadata_xml

    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                    slice_metadata_xml("GPU-abc", 0, 4 << 30, 25, shm=3 << 20),
                    hv.PREFIX, hv.NAMESPACE, 0)
    assert h.read_vgpus(dom) == []  # 3 MiB is no ivshmem size: not hvgpu's, left alone


def test_a_shared_memory_device_already_there_is_reused_and_one_of_another_size_refused(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-u", devices=SHMEM.format(name="hvgpu-hv-u",
                                                                          mib=4)))
    assert h.shmem_size(dom, "hvgpu-hv-u") == 4 << 20 and h.shmem_size(dom, "other") is None
    assert h.plug_shmem(dom, "hvgpu-hv-u", 4 << 20) == 0  # nothing to add, nothing to undo
    with pytest.raises(hv.ShmemMismatch, match=r"already has the shared-memory device "
                       r"hvgpu-hv-u of 4 MiB, not 8 MiB.*give --shm 4MiB"):
        h.plug_shmem(dom, "hvgpu-hv-u", 8 << 20)


def test_adding_a_shared_memory_device_is_translated_when_the_driver_cannot(h):
    dom = h.conn.defineXML(DOMAIN.format(name="hv-v", devices=""))
    with pytest.raises(NotSupported, match="adding the shared-memory device hvgpu-hv-v .*"
                       "cannot do that"):
        h.plug_shmem(dom, "hvgpu-hv-v", 1 << 20)
    assert h.unplug_shmem(dom, "hvgpu-hv-v") == 0  # none there: nothing to remove
