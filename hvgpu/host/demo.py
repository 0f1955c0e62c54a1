"""``hvgpu demo``: attach a slice to a VM, run checked CUDA work through it, detach.

Uses only public pieces (a private ``Agent``, ``ControlAPI``, the guest API)
so it shows the path an operator and a VM's program take; the guest side runs
in this process over a unix socket bound to the VM (vsock needs a real VM).
Without a GPU or a libvirt daemon it uses stand-ins and says so; a domain the
operator named (``--vm``) that cannot be reached is never stood in for silently:
the libvirt steps are said to be skipped, and the demo fails. Must not reach
into executor internals, and must say plainly what it could not do.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hvgpu.errors import HvgpuError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.host.agent import Agent, AgentConfig, default_cache_dir
from hvgpu.units import format_size

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

MATMUL = r"""
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float acc = 0.f;
        for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
        C[row * n + col] = acc;
    }
}
"""


def run_saxpy(conn: Connection, n: int) -> float:
    """y = a*x + y on the GPU; returns the relative error against numpy."""
    dev = Device(connection=conn)
    kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    rng = np.random.default_rng()
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    dx, dy = dev.allocate(x.nbytes), dev.allocate(y.nbytes)
    dx.copy_from(x)
    dy.copy_from(y)
    launch(kernel, LaunchConfig(grid=(n + 255) // 256, block=256), np.float32(3.0), dx, dy, n)
    out = np.empty_like(y)
    dy.copy_to(out)
    ref = 3.0 * x.astype(np.float64) + y
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def run_matmul(conn: Connection, n: int = 256) -> float:
    dev = Device(connection=conn)
    kernel = Program(MATMUL, connection=conn).compile().get_kernel("matmul")
    rng = np.random.default_rng()
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    da, db, dc = (dev.allocate(a.nbytes) for _ in range(3))
    da.copy_from(a)
    db.copy_from(b)
    launch(kernel, LaunchConfig(grid=((n + 15) // 16, (n + 15) // 16), block=(16, 16)),
           da, db, dc, n)
    c = np.empty_like(a)
    dc.copy_to(c)
    ref = a.astype(np.float64) @ b
    return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))


DEMO_VM = "hvgpu-demo"
TEST_DOMAIN = """<domain type='test'>
  <name>{name}</name>
  <memory unit='KiB'>1048576</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
{vsock}  </devices>
</domain>"""


def run_demo(size: int, echo=print, device: str | None = None, env: dict | None = None,
             vm: str | None = None, connect: str = "qemu:///system", gpus=None) -> int:
    """attach -> metadata -> CUDA through the slice -> detach, saying what could not run.

    Without ``vm``, libvirt's built-in test:///default host stands in for the
    hypervisor (a domain is defined there); with ``vm``, that domain of
    ``connect`` gets the slice (and a vsock device if it has none).
    """
    logging.basicConfig(level=logging.WARNING)
    gpus_fn, gpu_note = _choose_gpus(gpus)
    uri, libvirt_note, name = _choose_libvirt(vm, connect)
    # The demo's own domain runs before the agent watches libvirt (see _start_own_domain).
    own = _start_own_domain(uri, name) if vm is None and uri is not None else None
    try:
        with tempfile.TemporaryDirectory(prefix="hvgpu-demo-") as tmp:
            guest_socket = f"unix://{Path(tmp) / 'guest.sock'}"
            agent = Agent(AgentConfig(listen=[f"{guest_socket}={name}"], vsock_port=None,
                                      cache_dir=default_cache_dir(),
                                      state_dir=str(Path(tmp) / "state"), mps=False,
                                      device=device, log_level="WARNING", env=env or {},
                                      connect=uri), gpus=gpus_fn)
            agent.start()
            thread = threading.Thread(target=agent.serve_forever, daemon=True)
            thread.start()
            try:
                return _run(agent, gpus_fn, name, guest_socket, size, echo, gpu_note,
                            libvirt_note, define=vm is None, uri=connect)
            finally:
                agent.stop()
                thread.join(timeout=10)
    finally:
        if own is not None:
            _remove_own_domain(own, name)


def _start_own_domain(uri: str, name: str, wait: float = 10.0):
    """Define and start the demo's domain on ``uri`` (libvirt's test host) and wait
    until libvirt has delivered its start, before the agent watches libvirt.

    libvirt delivers lifecycle events later, on its own thread. An agent that heard
    of this start only after the demo's attach would take it for a VM booting with
    a slice and start that slice's executor at once; on a host without a GPU that
    executor fails ("no GPU", an ERROR line after the demo's result). Returns the
    connection, kept open until the end: the test host's domains live while one is.
    """
    from hvgpu.host.hypervisor import EventKind, Hypervisor
    from hvgpu.host.render import vsock_xml

    started = threading.Event()
    hv = Hypervisor(uri)
    hv.watch(lambda event: started.set() if (event.vm, event.kind) == (
        name, EventKind.STARTED) else None)
    xml = TEST_DOMAIN.format(name=name, vsock="".join(
        "    " + line + "\n" for line in vsock_xml(cid=3).splitlines()))
    try:
        hv.define(xml).start()
    except BaseException:
        hv.close()
        raise
    if not started.wait(wait):  # only the order of what the agent logs depends on it
        logging.getLogger(__name__).warning("libvirt did not report %s started within "
                                            "%.0f s; going on", name, wait)
    return hv


def _remove_own_domain(hv, name: str) -> None:
    try:
        dom = hv.domain(name)
        dom.destroy()
        dom.undefine()
    except HvgpuError as exc:
        logging.getLogger(__name__).warning("the demo's domain %s was not removed: %s",
                                            name, exc)
    finally:
        hv.close()


def _choose_gpus(gpus):
    from hvgpu.host.inventory import Gpu, NoDriver, read_gpus

    if gpus is not None:
        return gpus, ""
    try:
        found = read_gpus()
        if found:
            return read_gpus, ""
        reason = "NVML lists no GPU"
    except NoDriver as exc:
        reason = str(exc)
    placeholder = Gpu(0, "GPU-00000000-0000-0000-0000-000000000000", "no GPU (demo placeholder)",
                      1 << 30, 0, None, False, False, "no GPU")
    return (lambda: [placeholder]), reason


def _choose_libvirt(vm, connect):
    """(the URI the agent uses or None, why none, the VM's name). A domain named by
    name or UUID is looked up first, so one that does not exist stops the demo
    (NoSuchVm) before anything is attached."""
    try:
        from hvgpu.host.hypervisor import Hypervisor, start_event_loop
    except ImportError:
        return None, "libvirt-python is not installed", vm or DEMO_VM
    if vm is not None:
        try:
            hv = Hypervisor(connect)
        except HvgpuError as exc:
            return None, str(exc), vm
        try:
            return connect, "", hv.domain(vm).name
        finally:
            hv.close()
    start_event_loop()
    try:
        Hypervisor("test:///default").close()
    except HvgpuError as exc:
        return None, str(exc), DEMO_VM
    return "test:///default", "", DEMO_VM


def _run(agent, gpus_fn, name, guest_socket, size, echo, gpu_note, libvirt_note, define,
         uri=None) -> int:
    from hvgpu.host.control_api import ControlAPI

    api = agent.commands(ControlAPI(agent, gpus_fn), who="hvgpu demo")
    ok = True
    gpu = gpus_fn()[0]
    echo(f"gpu:       {gpu.name} (GPU {gpu.index})" if not gpu_note else
         f"gpu:       none usable here ({gpu_note}); the slice goes on a placeholder so the "
         "slice and libvirt steps can be shown, and no CUDA will run")
    skipped = None  # why the libvirt steps did not run, when they did not
    if agent.vms is None:
        skipped = libvirt_note or agent.libvirt_reason
        if not define:  # the operator named a domain: it is not stood in for quietly
            echo(f"libvirt:   NOT reachable at {uri} ({skipped}); domain {name} was not "
                 "looked up: the slice is bound to a local socket instead, and the libvirt "
                 "steps are skipped")
        else:
            echo(f"libvirt:   not available ({skipped}); the slice is bound to a local "
                 "socket instead of a domain")
    elif define:
        echo("libvirt:   test:///default, libvirt's built-in test host (hvgpu demo --vm NAME "
             "uses one of your domains instead)")
        echo(f"domain:    {name} defined and started there, with a vsock device")
    else:
        echo(f"libvirt:   {agent.vms.hv.uri}, domain {name}")
    mem = "256M" if gpu_note else "1G"
    s = api.attach(name, mem, None)
    cid = s.get("vsock_cid")
    echo(f"attach:    {name}: {format_size(s['mem'])} on GPU {s['gpu_index']}, compute "
         "time-shared"
         + (f", vsock CID {cid}" if cid is not None else ""))
    if agent.vms is not None:
        meta = [line.strip() for line in agent.vms.hv.domain(name).xml().splitlines()
                if "slice" in line or "memory unit=\"bytes\"" in line]
        echo("metadata:  " + " ".join(meta[:3]) + " ...  (what virsh dumpxml shows)")
    else:
        echo(f"metadata:  SKIPPED: no slice was written into a domain, because libvirt is "
             f"not available ({skipped})")
    if gpu_note:
        echo("cuda:      NOT run: this host has no usable NVIDIA GPU")
    else:
        t0 = time.perf_counter()
        with Connection(guest_socket) as conn:
            dev = Device(connection=conn)
            echo(f"guest:     connected as {conn.peer} to the slice of {name}; its device has "
                 f"{format_size(dev.total_memory)} (the quota)")
            err = run_saxpy(conn, size)
            merr = run_matmul(conn)
        echo(f"saxpy:     n={size}, relative error vs numpy {err:.1e}  "
             f"{'OK' if err < 1e-6 else 'WRONG'}")
        echo(f"matmul:    256x256, relative error vs numpy {merr:.1e}  "
             f"{'OK' if merr < 1e-5 else 'WRONG'}  ({time.perf_counter() - t0:.2f}s)")
        ok = err < 1e-6 and merr < 1e-5
    api.detach(name)
    gone = agent.vms is None or agent.vms.hv.domain(name).read_slice() is None
    echo(f"detach:    {name}: slice released" + (", metadata removed" if agent.vms else "")
         + ("" if gone else " (METADATA LEFT BEHIND)"))
    ran = ("the agent, the slice manager, libvirt metadata and the control API ran"
           if skipped is None else "the agent, the slice manager and the control API ran; "
           "the libvirt steps did NOT run (libvirt is not available)")
    if gpu_note:
        echo(f"result:    {ran}; CUDA did NOT run, because this host has no usable NVIDIA "
             "GPU and driver.")
    elif skipped is not None:
        echo(f"result:    {ran}.")
    unreached = skipped is not None and not define
    if unreached:
        echo(f"result:    FAILED: libvirt at {uri} is not reachable, so domain {name} was not "
             "used")
    return 0 if ok and gone and not unreached else 1
