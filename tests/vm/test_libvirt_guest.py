"""A libvirt domain whose guest reaches hvgpu over real AF_VSOCK on a host without the
vhost_vsock module: the domain is what ``hvgpu domain-xml --vhost-user-vsock`` renders
(shared memfd RAM, QEMU's vhost-user-vsock device through <qemu:commandline>, served by
vhost-device-vsock), defined and started by libvirtd (qemu:///system, QEMU under TCG).
The agent is bound to it by a hybrid-vsock listener and talks to libvirtd; the slice is
attached with the product's CLI by the domain's name. Checked: no vsock device is
hot-plugged, the slice is in the domain's metadata after attach and gone after detach,
and the guest runs ``hvgpu-guest info``/``smi`` on its slice and is refused after detach
(read back from its serial console).

One boot. Skipped, in one line, where libvirtd with QEMU does not answer at
qemu:///system or where the guest cannot be had (vm.Unavailable). The domain is always
destroyed and undefined."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.vm import vm

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

libvirt = pytest.importorskip("libvirt", reason="no libvirt-python here")

from hvgpu.host import hypervisor  # noqa: E402
from hvgpu.host.render import NAMESPACE, domain_xml  # noqa: E402
from tests.conftest import FAKE_DEVICE, RunningAgent  # noqa: E402

hypervisor.start_event_loop()  # before any connection is opened (libvirt's rule)

URI = "qemu:///system"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", QEMU_NS)


def _libvirtd():
    """An open connection to libvirtd with QEMU, or skip in one line."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("no qemu-system-x86_64 here")
    libvirt.registerErrorHandler(lambda *_: None, None)
    try:
        return libvirt.open(URI)
    except libvirt.libvirtError as exc:
        pytest.skip(f"no libvirtd with QEMU at {URI}: {exc.get_error_message()}")


def _qemu_owner(conn) -> tuple[int, int]:
    """The uid:gid libvirt runs QEMU as (its DAC label): QEMU connects to the vhost-user
    socket as that user, and libvirt does not label a socket it only sees in
    <qemu:commandline>."""
    caps = ET.fromstring(conn.getCapabilities())
    for model in caps.findall("./host/secmodel"):
        if model.findtext("model") == "dac":
            label = model.find("baselabel[@type='qemu']")
            label = label if label is not None else model.find("baselabel")
            if label is not None:
                uid, gid = label.text.split(":")
                return int(uid.lstrip("+")), int(gid.lstrip("+"))
    return 0, 0


def _domain(name: str, kernel: Path, initrd: Path, host: vm.Host, console: Path) -> str:
    """hvgpu's domain for a vhost-user vsock, with what this machine lacks replaced: a
    direct kernel boot instead of the disk, no network, the serial console in a file."""
    root = ET.fromstring(domain_xml(name, 512 << 20, 2, "/nonexistent.qcow2",
                                    domain_type="qemu", cpu_mode="host-model",
                                    vhost_user_vsock=str(host.vhost)))
    os_ = root.find("os")
    os_.remove(os_.find("boot"))
    for tag, text in (("kernel", str(kernel)), ("initrd", str(initrd)),
                      ("cmdline", "console=ttyS0 quiet panic=-1")):
        ET.SubElement(os_, tag).text = text
    root.find("on_reboot").text = "destroy"  # a guest that panics stops, not loops
    devices = root.find("devices")
    for tag in ("disk", "interface", "console"):
        for node in devices.findall(tag):
            devices.remove(node)
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=str(console))
    ET.SubElement(serial, "target", port="0")
    return ET.tostring(root, encoding="unicode")


