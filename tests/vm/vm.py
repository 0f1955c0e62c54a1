"""A real Linux guest under QEMU (TCG, no KVM needed) whose AF_VSOCK reaches hvgpu's
agent: the guest's virtio-vsock device is QEMU's vhost-user-vsock, served by rust-vmm's
vhost-device-vsock, which hands a guest connection to (CID 2, port P) to the host as a
connection to the unix socket UDS_P, the hybrid-vsock convention the agent serves
(``hvsock://UDS:5170``); host-to-guest connections go through UDS with ``CONNECT P``.

The guest also gets a region device as libvirt's ``<shmem>`` gives one: QEMU's
``ivshmem-plain`` backed by a file in /dev/shm (:class:`RegionFile`), which the
guest maps from its PCI BAR 2 and the host reads back.

The guest is the cached image of guest_image.sh plus an overlay per boot: hvgpu's
wheel and click's (installed in the guest by pip from them alone, as a user without
network installs it), programs built on the host, and a test script whose output
comes back on the serial console. Each step the script runs prints ``VMOUT <step>
<line>`` for its output and ``VMTEST <step> rc=<n>``; ``VMWANT <what>`` asks the host
to act (attach a slice, restart the agent) while the guest waits.

Must not: touch the host beyond its work directory, the image cache and its one
/dev/shm file (removed when its context ends), or leave a process behind (every
process it starts is stopped when its context ends).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from tests.wheels import guest_dependency_wheels

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VM = "vm1"
GUEST_CID = 3


class Unavailable(Exception):
    """What a real guest needs cannot be had on this machine (said in one line)."""


def image(cache: str | os.PathLike | None = None) -> Path:
    """The cached guest image (guest_image.sh), built on first use."""
    cmd = ["bash", str(HERE / "guest_image.sh")] + ([str(cache)] if cache else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode == 3:
        raise Unavailable(p.stderr.strip().splitlines()[-1])
    if p.returncode != 0:
        raise RuntimeError(f"guest_image.sh failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return Path(p.stdout.strip().splitlines()[-1])


def wheel(out: Path) -> Path:
    """hvgpu's wheel, built from this checkout as a release would be (the shim inside)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--disable-pip-version-check", "-w", str(out),
                    str(REPO)], check=True, timeout=600)
    return Path(sorted(glob.glob(str(out / "hvgpu-*.whl")))[-1])


def dependency_wheels(out: Path) -> list[Path]:
    """The wheels of what hvgpu needs in the guest (click): the guest has no network, so
    they travel in beside hvgpu's and pip finds them there (--find-links /opt/wheels)."""
    return guest_dependency_wheels(out)


def pip_wheel(out: Path) -> Path:
    """A pip the guest can run from its wheel: Debian's, else one from PyPI."""
    found = sorted(glob.glob("/usr/share/python-wheels/pip-*.whl"))
    if found:
        return Path(found[-1])
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(out),
                    "pip"], check=True, timeout=300)
    return Path(sorted(glob.glob(str(out / "pip-*.whl")))[-1])


