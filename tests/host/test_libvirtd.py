"""The vsock and region device hot-plug paths against a real libvirtd with QEMU
(software emulation).

.ci/run installs and starts libvirtd; elsewhere these tests skip unless
qemu:///system answers. The domains boot nothing (no disk): QEMU under TCG
sits in its firmware, which is all a device hot-plug needs. The agent's reconnect
is tested by having libvirtd drop this process's connections (virt-admin), as a
restart would: stopping libvirtd itself would stop it for whatever else uses it.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import time

import pytest

libvirt = pytest.importorskip("libvirt")

from hvgpu.host import hypervisor  # noqa: E402
from hvgpu.host.names import VgpuKey, region_path  # noqa: E402
from hvgpu.errors import HvgpuError  # noqa: E402
from tests.conftest import FAKE_DEVICE, RunningAgent  # noqa: E402

hypervisor.start_event_loop()

URI = "qemu:///system"
EMULATOR = shutil.which("qemu-system-x86_64")
DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os>
<devices><emulator>{emulator}</emulator>{devices}</devices></domain>"""
# A conventional PCI slot for an ivshmem device hot-plugged later (a pcie-to-pci-bridge on a
# root port): libvirt adds one to a config that gets such a device, never to a running domain.
PCI_BRIDGE = """<controller type='pci' index='0' model='pcie-root'/>
<controller type='pci' index='1' model='pcie-root-port'/>
<controller type='pci' index='2' model='pcie-to-pci-bridge'/>"""
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

    def define(start: bool, devices: str = ""):
        name = f"hvgpu-ci-{os.getpid()}-{next(_names)}"
        dom = running.agent.vms.hv.define(DOMAIN.format(
            name=name, emulator=EMULATOR, devices=devices.format(name=name)))
        doms.append(dom)
        if start:
            dom.start()
        return dom

    running.define = define
    yield running
    running.stop()
    for dom in doms:
        try:
            if dom.is_active():
                dom.destroy()
            dom.undefine()
        except HvgpuError:
            pass


def inactive_xml(dom) -> str:
    return dom.xml(inactive=True)


def test_attach_adds_vsock_and_metadata_to_a_shut_off_domain_and_detach_removes_both(agent):
    dom = agent.define(start=False)
    s = agent.api.attach(dom.name, "64M", "25%", allow_time_shared=True)
    assert s["vsock_cid"] is None  # an automatic CID is assigned when the domain starts
    xml = inactive_xml(dom)  # virsh dumpxml --inactive
    assert "<vsock model='virtio'>" in xml and "<cid auto='yes'/>" in xml
    assert "urn:x-hvgpu:slice:1" in xml
    assert agent.api.list()[0]["vm"] == dom.name
    agent.api.detach(dom.name, unplug=True)
    xml = inactive_xml(dom)
    assert "<vsock" not in xml and "urn:x-hvgpu:slice:1" not in xml
    assert agent.api.list() == []


@pytest.mark.skipif(os.path.exists("/dev/vhost-vsock"), reason="this host has vhost-vsock")
def test_live_hot_plug_without_vhost_vsock_says_what_to_load_and_leaves_nothing(agent):
    dom = agent.define(start=True)
    with pytest.raises(hypervisor.NoVhostVsock, match="load the vhost_vsock kernel module"):
        agent.api.attach(dom.name, "64M")
    assert agent.api.list() == []
    assert "<vsock" not in dom.xml() and "<vsock" not in inactive_xml(dom)
    assert dom.read_slice() is None


def test_libvirt_accepts_the_rendered_domain(agent):
    from hvgpu.host.render import domain_xml

    xml = domain_xml(f"hvgpu-ci-{os.getpid()}-rendered", 1 << 30, 1, "/nonexistent/disk.qcow2",
                     domain_type="qemu", cpu_mode="host-model")
    dom = agent.agent.vms.hv.define(xml)  # what `virsh define` does
    try:
        assert "<vsock model='virtio'>" in inactive_xml(dom)
    finally:
        dom.undefine()


def test_libvirt_accepts_the_rendered_domain_with_a_vhost_user_vsock(agent):
    from hvgpu.host.render import domain_xml

    xml = domain_xml(f"hvgpu-ci-{os.getpid()}-vhost-user", 1 << 30, 1, "/nonexistent/disk.qcow2",
                     domain_type="qemu", cpu_mode="host-model",
                     vhost_user_vsock="/run/hvgpu/vm-vhost.sock")
    dom = agent.agent.vms.hv.define(xml)
    try:
        kept = inactive_xml(dom)
        assert "vhost-user-vsock-pci,chardev=hvgpu-vsock" in kept  # not dropped by libvirt
        assert "<access mode='shared'/>" in kept and "<vsock" not in kept
    finally:
        dom.undefine()