class LibvirtHost(vm.Host):
    """vhost-device-vsock as in vm.Host; the agent in this process, talking to libvirtd,
    with the hybrid-vsock listener bound to the domain."""

    def __init__(self, cache: Path, work: Path, domain: str):
        super().__init__(cache, work)
        self.domain = domain
        self.running: RunningAgent | None = None

    def start_agent(self) -> None:
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.running = RunningAgent(self.agent_dir, FAKE_DEVICE,
                                        [f"hvsock://{self.uds}:5170={self.domain}"],
                                        slices=True, connect=URI)
            assert self.running.agent.vms is not None, self.running.agent.libvirt_reason
        except BaseException:
            self.stop_agent()
            vm._stop(self.backend)  # __exit__ does not run when __enter__ fails
            raise

    def stop_agent(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None


def _run_domain(dom, console: Path, on_line, timeout: float = 600) -> list[str]:
    """Starts the domain and hands each console line to on_line until the guest powers
    off (the domain stops) or the time is up."""
    lines: list[str] = []
    dom.create()
    deadline = time.monotonic() + timeout
    pos, partial = 0, b""
    while True:
        active = dom.isActive()
        if console.exists():
            with open(console, "rb") as f:
                f.seek(pos)
                data = f.read()
            pos += len(data)
            *done, partial = (partial + data).split(b"\n")
            for raw in done:
                line = raw.decode(errors="replace").rstrip("\r")
                lines.append(line)
                on_line(line)
        if not active or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


@pytest.fixture(scope="module")
def libvirt_run(tmp_path_factory):
    conn = _libvirtd()
    try:
        cache = vm.image(os.environ.get("HVGPU_VM_CACHE"))
    except vm.Unavailable as exc:
        conn.close()
        pytest.skip(f"no real guest here: {exc}")
    name = f"hvgpu-vm-{os.getpid()}"
    # libvirt's QEMU runs as another user: its files must be reachable from "/", which
    # pytest's 0700 directories are not
    work = Path(tempfile.mkdtemp(prefix="hvgpu-libvirt-", dir="/tmp"))
    try:
        yield from _boot(conn, cache, name, work, tmp_path_factory.mktemp("libvirt-vm"))
    finally:
        conn.close()
        shutil.rmtree(work, ignore_errors=True)


def _boot(conn, cache: Path, name: str, work: Path, build: Path):
    os.chmod(work, 0o711)
    overlay = build / "overlay"
    (overlay / "opt/wheels").mkdir(parents=True)
    shutil.copy(vm.wheel(build / "dist"), overlay / "opt/wheels")
    shutil.copy(vm.pip_wheel(build / "dist"), overlay / "opt/wheels/pip.whl")
    for dependency in vm.dependency_wheels(build / "deps"):
        shutil.copy(dependency, overlay / "opt/wheels")
    shutil.copy(vm.HERE / "guest_libvirt.sh", overlay / "guest-test.sh")
    os.chmod(overlay / "guest-test.sh", 0o755)
    initrd = vm.initrd(cache, overlay, work / "initrd.cpio")
    # libvirt's QEMU user reads the kernel too: the image cache may sit in a home it
    # cannot enter (/root/.cache in CI).
    kernel = work / "vmlinuz"
    shutil.copy(cache / "vmlinuz", kernel)
    os.chmod(kernel, 0o644)
    os.chmod(initrd, 0o644)
    console = work / "console.log"
    run = {"actions": {}, "name": name}
    dom = None
    try:
        with LibvirtHost(cache, work, name) as host:
            dom = conn.defineXML(_domain(name, kernel, initrd, host, console))
            run["defined"] = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            # vhost-device-vsock makes its socket anew for each QEMU that leaves
            os.chown(host.vhost, *_qemu_owner(conn))

            def on_line(line: str) -> None:
                if line == "VMWANT attach":
                    done = host.hvgpu("attach", name, "--mem", "256M")
                    run["actions"]["attach"] = (done.returncode, done.stdout + done.stderr)
                    run["after_attach"] = (dom.XMLDesc(0),
                                           dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
                elif line == "VMWANT detach":
                    done = host.hvgpu("detach", name)
                    run["actions"]["detach"] = (done.returncode, done.stdout + done.stderr)
                    run["after_detach"] = (dom.XMLDesc(0),
                                           dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
                    # on its own thread: the guest's listener starts while this waits
                    threading.Thread(target=host.tell_guest, args=(1236, "detached"),
                                     daemon=True).start()

            run["lines"] = _run_domain(dom, console, on_line)
    finally:
        if dom is not None:
            try:
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
            except libvirt.libvirtError:
                pass
    run["steps"] = vm.results(run["lines"])
    yield run


def _step(run, name: str) -> tuple[int, str]:
    if name not in run["steps"]:
        tail = "\n".join(run["lines"][-40:])
        pytest.fail(f"the guest never reported step {name!r}; its console ended:\n{tail}")
    rc, out = run["steps"][name]
    return rc, "\n".join(out)


def _metadata(xml: str) -> ET.Element | None:
    return ET.fromstring(xml).find(f"./metadata/{{{NAMESPACE}}}slice")


def test_libvirtd_starts_the_rendered_domain_and_the_wheel_installs(libvirt_run):
    defined = libvirt_run["defined"]
    assert "vhost-user-vsock-pci,chardev=hvgpu-vsock" in defined and "<vsock" not in defined
    rc, out = _step(libvirt_run, "install")
    assert rc == 0, out


def test_attach_by_domain_name_writes_metadata_and_hot_plugs_nothing(libvirt_run):
    rc, out = libvirt_run["actions"]["attach"]
    assert rc == 0, out
    assert f"attached {libvirt_run['name']}: 256" in out, out
    assert "served by the hybrid-vsock listener" in out, out
    assert "(no vsock device hot-plugged)" in out, out
    for xml in libvirt_run["after_attach"]:  # live, and the persistent config
        assert "<vsock" not in xml
        meta = _metadata(xml)
        assert meta is not None, xml
        assert meta.findtext(f"{{{NAMESPACE}}}memory") == str(256 << 20)


def test_the_guest_uses_its_slice_over_real_vsock(libvirt_run):
    rc, out = _step(libvirt_run, "info")
    assert rc == 0, out
    assert "hvgpu fake GPU" in out and "vsock://2:5170" in out, out
    rc, out = _step(libvirt_run, "smi")
    assert rc == 0 and "256" in out, out


def test_detach_removes_the_metadata_and_the_guest_is_refused(libvirt_run):
    rc, out = libvirt_run["actions"]["detach"]
    assert rc == 0, out
    for xml in libvirt_run["after_detach"]:
        assert _metadata(xml) is None, xml
    rc, out = _step(libvirt_run, "detached_said")
    assert rc == 0 and "detached" in out, out
    rc, out = _step(libvirt_run, "detached")
    assert rc != 0 and "HVGPU_ERROR_NO_SLICE" in out, out
    assert _step(libvirt_run, "done")[0] == 0
