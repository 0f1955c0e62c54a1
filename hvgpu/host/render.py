"""Render the jinja2 templates in ``templates/`` (installed as hvgpu.templates).

Templates carry no policy: callers pass finished values, and a missing value
is an error (StrictUndefined). XML is autoescaped. Must not decide anything.
"""

from __future__ import annotations

import jinja2

from hvgpu.templates_dir import templates_dir

NAMESPACE = "urn:x-hvgpu:slice:1"  # the private XML namespace of slice metadata
PREFIX = "hvgpu"
# The PCI slot on q35's root bus of a vhost-user-vsock device given through
# <qemu:commandline>: libvirt does not know the device, so it must be kept off the
# slots libvirt hands out itself (root ports from slot 1 up, 0x1b/0x1d/0x1e/0x1f for
# sound, USB, the DMI bridge and the chipset). The root bus has no hot-plug, so
# libvirt never adds anything there later.
VHOST_USER_VSOCK_SLOT = "0x10"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=jinja2.select_autoescape(["xml.j2"],
                                                                  default_for_string=False))


_env = None


def render(template: str, **values) -> str:
    global _env
    if _env is None:
        _env = _environment()
    return _env.get_template(template).render(**values)


def vsock_xml(cid: int | None = None) -> str:
    return render("libvirt/vsock.xml.j2", cid=cid)


def shmem_xml(name: str, size_mib: int) -> str:
    """An ivshmem-plain device: a region of ``size_mib`` MiB that QEMU backs with the file
    /dev/shm/``name`` and the guest maps from the device's BAR 2."""
    return render("libvirt/shmem.xml.j2", shmem_name=name, shmem_mib=size_mib)


def slice_metadata_xml(gpu_uuid: str, gpu_index: int, mem: int, compute: int,
                       more: list[dict] = (), region: int = 0) -> str:
    """A VM's vGPU 0 at the top (what the first release wrote and reads), the others in
    ``more`` (dicts: device, gpu_uuid, gpu_index, mem, compute, and region if any) as <vgpu>
    elements. A region size (``region``, bytes) is written only when there is a
    region, so a slice without one reads as before."""
    return render("libvirt/slice-metadata.xml.j2", namespace=NAMESPACE, gpu_uuid=gpu_uuid,
                  gpu_index=gpu_index, mem=mem, compute=compute, region=region,
                  more=[{"region": 0, **v} for v in more])


def domain_xml(name: str, memory: int, vcpus: int, disk: str, *, disk_format: str = "qcow2",
               cloud_init: str | None = None, network: str = "default",
               domain_type: str = "kvm", cpu_mode: str = "host-passthrough",
               vhost_user_vsock: str | None = None, shmem: tuple[str, int] | None = None
               ) -> str:
    """With ``vhost_user_vsock`` (a vhost-user backend's socket, such as
    vhost-device-vsock's), the guest's vsock is QEMU's vhost-user-vsock device on that
    socket instead of libvirt's <vsock> (which needs the host's vhost_vsock module);
    its RAM is then shared memory, which a vhost-user backend needs. With ``shmem``
    (name, MiB), the domain has that ivshmem-plain device (see shmem_xml)."""
    return render("libvirt/domain.xml.j2", name=name, memory_kib=memory // 1024, vcpus=vcpus,
                  disk=disk, disk_format=disk_format, cloud_init=cloud_init, network=network,
                  domain_type=domain_type, cpu_mode=cpu_mode,
                  # QEMU's option syntax: a comma in a value is written twice
                  vhost_user_vsock=vhost_user_vsock and vhost_user_vsock.replace(",", ",,"),
                  vhost_user_vsock_slot=VHOST_USER_VSOCK_SLOT,
                  shmem_name=shmem[0] if shmem else None, shmem_mib=shmem[1] if shmem else None)


def systemd_quote(arg: str) -> str:
    """One argument of an Exec*= line as systemd reads it: quoted where it has to be,
    and "%" and "$" doubled (systemd would expand specifiers and variables)."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and not any(c in text for c in " \t\"'\\;"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def agent_unit(hvgpu: str, args: list[str] = (), agent_args: list[str] = (),
               read_write: list[str] = ()) -> str:
    """The agent's hardened unit running ``hvgpu ARGS agent AGENT_ARGS``; ``read_write``:
    directories beyond /var/lib/hvgpu, /run/hvgpu and /var/cache/hvgpu that it writes."""
    exec_start = " ".join(systemd_quote(a) for a in [hvgpu, *args, "agent", *agent_args])
    return render("systemd/hvgpu-agent.service.j2", exec_start=exec_start,
                  read_write=[p.replace("%", "%%") for p in read_write])


def guest_unit(hvgpu_guest: str) -> str:
    return render("systemd/hvgpu-guest-check.service.j2", hvgpu_guest=hvgpu_guest)
