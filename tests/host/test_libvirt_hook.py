"""The qemu hook refuses migrating a domain that carries a slice."""

import io

from hvgpu.host import render
from hvgpu.host.libvirt_hook import NAMESPACE, main


def domain_with(metadata: str) -> str:
    return f"<domain type='kvm'><name>vm1</name><metadata>{metadata}</metadata></domain>"


def test_namespace_matches_what_the_agent_writes():
    assert NAMESPACE == render.NAMESPACE


def test_migration_of_a_domain_with_a_slice_is_refused(capsys):
    xml = domain_with(render.slice_metadata_xml("GPU-x", 0, 1 << 30, 0))
    assert main(["vm1", "migrate", "begin", "-"], io.StringIO(xml)) == 1
    assert "migrating it is not supported" in capsys.readouterr().err


def test_everything_else_passes():
    plain = domain_with("<other xmlns='urn:x-other'/>")
    assert main(["vm1", "migrate", "begin", "-"], io.StringIO(plain)) == 0
    sliced = domain_with(render.slice_metadata_xml("GPU-x", 0, 1 << 30, 0))
    assert main(["vm1", "start", "begin", "-"], io.StringIO(sliced)) == 0
    assert main(["vm1", "migrate", "begin", "-"], io.StringIO("not xml")) == 0