def shmem_of(xml: str) -> list:
    import xml.etree.ElementTree as ET

    return [(n.get("name"), n.find("model").get("type"), n.find("size").get("unit"),
             n.findtext("size")) for n in ET.fromstring(xml).findall("./devices/shmem")]


def test_attach_region_puts_shmem_in_a_shut_off_domains_config_and_detach_removes_it(agent):
    dom = agent.define(start=False)
    name = dom.name
    s = agent.api.attach(name, "64M", region="4M")
    assert s["region"] == 4 << 20
    xml = inactive_xml(dom)
    assert shmem_of(xml) == [(f"hvgpu-{name}", "ivshmem-plain", "M", "4")]
    assert "<vsock model='virtio'>" in xml  # beside the vsock device
    assert dom.read_slice().region == 4 << 20  # and in the metadata
    assert agent.api.resize(name, region="8M")["region"] == 8 << 20  # shut off: its config changes
    assert shmem_of(inactive_xml(dom)) == [(f"hvgpu-{name}", "ivshmem-plain", "M", "8")]
    assert dom.read_slice().region == 8 << 20
    agent.api.detach(name, unplug=True)
    xml = inactive_xml(dom)
    assert shmem_of(xml) == [] and "<vsock" not in xml and "urn:x-hvgpu:slice:1" not in xml
    assert not os.path.exists(region_path(VgpuKey(name)))  # QEMU never ran: no file


def test_a_device_that_cannot_be_added_takes_back_the_vsock_device_added_before_it(agent):
    dom = agent.define(start=False, devices="<shmem name='hvgpu-{name}'><model "
                       "type='ivshmem-plain'/><size unit='M'>2</size></shmem>")
    with pytest.raises(hypervisor.ShmemMismatch, match="of 2 MiB, not 4 MiB"):
        agent.api.attach(dom.name, "64M", region="4M")
    xml = inactive_xml(dom)
    assert "<vsock" not in xml  # hot-plugged into the config first, then undone
    assert "urn:x-hvgpu:slice:1" not in xml and agent.api.list() == []
    assert shmem_of(xml)[0][3] == "2"  # the device that was there is left as it was


@pytest.fixture
def hybrid(tmp_path):
    """An agent with a domain bound to a hybrid-vsock listener of its (as a domain with a
    vhost-user vsock has): attach hot-plugs no vsock device into it, which this host could
    not have (no vhost_vsock), so a running domain takes the region device path alone."""
    name = f"hvgpu-ci-{os.getpid()}-{next(_names)}"
    running = RunningAgent(tmp_path, FAKE_DEVICE, [f"hvsock://{tmp_path}/h.vsock:5170={name}"],
                           slices=True, connect=URI)
    doms = []

    def define(devices: str):
        dom = running.agent.vms.hv.define(
            DOMAIN.format(name=name, emulator=EMULATOR, devices=devices))
        doms.append(dom)
        dom.start()
        return dom

    running.define = define
    running.name = name
    yield running
    running.stop()
    for dom in doms:
        try:
            if dom.is_active():
                dom.destroy()
            dom.undefine()
        except HvgpuError:
            pass
    for device in range(2):
        try:
            os.unlink(region_path(VgpuKey(name, device)))
        except FileNotFoundError:
            pass


def test_live_hot_plug_of_the_region_into_a_running_hybrid_bound_domain(hybrid):
    dom = hybrid.define(PCI_BRIDGE)
    name, path = hybrid.name, region_path(VgpuKey(hybrid.name))
    with open(path, "wb") as stale:  # left by an earlier run: QEMU would refuse to grow it
        stale.truncate(1 << 20)
    s = hybrid.api.attach(name, "64M", region="4M")
    assert "hybrid_vsock" in s and "<vsock" not in dom.xml()
    assert shmem_of(dom.xml()) == [(f"hvgpu-{name}", "ivshmem-plain", "M", "4")]
    assert shmem_of(inactive_xml(dom)) == [(f"hvgpu-{name}", "ivshmem-plain", "M", "4")]
    st = os.stat(path)  # QEMU made it anew, at the region's size
    assert st.st_size == 4 << 20 and st.st_uid != 0
    with pytest.raises(HvgpuError, match="an ivshmem device cannot be resized live"):
        hybrid.api.resize(name, region="8M")
    assert shmem_of(dom.xml())[0][3] == "4" and hybrid.api.list()[0]["region"] == 4 << 20
    # A guest releases an unplugged device itself; this one has no OS to do it, so libvirt
    # waits its 5 s and leaves the device live until then: the config and the file go now.
    hybrid.api.detach(name)
    assert shmem_of(inactive_xml(dom)) == [] and hybrid.api.list() == []
    assert not os.path.exists(path)  # the host RAM is freed once QEMU lets go of it


