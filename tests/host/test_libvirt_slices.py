"""Slices of libvirt domains, with libvirt's real test:///default driver.

test:///default is one host shared by every connection of this process, so
each test defines domains of its own and removes them.
"""

from __future__ import annotations

import dataclasses

import itertools
import time

import pytest

pytest.importorskip("libvirt")

from hvgpu.errors import ConnectionLost, HvgpuError  # noqa: E402
from hvgpu.guest import Connection  # noqa: E402
from hvgpu.host import hypervisor  # noqa: E402
from tests.conftest import FAKE_DEVICE, RunningAgent  # noqa: E402

hypervisor.start_event_loop()

WITH_VSOCK = """<domain type='test'><name>{name}</name><memory>1048576</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os>
<devices><vsock model='virtio'><cid auto='no' address='{cid}'/></vsock></devices></domain>"""
WITHOUT_VSOCK = """<domain type='test'><name>{name}</name><memory>1048576</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><devices/></domain>"""


_names = itertools.count()
_cids = itertools.count(100)


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",),
                           connect="test:///default")
    running.defined = []
    yield running
    running.stop()
    for dom in running.defined:
        try:
            if dom.is_active():
                dom.destroy()
            dom.undefine()
        except Exception:
            pass


def define(agent, xml, start=True):
    dom = agent.agent.vms.hv.define(xml)
    if start:
        dom.start()
    getattr(agent, "defined", []).append(dom)
    return dom


def vsock_domain(name):
    return WITH_VSOCK.format(name=name, cid=next(_cids))


def wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_attach_by_name_writes_the_slice_into_the_domain(agent):
    dom = define(agent, WITH_VSOCK.format(name="lv-a", cid=7))
    s = agent.api.attach("lv-a", "64M", "25%", allow_time_shared=True)
    assert s["vsock_cid"] == 7 and s["cid"] is None
    xml = dom.xml()  # what virsh dumpxml shows
    assert "urn:x-hvgpu:slice:1" in xml and ">67108864</" in xml
    assert agent.agent.vms.vm_for_cid(7) == "lv-a"
    assert [x["vm"] for x in agent.api.list()] == ["lv-a"]
    agent.api.detach("lv-a")
    assert "urn:x-hvgpu:slice:1" not in dom.xml()


def test_attach_undoes_itself_when_a_step_fails(agent):
    define(agent, WITHOUT_VSOCK.format(name="lv-b"))
    with pytest.raises(HvgpuError, match="cannot do that"):  # the test driver cannot hot-plug
        agent.api.attach("lv-b", "64M")
    assert agent.api.list() == []
    assert agent.agent.vms.hv.domain("lv-b").read_slice() is None


def test_unknown_domain_and_unplug_failure_leave_things_as_they_were(agent):
    with pytest.raises(HvgpuError, match="libvirt has no domain 'ghost'"):
        agent.api.attach("ghost", "64M")
    define(agent, vsock_domain("lv-c"))
    agent.api.attach("lv-c", "64M")
    with pytest.raises(HvgpuError, match="cannot do that"):
        agent.api.detach("lv-c", unplug=True)
    assert [x["vm"] for x in agent.api.list()] == ["lv-c"]  # nothing was lost


def test_stop_releases_the_executor_and_start_restores_it(agent):
    dom = define(agent, vsock_domain("vm1"))  # vm1 also has a socket bound to it
    agent.api.attach("vm1", "64M")
    guest = Connection(agent.vm_address("vm1"))
    guest.call("PING")
    assert agent.api.status()[0]["executors"]
    dom.destroy()
    wait(lambda: not agent.api.status()[0]["executors"])
    with pytest.raises(ConnectionLost):
        for _ in range(100):
            guest.call("PING")
            time.sleep(0.05)
    assert [x["vm"] for x in agent.api.list()] == ["vm1"]  # the reservation stays
    dom.start()
    wait(lambda: agent.api.status()[0]["executors"])
    dom.destroy()
    dom.undefine()
    wait(lambda: agent.api.list() == [])


