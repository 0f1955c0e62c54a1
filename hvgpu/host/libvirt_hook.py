"""``hvgpu-libvirt-hook``: libvirt's qemu hook that refuses migrating a VM with a slice.

Install it on every host that could receive a migration:

    ln -s "$(command -v hvgpu-libvirt-hook)" /etc/libvirt/hooks/qemu   # then restart libvirtd

libvirt runs ``qemu <domain> migrate begin -`` on the destination with the
domain's XML on stdin; a non-zero exit makes libvirt refuse the migration
and report what the hook printed. A slice belongs to one host's GPU, so a
domain carrying hvgpu's metadata is refused. Every other call is let through.
``--help`` prints what it is called with and what it does (without arguments,
on stderr, with status 2).
This runs inside libvirtd: it must never call back into libvirt (that
deadlocks), and it uses the standard library only.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

NAMESPACE = "urn:x-hvgpu:slice:1"  # hvgpu.host.render.NAMESPACE, kept import-free here

USAGE = """\
usage: hvgpu-libvirt-hook DOMAIN OPERATION SUB-OPERATION EXTRA  < DOMAIN-XML
       hvgpu-libvirt-hook --help

libvirt's qemu hook for hosts that run hvgpu: it refuses to migrate a VM that
has a GPU slice, because a slice belongs to one host's GPU (detach it first).

libvirtd runs it, as /etc/libvirt/hooks/qemu, with the domain's name, the
operation and its sub-operation (for example `vm1 migrate begin -`) and the
domain's XML on stdin. For `migrate`, a domain whose XML carries hvgpu's slice
metadata (%s) is refused: it exits 1 and libvirt reports its message.
Every other call exits 0 at once. It never calls back into libvirt.

Install it on every host a VM could migrate to, then restart libvirtd:

    ln -s "$(command -v hvgpu-libvirt-hook)" /etc/libvirt/hooks/qemu
""" % NAMESPACE


def has_slice(domain_xml: str) -> bool:
    try:
        root = ET.fromstring(domain_xml)
    except ET.ParseError:
        return False
    metadata = root.find("metadata")
    return metadata is not None and any(
        child.tag.startswith("{" + NAMESPACE + "}") for child in metadata)


def main(argv=None, stdin=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # libvirt always passes four arguments: one alone, or none, is a person asking
    if argv in (["--help"], ["-h"]):
        sys.stdout.write(USAGE)
        return 0
    if len(argv) < 2:
        sys.stderr.write(USAGE)
        return 2
    if argv[1] != "migrate":
        return 0
    xml = (stdin or sys.stdin).read()
    if has_slice(xml):
        sys.stderr.write(f"hvgpu: domain {argv[0]} has a GPU slice on its source host; "
                         "migrating it is not supported: hvgpu detach it there first\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