def test_live_hot_plug_without_a_free_pci_slot_is_explained_and_leaves_nothing(hybrid):
    dom = hybrid.define("")  # q35 as libvirt completes it: no conventional PCI slot free
    with pytest.raises(hypervisor.ShmemHotPlugFailed) as info:
        hybrid.api.attach(hybrid.name, "64M", region="4M")
    text = str(info.value)
    assert f"hot-plugging the region device hvgpu-{hybrid.name} into the running " \
           f"domain {hybrid.name} failed" in text and "libvirt error" in text
    assert "pcie-to-pci-bridge" in text and f"virsh shutdown {hybrid.name}" in text
    assert hybrid.api.list() == [] and dom.read_slice() is None
    assert shmem_of(dom.xml()) == [] and shmem_of(inactive_xml(dom)) == []
    assert not os.path.exists(region_path(VgpuKey(hybrid.name)))


def test_libvirt_accepts_the_rendered_domain_with_a_region_device(agent):
    from hvgpu.host.render import domain_xml

    name = f"hvgpu-ci-{os.getpid()}-region"
    xml = domain_xml(name, 1 << 30, 1, "/nonexistent/disk.qcow2", domain_type="qemu",
                     cpu_mode="host-model", shmem=(f"hvgpu-{name}", 64))
    dom = agent.agent.vms.hv.define(xml)
    try:
        kept = inactive_xml(dom)
        assert shmem_of(kept) == [(f"hvgpu-{name}", "ivshmem-plain", "M", "64")]
        assert "model='pcie-to-pci-bridge'" in kept  # libvirt gave it a slot of its kind
    finally:
        dom.undefine()


def test_a_region_file_owned_by_qemus_user_is_served_and_one_of_another_user_is_not(agent):
    """QEMU (as libvirt's user) makes a VM's region file; a file another local user made
    first is refused, whatever its size."""
    import pwd

    from hvgpu.errors import CudaError
    from hvgpu.host.regions import open_region

    qemu = agent.agent.vms.hv.qemu_uid()
    assert qemu == pwd.getpwnam("libvirt-qemu").pw_uid
    owners = agent.agent._region_owners()
    assert owners == {qemu}
    region_dir = agent.tmp / "region"
    region_dir.mkdir()
    path = region_dir / "hvgpu-vm1"
    path.write_bytes(b"\0" * (1 << 20))
    slice_ = type("S", (), {"region": 1 << 20})()
    os.chown(path, qemu, 0)
    fd, _ = open_region(str(region_dir), VgpuKey("vm1", 0), slice_, owners)
    os.close(fd)
    os.chown(path, 65534, 65534)
    with pytest.raises(CudaError, match="another local user"):
        open_region(str(region_dir), VgpuKey("vm1", 0), slice_, owners)


def _drop_this_process_connections() -> int:
    """Have libvirtd close every connection of this process (virt-admin
    client-disconnect), as a restart of libvirtd closes them, while it keeps serving
    everyone else; returns how many it closed."""
    admin = ["virt-admin", "-c", "libvirtd:///system"]
    listing = subprocess.run(admin + ["srv-clients-list", "libvirtd"], capture_output=True,
                             text=True, check=True).stdout.splitlines()[2:]
    dropped = 0
    for client in [line.split()[0] for line in listing if line.strip()]:
        info = subprocess.run(admin + ["client-info", "libvirtd", client],
                              capture_output=True, text=True).stdout
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        if fields.get("unix_process_id", "").strip() == str(os.getpid()):
            subprocess.run(admin + ["client-disconnect", "libvirtd", client],
                           capture_output=True, check=True)
            dropped += 1
    return dropped


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.mark.skipif(shutil.which("virt-admin") is None, reason="no virt-admin (libvirt-clients)")
def test_the_agent_reconnects_when_libvirtd_drops_its_connection_and_reconciles(agent, caplog):
    dom = agent.define(start=False)
    agent.api.attach(dom.name, "64M", "25%", allow_time_shared=True)
    own = libvirt.open(URI)  # metadata removed behind the agent's back: no event says so
    own.lookupByName(dom.name).setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None,
                                           hypervisor.NAMESPACE,
                                           libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    own.close()
    assert dom.read_slice() is None
    caplog.set_level(logging.INFO, logger="hvgpu")
    assert _drop_this_process_connections() >= 1
    _wait(lambda: f"reconciled with libvirt after reconnecting: {dom.name}: slice written "
          "into the domain's metadata" in caplog.text)
    assert f"the connection to libvirt at {URI} is lost: libvirtd closed the connection; " \
        "connecting again" in caplog.text
    assert (dom.read_slice().mem, dom.read_slice().compute) == (64 << 20, 25)
    agent.api.detach(dom.name, unplug=True)  # the agent works through the new connection
    assert "<vsock" not in inactive_xml(dom) and agent.api.list() == []