def test_a_restarted_agent_reconciles_with_the_domains(tmp_path):
    first = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, connect="test:///default")
    first.defined = []
    try:
        keep = define(first, vsock_domain("lv-keep"))
        gone = define(first, vsock_domain("lv-gone"))
        first.api.attach("lv-keep", "32M", "50%", allow_time_shared=True)
        first.api.attach("lv-gone", "16M")
    finally:
        first.stop()
    (tmp_path / "state" / "slices.db").unlink()  # the agent's own state is lost...
    gone.destroy()
    gone.undefine()  # ...and a domain went away while the agent was down
    again = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, connect="test:///default")
    try:
        (s,) = again.api.list()  # restored from the surviving domain's metadata
        assert (s["vm"], s["mem"], s["compute"]) == ("lv-keep", 32 << 20, 50)
    finally:
        again.stop()
        keep.destroy()
        keep.undefine()


def forget(agent, vm):
    """The agent drops the VM's slices (on its loop, where slices change)."""
    agent.agent.call("forget", lambda: agent.agent.apply(agent.agent.slices.detach(vm)))


def reconcile(agent) -> list[str]:
    """Reconcile on the agent's loop as the agent does: apply what the store changed;
    returns what it said."""
    def run():
        reconciled = agent.agent.vms.reconcile(agent.agent.slices)
        agent.agent.apply(*reconciled.changes)
        return reconciled.said
    return agent.agent.call("reconcile", run)


def test_metadata_of_another_size_is_rewritten_and_the_difference_said(agent):
    dom = define(agent, vsock_domain("lv-d"))
    agent.api.attach("lv-d", "64M")
    mine = agent.agent.slices.of_vm("lv-d")
    agent.agent.call("edit", lambda: agent.agent.vms.record(
        [dataclasses.replace(mine[0], mem=32 << 20, compute=0)]))
    assert dom.read_slice().mem == 32 << 20  # someone edited the domain behind our back
    assert reconcile(agent) == [
        "lv-d: slice written into the domain's metadata (vGPU 0's mem: the domain said "
        f"{32 << 20}, the agent has {64 << 20})"]
    assert dom.read_slice().mem == 64 << 20 and agent.api.list()[0]["mem"] == 64 << 20
    assert reconcile(agent) == []  # they agree now


def test_every_vgpu_of_a_domain_is_recorded_and_restored_from_its_metadata(agent):
    dom = define(agent, vsock_domain("lv-v"))
    agent.api.attach("lv-v", "64M", gpu=0, count=2)  # the test double has one GPU: named
    assert '<vgpu device="1">' in dom.xml().replace("hvgpu:", "")
    forget(agent, "lv-v")  # the agent forgets; the domain remembers
    assert reconcile(agent) == [
        "lv-v: slice restored from the domain's metadata (2 vGPUs)"]
    assert [(x["vm"], x["device"]) for x in agent.api.list()] == [("lv-v", 0), ("lv-v", 1)]
    with pytest.raises(HvgpuError, match="detach vGPU 1 of 'lv-v' first"):
        agent.api.detach("lv-v", device=0)
    assert '<vgpu device="1">' in dom.xml().replace("hvgpu:", "")  # refused: untouched
    agent.api.detach("lv-v", device=1)
    assert "vgpu device=" not in dom.xml() and "urn:x-hvgpu:slice:1" in dom.xml()
    agent.api.detach("lv-v")
    assert "urn:x-hvgpu:slice:1" not in dom.xml()


def test_a_failed_attach_of_several_vgpus_leaves_none(agent, monkeypatch):
    define(agent, vsock_domain("lv-w"))

    def broken(vgpus, tx=None):
        raise HvgpuError("metadata write failed")

    monkeypatch.setattr(agent.agent.vms, "record", broken)
    with pytest.raises(HvgpuError, match="metadata write failed"):
        agent.api.attach("lv-w", "64M", gpu=0, count=3)
    assert agent.api.list() == []


