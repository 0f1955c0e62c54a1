"""``hvgpu-libvirt-hook``: libvirt's qemu hook that refuses migrating a VM with a slice.

Install it on every host that could receive a migration:

    ln -s "$(command -v hvgpu-libvirt-hook)" /etc/libvirt/hooks/qemu   # then restart libvirtd

libvirt runs ``qemu <domain> migrate begin -`` on the destination with the
domain's XML on stdin; a non-zero exit makes libvirt refuse the migration
and report what the hook printed. A slice belongs to one host's GPU, so a
domain carrying hvgpu's metadata is refused. Every other call is let through.
This runs inside libvirtd: it must never call back into libvirt (that
deadlocks), and it uses the standard library only.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

NAMESPACE = "urn:x-hvgpu:slice:1"  # hvgpu.host.render.NAMESPACE, kept import-free here


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
    if len(argv) < 2 or argv[1] != "migrate":
        return 0
    xml = (stdin or sys.stdin).read()
    if has_slice(xml):
        sys.stderr.write(f"hvgpu: domain {argv[0]} has a GPU slice on its source host; "
                         "migrating it is not supported: hvgpu detach it there first\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
