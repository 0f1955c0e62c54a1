"""Generated XML against golden files; every rendered domain passes virt-xml-validate.

Set HVGPU_UPDATE_GOLDEN=1 to rewrite the golden files after a deliberate change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hvgpu.host import render

GOLDEN = Path(__file__).parent / "golden"
VALIDATE = shutil.which("virt-xml-validate")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("HVGPU_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def validate(tmp_path, xml: str, schema: str = "domain") -> None:
    if VALIDATE is None:
        pytest.skip("virt-xml-validate is not installed (libvirt-clients)")
    f = tmp_path / "doc.xml"
    f.write_text(xml)
    out = subprocess.run([VALIDATE, str(f), schema], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout


def test_vsock_device():
    check_golden("vsock-auto.xml", render.vsock_xml())
    check_golden("vsock-fixed.xml", render.vsock_xml(cid=42))


def test_slice_metadata():
    check_golden("slice-metadata.xml", render.slice_metadata_xml("GPU-e711190c", 0, 4 << 30, 25))


def test_region_device():
    check_golden("shmem.xml", render.shmem_xml("hvgpu-vm4", 1024))
    assert "name='hvgpu-a&#39;b&lt;'" in render.shmem_xml("hvgpu-a'b<", 1)


def test_slice_metadata_with_region_and_without_it_as_before():
    check_golden("slice-metadata-region.xml", render.slice_metadata_xml(
        "GPU-e711190c", 0, 4 << 30, 25,
        [dict(device=1, gpu_uuid="GPU-5d1e3b7a", gpu_index=1, mem=2 << 30, compute=50,
              region=1 << 30),
         dict(device=2, gpu_uuid="GPU-5d1e3b7a", gpu_index=1, mem=2 << 30, compute=0)],
        region=1 << 30))
    # a slice without a region is written exactly as before the region existed
    assert render.slice_metadata_xml("GPU-e711190c", 0, 4 << 30, 25, region=0) == \
        (GOLDEN / "slice-metadata.xml").read_text()


def test_slice_metadata_of_a_vm_with_two_vgpus():
    check_golden("slice-metadata-2.xml", render.slice_metadata_xml(
        "GPU-e711190c", 0, 4 << 30, 25,
        [dict(device=1, gpu_uuid="GPU-5d1e3b7a", gpu_index=1, mem=2 << 30, compute=50)]))


def test_domain_for_a_gpu_sharing_guest(tmp_path):
    xml = render.domain_xml("vm1", 8 << 30, 4, "/var/lib/libvirt/images/vm1.qcow2",
                            cloud_init="/var/lib/libvirt/images/vm1-seed.iso")
    check_golden("domain-vm1.xml", xml)
    validate(tmp_path, xml)


def test_domain_without_cloud_init_and_with_the_slice_metadata_validates(tmp_path):
    xml = render.domain_xml("vm2", 2 << 30, 1, "/images/vm2.raw", disk_format="raw",
                            domain_type="qemu", cpu_mode="host-model")
    check_golden("domain-vm2.xml", xml)
    meta = render.slice_metadata_xml("GPU-x", 1, 1 << 30, 0).replace(
        "<slice xmlns=", "<hvgpu:slice xmlns:hvgpu=").replace("</slice>", "</hvgpu:slice>")
    meta = meta.replace("<gpu ", "<hvgpu:gpu ").replace("<memory ", "<hvgpu:memory ").replace(
        "</memory>", "</hvgpu:memory>").replace("<compute ", "<hvgpu:compute ").replace(
        "</compute>", "</hvgpu:compute>")
    validate(tmp_path, xml.replace("  <vcpu", f"  <metadata>\n{meta}  </metadata>\n  <vcpu", 1))


def test_domain_whose_vsock_is_served_by_a_vhost_user_backend(tmp_path):
    xml = render.domain_xml("vm3", 4 << 30, 2, "/var/lib/libvirt/images/vm3.qcow2",
                            vhost_user_vsock="/run/hvgpu/vm3-vhost.sock")
    check_golden("domain-vm3-vhost-user-vsock.xml", xml)
    validate(tmp_path, xml)
    assert "<vsock" not in xml  # one vsock transport per guest: the vhost-user one


def test_domain_with_a_region_device(tmp_path):
    xml = render.domain_xml("vm4", 8 << 30, 4, "/var/lib/libvirt/images/vm4.qcow2",
                            shmem=("hvgpu-vm4", 1024))
    check_golden("domain-vm4-region.xml", xml)
    validate(tmp_path, xml)
    xml = render.domain_xml("vm3", 4 << 30, 2, "/var/lib/libvirt/images/vm3.qcow2",
                            vhost_user_vsock="/run/hvgpu/vm3-vhost.sock",
                            shmem=("hvgpu-vm3", 64))
    validate(tmp_path, xml)  # with a vhost-user vsock as well
    assert "<shmem name='hvgpu-vm3'>" in xml and "<vsock" not in xml


def test_a_comma_in_the_vhost_user_socket_path_is_escaped_for_qemu():
    xml = render.domain_xml("vm3", 1 << 30, 1, "/x", vhost_user_vsock="/run/a,b.sock")
    assert "path=/run/a,,b.sock'" in xml


def test_values_are_escaped_and_missing_values_are_errors():
    xml = render.domain_xml("a<b>&'c", 1 << 30, 1, "/x")
    assert "<name>a&lt;b&gt;&amp;&#39;c</name>" in xml
    with pytest.raises(Exception, match="undefined"):
        render.render("libvirt/domain.xml.j2", name="x")


ANALYZE = shutil.which("systemd-analyze")


def verify_unit(tmp_path, name: str, text: str) -> None:
    """``systemd-analyze verify``: every line is one systemd knows, with a value it takes.
    The executables it names must exist, so they are pointed at /bin/true."""
    if ANALYZE is None:
        pytest.skip("systemd-analyze is not installed (systemd)")
    unit = tmp_path / name
    unit.write_text(text.replace("/usr/local/bin/hvgpu-guest", "/bin/true")
                    .replace("/usr/local/bin/hvgpu", "/bin/true"))
    out = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True,
                         text=True, env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    # Only what concerns this unit: the host's other units may have their own complaints.
    mine = [line for line in (out.stderr + out.stdout).splitlines() if name in line]
    assert out.returncode == 0 and not mine, out.stderr + out.stdout


def test_systemd_units(tmp_path):
    agent = render.agent_unit("/usr/local/bin/hvgpu")
    check_golden("hvgpu-agent.service", agent)
    verify_unit(tmp_path, "hvgpu-agent.service", agent)
    guest = render.guest_unit("/usr/local/bin/hvgpu-guest")
    check_golden("hvgpu-guest-check.service", guest)
    verify_unit(tmp_path, "hvgpu-guest-check.service", guest)


def test_the_agent_unit_is_hardened():
    unit = render.agent_unit("/usr/local/bin/hvgpu")
    lines = {line.split("=", 1)[0]: line.split("=", 1)[1]
             for line in unit.splitlines() if "=" in line and not line.startswith("#")}
    assert lines["Type"] == "notify"
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("NoNewPrivileges", "yes"),
                       ("DevicePolicy", "closed"), ("StateDirectory", "hvgpu"),
                       ("RuntimeDirectory", "hvgpu"), ("CacheDirectory", "hvgpu")):
        assert lines[key] == value, key
    caps = set(lines["CapabilityBoundingSet"].split())
    # what starting executors as another user needs, and nothing that rules the host
    assert {"CAP_SETUID", "CAP_SETGID", "CAP_KILL"} <= caps
    assert not caps & {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_PTRACE"}
    # every capability granted says why, in the unit itself
    for cap in caps:
        assert f"#  {cap}" in unit or f" {cap} " in unit.split("CapabilityBoundingSet")[0], cap
    # executors' own confinement: Landlock, or a mount namespace in a user namespace
    assert set(lines["RestrictNamespaces"].split()) == {"user", "mnt"}
    assert "MemoryDenyWriteExecute" not in lines and "RestrictSUIDSGID" not in lines


def test_the_agent_unit_quotes_its_command_line_for_systemd():
    unit = render.agent_unit("/opt/hvgpu bin/hvgpu", ["--connect", "qemu+ssh://h/system"],
                             ["--config", "/etc/50%.toml", "--state-dir", "/srv/hvgpu"],
                             ["/srv/hvgpu"])
    assert ('ExecStart="/opt/hvgpu bin/hvgpu" --connect qemu+ssh://h/system agent '
            "--config /etc/50%%.toml --state-dir /srv/hvgpu\n") in unit
    assert "ReadWritePaths=/srv/hvgpu\n" in unit