@pytest.fixture
def hybrid_agent(tmp_path):
    """An agent whose VM lv-h reaches it through a hybrid-vsock listener bound to it, as
    a domain with a vhost-user vsock (hvgpu domain-xml --vhost-user-vsock) does."""
    uds = tmp_path / "lv-h.vsock"
    running = RunningAgent(tmp_path, FAKE_DEVICE, [f"hvsock://{uds}:5170=lv-h"], slices=True,
                           connect="test:///default")
    running.guest_side = f"unix://{uds}_5170"  # where the backend delivers guest port 5170
    running.defined = []
    yield running
    running.stop()
    for dom in running.defined:
        try:
            if dom.is_active():
                dom.destroy()
            dom.undefine()
        except Exception:
            pass


def test_a_domain_served_by_a_bound_hybrid_listener_gets_metadata_and_no_hot_plug(hybrid_agent):
    agent = hybrid_agent
    # the test driver cannot hot-plug: attach fails if it tries
    dom = define(agent, WITHOUT_VSOCK.format(name="lv-h"))
    s = agent.api.attach("lv-h", "64M", "25%", allow_time_shared=True)
    assert s["hybrid_vsock"].endswith("lv-h.vsock:5170") and "vsock_cid" not in s
    assert "<vsock" not in dom.xml()
    (recorded,) = dom.read_vgpus()
    assert (recorded.mem, recorded.compute) == (64 << 20, 25)
    Connection(agent.guest_side).call("PING")  # the guest is served by its slice
    assert agent.api.status()[0]["executors"]
    with pytest.raises(HvgpuError, match="hybrid-vsock listener .* nothing to unplug"):
        agent.api.detach("lv-h", unplug=True)
    assert dom.read_slice() is not None  # nothing was lost
    agent.api.detach("lv-h")
    assert dom.read_slice() is None and agent.api.list() == []


def test_the_cli_says_no_vsock_device_was_hot_plugged(hybrid_agent):
    from click.testing import CliRunner

    from hvgpu.host.cli import cli

    define(hybrid_agent, WITHOUT_VSOCK.format(name="lv-h"))
    out = CliRunner().invoke(cli, ["--control", hybrid_agent.control, "attach", "lv-h",
                                   "--mem", "32M"])
    assert out.exit_code == 0, out.output
    assert "served by the hybrid-vsock listener hvsock://" in out.output
    assert "(no vsock device hot-plugged)" in out.output


def test_a_hybrid_bound_domain_attached_by_its_uuid_gets_no_hot_plug_either(hybrid_agent):
    dom = define(hybrid_agent, WITHOUT_VSOCK.format(name="lv-h"))
    s = hybrid_agent.api.attach(dom.uuid, "32M")
    assert s["vm"] == "lv-h" and "hybrid_vsock" in s
    assert "<vsock" not in dom.xml()


WITH_VSOCK_AND_SHMEM = """<domain type='test'><name>{name}</name><memory>1048576</memory>
<vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os>
<devices><vsock model='virtio'><cid auto='no' address='{cid}'/></vsock>
<shmem name='hvgpu-{name}'><model type='ivshmem-plain'/><size unit='M'>{mib}</size></shmem>
</devices></domain>"""


def shmem_domain(name, mib=4):
    return WITH_VSOCK_AND_SHMEM.format(name=name, cid=next(_cids), mib=mib)


def test_a_region_device_that_cannot_be_added_undoes_the_attach(agent):
    dom = define(agent, vsock_domain("lv-s1"))
    with pytest.raises(HvgpuError, match="adding the region device hvgpu-lv-s1 to "
                       "lv-s1: this libvirt driver cannot do that"):
        agent.api.attach("lv-s1", "64M", region="4M")
    assert agent.api.list() == []
    assert dom.read_slice() is None  # no metadata was left either


