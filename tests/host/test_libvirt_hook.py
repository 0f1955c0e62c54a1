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


def test_help_says_what_libvirt_calls_it_with_and_what_it_does(capsys):
    assert main(["--help"], io.StringIO("")) == 0  # stdin unread: no domain XML comes
    out = capsys.readouterr().out
    assert out.startswith("usage: hvgpu-libvirt-hook DOMAIN OPERATION SUB-OPERATION EXTRA")
    assert "/etc/libvirt/hooks/qemu" in out and "migrate" in out and NAMESPACE in out
    assert main(["-h"]) == 0 and capsys.readouterr().out == out


def test_the_installed_command_answers_help_without_libvirt():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    # the console script beside this interpreter, as a person runs it
    exe = Path(sys.executable).parent / "hvgpu-libvirt-hook"
    command = [str(exe)] if exe.exists() else [shutil.which("hvgpu-libvirt-hook")]
    out = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and "usage: hvgpu-libvirt-hook" in out.stdout, out


def test_without_arguments_it_shows_usage_and_fails(capsys):
    assert main([]) == 2
    assert "usage: hvgpu-libvirt-hook" in capsys.readouterr().err