def programs(out: Path) -> dict[str, Path]:
    """Programs for the guest, built on the host as a user builds them: nvcc's defaults
    (static cudart) where a CUDA toolkit is installed, and a C program linked against
    libcuda.so.1 by name."""
    from bench import toolkit
    from hvgpu.guest.shim import library

    cuda = HERE.parent / "guest" / "cuda"
    out.mkdir(parents=True, exist_ok=True)
    built = {}
    nvcc = toolkit.nvcc()
    if nvcc:
        built["saxpy_static"] = out / "saxpy_static"
        subprocess.run([nvcc, "-arch=sm_90", "-o", str(built["saxpy_static"]),
                        str(cuda / "saxpy.cu")], check=True, capture_output=True, timeout=300)
    built["agent_loss"] = out / "agent_loss"
    subprocess.run(["gcc", "-O2", "-o", str(built["agent_loss"]), str(cuda / "agent_loss.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True, timeout=120)
    return built


def initrd(cache: Path, overlay: Path, out: Path) -> Path:
    """The image's initramfs with the overlay's files on top (concatenated cpio archives:
    the kernel unpacks both, the later one wins)."""
    part = out.with_suffix(".overlay.cpio")
    names = subprocess.run(["find", "."], cwd=overlay, capture_output=True, check=True).stdout
    with open(part, "wb") as f:
        subprocess.run([str(cache / "busybox-bin"), "cpio", "-o", "-H", "newc"], cwd=overlay,
                       input=names, stdout=f, stderr=subprocess.DEVNULL, check=True)
    with open(out, "wb") as f:
        for src in (cache / "base.cpio", part):
            with open(src, "rb") as g:
                shutil.copyfileobj(g, f)
    return out


REGION_SIZE = 64 << 20  # room for a program's staging slots and pinned memory, and the marks


class RegionFile:
    """The VM's region on the host: a /dev/shm file (one per run, removed
    after it) that QEMU maps as an ivshmem-plain device's BAR 2."""

    def __init__(self, size: int = REGION_SIZE):
        self.size = size
        # named as the agent looks for it (names.region_name), in a directory of this run's
        # that the agent is told is its region directory
        self.dir = Path(f"/dev/shm/hvgpu-test-{os.getpid()}")
        self.path = self.dir / f"hvgpu-{VM}"

    def __enter__(self) -> "RegionFile":
        shutil.rmtree(self.dir, ignore_errors=True)  # a killed run's, under this same pid
        self.dir.mkdir(mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, offset: int, data: bytes) -> None:
        with open(self.path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def read(self, offset: int, n: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(n)

    def qemu_args(self) -> list[str]:
        return ["-object", f"memory-backend-file,id=hvgpu-region,size={self.size},"
                           f"mem-path={self.path},share=on",
                "-device", "ivshmem-plain,memdev=hvgpu-region"]


class Host:
    """vhost-device-vsock and the agent (tests/vm/host_agent.py) for one guest."""

    def __init__(self, cache: Path, work: Path, region_dir: Path | None = None):
        self.cache, self.work = cache, work
        self.region_dir = region_dir  # where the agent finds the VM's region file
        self.run = work / "run"
        self.run.mkdir(parents=True, exist_ok=True)
        self.vhost = self.run / "vhost.sock"
        self.uds = self.run / "vm.vsock"
        self.agent_dir = work / "agent"
        self.control = self.agent_dir / "control.sock"
        self.backend: subprocess.Popen | None = None
        self.agent: subprocess.Popen | None = None
        self.agent_starts = 0

    def __enter__(self) -> "Host":
        log = open(self.run / "vhost-device-vsock.log", "ab")
        self.backend = subprocess.Popen(
            [str(self.cache / "vhost-device-vsock"), "--guest-cid", str(GUEST_CID),
             "--socket", str(self.vhost), "--uds-path", str(self.uds)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.start_agent()
            _wait_for(lambda: self.vhost.exists(), 20, "vhost-device-vsock's socket")
        except BaseException:
            self.__exit__(None, None, None)  # nothing left running when the start fails
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop_agent()
        _stop(self.backend)

    def start_agent(self) -> None:
        self.agent_starts += 1
        log = open(self.work / f"agent-{self.agent_starts}.log", "ab")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO), os.environ.get("PYTHONPATH", "")]))
        if self.region_dir is not None:
            env["HVGPU_TEST_REGION_DIR"] = str(self.region_dir)
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "tests.vm.host_agent", str(self.agent_dir), str(self.uds),
             VM], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        listening = Path(f"{self.uds}_5170")
        _wait_for(lambda: listening.exists() and self.control.exists(), 60,
                  f"the agent's listener {listening}", self.agent)

    def stop_agent(self) -> None:
        _stop(self.agent)
        self.agent = None
        for stale in (Path(f"{self.uds}_5170"), self.control):
            stale.unlink(missing_ok=True)

    def hvgpu(self, *args: str) -> subprocess.CompletedProcess:
        """The product's CLI against this agent's control socket."""
        return subprocess.run([sys.executable, "-m", "hvgpu.host.cli", "--control", str(self.control),
                               *args], cwd=REPO, capture_output=True, text=True, timeout=60)

    def tell_guest(self, port: int, line: str, timeout: float = 60) -> None:
        """A host-to-guest vsock connection (hybrid: CONNECT on UDS) carrying one line."""
        deadline = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            try:
                s.connect(str(self.uds))
                s.sendall(f"CONNECT {port}\n".encode())
                ack = s.recv(64)
                if ack.startswith(b"OK"):
                    s.sendall(line.encode() + b"\n")
                    s.recv(64)  # the guest closes after reading
                    return
            except OSError:
                pass
            finally:
                s.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the guest did not take a connection on vsock port {port}")
            time.sleep(0.3)


def qemu_command(cache: Path, initrd_path: Path, host: Host, mem_mb: int = 512,
                 region: RegionFile | None = None) -> list[str]:
    """QEMU under TCG with the guest's console on stdio, its vsock device served by
    the host's vhost-device-vsock (vhost-user needs the guest's RAM shared: memfd), and
    ``region``'s ivshmem-plain device where one is given."""
    return ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-display", "none",
            "-no-reboot", "-accel", "tcg", "-cpu", "max", "-M", "q35,memory-backend=mem",
            "-m", str(mem_mb), "-smp", "2",
            "-object", f"memory-backend-memfd,id=mem,size={mem_mb}M,share=on",
            "-chardev", f"socket,id=vvs,path={host.vhost}",
            "-device", "vhost-user-vsock-pci,chardev=vvs",
            "-kernel", str(cache / "vmlinuz"), "-initrd", str(initrd_path),
            "-append", "console=ttyS0 quiet panic=-1", "-serial", "stdio",
            *(region.qemu_args() if region else [])]


def boot(cache: Path, initrd_path: Path, host: Host, console: Path,
         on_line: Callable[[str], None] = lambda line: None, timeout: float = 600,
         mem_mb: int = 512, region: RegionFile | None = None) -> list[str]:
    """Boots the guest until it powers off; returns its console lines, each also handed
    to on_line as it arrives (the host's actions happen there)."""
    cmd = qemu_command(cache, initrd_path, host, mem_mb, region)
    lines: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    timer = threading.Timer(timeout, lambda: _stop(proc))
    timer.start()
    t0 = time.monotonic()
    try:
        with open(console, "w") as log:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\r\n")
                lines.append(line)
                log.write(f"{time.monotonic() - t0:7.2f} {line}\n")
                log.flush()
                on_line(line)
        proc.wait()
    finally:
        timer.cancel()
        _stop(proc)
    return lines


def results(lines: list[str]) -> dict[str, tuple[int, list[str]]]:
    """step -> (exit status, output lines) from the VMOUT/VMTEST lines of a console."""
    out: dict[str, list[str]] = {}
    done: dict[str, tuple[int, list[str]]] = {}
    for line in lines:
        if line.startswith("VMOUT "):
            step, _, text = line[6:].partition(" ")
            out.setdefault(step, []).append(text)
        elif line.startswith("VMTEST "):
            step, _, rc = line[7:].partition(" rc=")
            done[step] = (int(rc), out.get(step, []))
    return done


def _wait_for(ready: Callable[[], bool], seconds: float, what: str,
              proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: its process ended ({proc.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not appear within {seconds} s")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