def test_the_region_is_recorded_listed_and_kept_while_the_domain_runs(agent):
    from click.testing import CliRunner

    from hvgpu.host.cli import cli

    dom = define(agent, shmem_domain("lv-s2"))  # its device is there: nothing to hot-plug
    out = CliRunner().invoke(cli, ["--control", agent.control, "attach", "lv-s2", "--mem",
                                   "64M", "--region", "4M"])
    assert out.exit_code == 0, out.output
    assert "region 4 MiB" in out.output
    (recorded,) = dom.read_vgpus()
    assert recorded.region == 4 << 20
    assert '<region unit="bytes">4194304</region>' in dom.xml().replace("hvgpu:", "")
    assert agent.api.list()[0]["region"] == 4 << 20 and agent.api.status()[0]["region"] == 4 << 20
    out = CliRunner().invoke(cli, ["--control", agent.control, "list"])
    assert "REGION" in out.output and "4 MiB" in out.output
    with pytest.raises(HvgpuError) as info:  # ivshmem cannot be resized live
        agent.api.resize("lv-s2", region="8M")
    assert info.value.code == "shm-live"
    assert "while lv-s2 runs" in str(info.value) and "virsh shutdown lv-s2" in str(info.value)
    assert "detach the slice and attach it again" in str(info.value)
    assert agent.api.list()[0]["region"] == 4 << 20
    assert dom.read_slice().region == 4 << 20
    assert agent.api.resize("lv-s2", mem="32M", region="4M")["mem"] == 32 << 20  # unchanged: ok
    with pytest.raises(HvgpuError, match="removing the region device hvgpu-lv-s2 from "
                       "lv-s2: this libvirt driver cannot do that"):
        agent.api.detach("lv-s2")  # the test driver cannot remove a device
    assert agent.api.list()[0]["region"] == 4 << 20  # refused first: nothing was lost
    assert dom.read_slice().region == 4 << 20


def test_the_region_is_restored_from_the_domains_metadata(agent):
    dom = define(agent, shmem_domain("lv-s3", mib=2))
    agent.api.attach("lv-s3", "64M", region="2M")
    forget(agent, "lv-s3")  # the agent forgets; the domain remembers
    reconcile(agent)
    assert [(x["vm"], x["region"]) for x in agent.api.list()] == [("lv-s3", 2 << 20)]
    assert dom.read_slice().region == 2 << 20


def test_a_device_of_another_size_is_refused_before_anything_changes(agent):
    dom = define(agent, shmem_domain("lv-s4", mib=2))
    with pytest.raises(HvgpuError, match="already has the region device hvgpu-lv-s4 "
                       "of 2 MiB, not 4 MiB"):
        agent.api.attach("lv-s4", "64M", region="4M")
    assert agent.api.list() == [] and dom.read_slice() is None


def test_a_name_too_long_for_the_region_file_is_refused_before_anything_changes(agent):
    name = "lv-" + "x" * 247  # 250 bytes: a domain name, but not after 'hvgpu-'
    dom = define(agent, vsock_domain(name))
    with pytest.raises(HvgpuError, match="too long for a region.*at most 249"):
        agent.api.attach(name, "64M", region="1M")
    assert agent.api.list() == [] and dom.read_slice() is None
    assert agent.api.attach(name, "64M")["vm"] == name  # without a region it is fine


def test_every_verb_takes_a_name_or_a_uuid_and_list_shows_the_cid_attach_printed(agent):
    from click.testing import CliRunner

    from hvgpu.host.cli import cli

    dom = define(agent, WITH_VSOCK.format(name="lv-uuid", cid=61))
    uuid = dom.uuid
    s = agent.api.attach(uuid, "64M")
    assert s["vm"] == "lv-uuid" and s["vsock_cid"] == 61
    assert agent.api.resize(uuid, mem="32M")["mem"] == 32 << 20  # resize took only names
    (listed,) = agent.api.list()
    assert listed["vm"] == "lv-uuid" and listed["vsock_cid"] == 61 and listed["cid"] is None
    out = CliRunner().invoke(cli, ["--control", agent.control, "list"]).output
    row = next(line.split() for line in out.splitlines() if line.startswith("lv-uuid"))
    assert row[-1] == "61", out  # the CID column showed "-"
    assert agent.api.status()[0]["vsock_cid"] == 61
    assert agent.api.detach(uuid)["vm"] == "lv-uuid"  # detach took only names
    assert agent.api.list() == []
    with pytest.raises(HvgpuError, match="no libvirt domain has the UUID"):
        agent.api.detach("00000000-0000-0000-0000-00000000beef")


