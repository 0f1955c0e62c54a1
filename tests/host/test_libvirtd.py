"""The vsock hot-plug path against a real libvirtd with QEMU (software emulation).

.ci/run installs and starts libvirtd; elsewhere these tests skip unless
qemu:///system answers. The domains boot nothing (no disk): QEMU under TCG
sits in its firmware, which is all a device hot-plug needs.
"""

from __future__ import annotations

import itertools
import os
import shutil

import pytest

libvirt = pytest.importorskip("libvirt")

from hvgpu.host import hypervisor  # noqa: E402
from tests.conftest import FAKE_DEVICE, RunningAgent  # noqa: E402

hypervisor.start_event_loop()

URI = "qemu:///system"
EMULATOR = shutil.which("qemu-system-x86_64")
DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os>
<devices><emulator>{emulator}</emulator></devices></domain>"""
_names = itertools.count()


def _libvirtd() -> bool:
    if EMULATOR is None:
        return False
    try:
        libvirt.registerErrorHandler(lambda *_: None, None)
        libvirt.open(URI).close()
    except libvirt.libvirtError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _libvirtd(), reason="no libvirtd with QEMU at qemu:///system")


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, connect=URI)
    doms = []

    def define(start: bool):
        dom = running.agent.vms.hv.conn.defineXML(
            DOMAIN.format(name=f"hvgpu-ci-{os.getpid()}-{next(_names)}", emulator=EMULATOR))
        doms.append(dom)
        if start:
            dom.create()
        return dom

    running.define = define
    yield running
    running.stop()
    for dom in doms:
        try:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        except libvirt.libvirtError:
            pass


def inactive_xml(dom) -> str:
    return dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)


def test_attach_adds_vsock_and_metadata_to_a_shut_off_domain_and_detach_removes_both(agent):
    dom = agent.define(start=False)
    s = agent.api.attach(dom.name(), "64M", "25%")
    assert s["vsock_cid"] is None  # an automatic CID is assigned when the domain starts
    xml = inactive_xml(dom)  # virsh dumpxml --inactive
    assert "<vsock model='virtio'>" in xml and "<cid auto='yes'/>" in xml
    assert "urn:x-hvgpu:slice:1" in xml
    assert agent.api.list()[0]["vm"] == dom.name()
    agent.api.detach(dom.name(), unplug=True)
    xml = inactive_xml(dom)
    assert "<vsock" not in xml and "urn:x-hvgpu:slice:1" not in xml
    assert agent.api.list() == []


@pytest.mark.skipif(os.path.exists("/dev/vhost-vsock"), reason="this host has vhost-vsock")
def test_live_hot_plug_without_vhost_vsock_says_what_to_load_and_leaves_nothing(agent):
    dom = agent.define(start=True)
    with pytest.raises(hypervisor.NoVhostVsock, match="load the vhost_vsock kernel module"):
        agent.api.attach(dom.name(), "64M")
    assert agent.api.list() == []
    assert "<vsock" not in dom.XMLDesc(0) and "<vsock" not in inactive_xml(dom)
    assert agent.agent.vms.hv.read_slice(dom) is None


def test_libvirt_accepts_the_rendered_domain(agent):
    from hvgpu.host.render import domain_xml

    xml = domain_xml(f"hvgpu-ci-{os.getpid()}-rendered", 1 << 30, 1, "/nonexistent/disk.qcow2",
                     domain_type="qemu", cpu_mode="host-model")
    dom = agent.agent.vms.hv.conn.defineXML(xml)  # what `virsh define` does
    try:
        assert "<vsock model='virtio'>" in inactive_xml(dom)
    finally:
        dom.undefine()


def test_libvirt_accepts_the_rendered_domain_with_a_vhost_user_vsock(agent):
    from hvgpu.host.render import domain_xml

    xml = domain_xml(f"hvgpu-ci-{os.getpid()}-vhost-user", 1 << 30, 1, "/nonexistent/disk.qcow2",
                     domain_type="qemu", cpu_mode="host-model",
                     vhost_user_vsock="/run/hvgpu/vm-vhost.sock")
    dom = agent.agent.vms.hv.conn.defineXML(xml)
    try:
        kept = inactive_xml(dom)
        assert "vhost-user-vsock-pci,chardev=hvgpu-vsock" in kept  # not dropped by libvirt
        assert "<access mode='shared'/>" in kept and "<vsock" not in kept
    finally:
        dom.undefine()