def test_a_cid_libvirt_gave_a_running_domain_is_refused_to_another_vm(agent):
    define(agent, WITH_VSOCK.format(name="lv-owner", cid=62))
    with pytest.raises(HvgpuError, match="CID 62 is libvirt domain 'lv-owner'"):
        agent.api.attach("fc-vm", "16M", cid=62)
    assert agent.api.list() == []
    agent.api.attach("fc-vm", "16M", cid=63)
    # a domain whose CID a VM attached by --cid has is refused the other way round
    dom = define(agent, WITH_VSOCK.format(name="lv-clash", cid=63))
    with pytest.raises(HvgpuError, match="'lv-clash' has vsock CID 63, which 'fc-vm'"):
        agent.api.attach("lv-clash", "16M")
    assert [s["vm"] for s in agent.api.list()] == ["fc-vm"]
    assert dom.read_slice() is None


def test_connect_naming_the_agents_own_libvirt_is_taken(agent):
    from hvgpu.host.control_api import OtherLibvirt

    define(agent, vsock_domain("lv-uri"))
    agent.api.attach("lv-uri", "16M", connect="test:///default")
    assert [s["vm"] for s in agent.api.list(connect="test:///default")] == ["lv-uri"]
    with pytest.raises(OtherLibvirt, match="manages VMs through test:///default, not "
                                           "qemu:///system"):
        agent.api.list(connect="qemu:///system")


def test_a_domain_is_named_by_its_name_or_its_uuid(agent):
    dom = define(agent, WITH_VSOCK.format(name="lv-n", cid=9))
    vms = agent.agent.vms
    assert vms.canonical(dom.uuid) == vms.canonical("lv-n") == "lv-n"
    assert vms.vsock_cid(dom.uuid) == 9
    with pytest.raises(hypervisor.NoSuchVm):
        vms.canonical("00000000-0000-0000-0000-000000000000")


def _clear_behind_the_agents_back(name):
    """Remove hvgpu's metadata from a domain through a connection of the test's own:
    a change no lifecycle event tells the agent about."""
    import libvirt

    conn = libvirt.open("test:///default")
    try:
        conn.lookupByName(name).setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None,
                                            hypervisor.NAMESPACE, 0)
    finally:
        conn.close()


def test_reconnecting_reconciles_and_says_what_changed(agent, caplog):
    dom = define(agent, vsock_domain("lv-r"))
    agent.api.attach("lv-r", "64M", "25%", allow_time_shared=True)
    _clear_behind_the_agents_back("lv-r")
    assert dom.read_slice() is None
    caplog.set_level("INFO", logger="hvgpu")
    assert agent.agent.call("reconnect", lambda: agent.agent.vms.reconnect(
        agent.agent.slices)).said == [
        "lv-r: slice written into the domain's metadata"]
    assert (dom.read_slice().mem, dom.read_slice().compute) == (64 << 20, 25)
    assert "reconciled with libvirt after reconnecting: lv-r: slice written" in caplog.text
    agent.api.detach("lv-r")  # the new connection serves the control API
    assert dom.read_slice() is None and agent.api.list() == []


def test_the_agent_reconnects_when_libvirt_reports_the_connection_lost(agent, caplog):
    # The test driver's connection is never lost: libvirt's close callback is called as
    # libvirt calls it (tests/host/test_libvirtd.py loses a real connection).
    dom = define(agent, vsock_domain("vm1"))  # vm1 also has a socket bound to it
    agent.api.attach("vm1", "64M")
    Connection(agent.vm_address("vm1")).call("PING")
    assert agent.api.status()[0]["executors"]
    _clear_behind_the_agents_back("vm1")
    caplog.set_level("INFO", logger="hvgpu")
    hv = agent.agent.vms.hv
    before = hv._conn
    hv._closed(before, 1, None)  # VIR_CONNECT_CLOSE_REASON_EOF
    wait(lambda: "reconciled with libvirt after reconnecting: vm1: slice written into the "
         "domain's metadata" in caplog.text, timeout=30)
    assert hv._conn is not before and dom.read_slice().mem == 64 << 20
    assert "the connection to libvirt at test:///default is lost: libvirtd closed the " \
        "connection; connecting again" in caplog.text
    dom.destroy()  # lifecycle events come through the new connection
    wait(lambda: not agent.api.status()[0]["executors"])
    agent.api.detach("vm1")
    assert dom.read_slice() is None and agent.api.list() == []
