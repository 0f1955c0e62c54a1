"""Entry point of an executor process: ``python -m hvgpu.host.executor``.

Two modes, both started by the agent, never by hand:

* ``--fd N``: one guest connection with the whole GPU (host-local listeners
  not bound to a VM); exits when that guest disconnects.
* ``--control-fd N --vm VM --vgpu D``: all connections of one VM's vGPU D, handed over
  the control channel; one CUDA context (one MPS client, whose limits the
  agent put in the environment), one thread per guest connection, memory
  reserved in the agent's ledger. Exits when the agent closes the channel, or
  when told to retire and its last connection has closed.

Every CUDA resource a guest held goes with its session, or with the process.
The process's sessions share one pinned staging pool (its size bounds what
copies pin, however many guests copy) and one heartbeat thread (progress
frames for guests waiting on long work).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import sys
import threading

from hvgpu.errors import CudaError
from hvgpu.host import logs
from hvgpu.host.executor import messages, regions
from hvgpu.host.executor import sandbox
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.ipc import Exports
from hvgpu.host.executor.kernel_output import KernelOutput
from hvgpu.host.executor.agent_link import AgentLink, RemoteQuota, Stats
from hvgpu.host.executor.progress import Heartbeat
from hvgpu.host.executor.session import DEVICE_MEMORY, Session
from hvgpu.host.executor.staging import StagingPool
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import adopt, adopt_control

_FAULT_GRACE = 1.0  # seconds a faulted MPS client's guests have to read their error
DEFAULT_DEVICE = "hvgpu.host.executor.cuda_device:CudaDevice"
log = logging.getLogger("hvgpu.executor")


def load_factory(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def open_device(spec: str, gpu: int, vgpu: int = 0):
    """The GPU; vGPU N >= 1 of a VM gets its own address window (cuda_device)."""
    try:
        factory = load_factory(spec)
        return (factory(gpu, address_window=vgpu) if vgpu else factory(gpu)), None
    except CudaError as exc:
        log.error("no GPU: %s", exc)
        return None, exc
    except Exception as exc:  # keep answering the guests, with the reason
        log.exception("device setup failed")
        return None, CudaError(P.HV_INTERNAL, f"executor could not open GPU {gpu}: {exc!r}")


def share_device_memory_lock(device, directory: str) -> None:
    """Measure module loads and instantiations under the lock every executor on this
    GPU shares (named by the GPU's UUID, whichever index this process sees it at)."""
    try:
        h = bytes(device.uuid()).hex()  # as NVML and nvidia-smi print it
        gpu = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if len(h) >= 32 else h
    except Exception as exc:  # no UUID: this executor's own lock, as without a directory
        log.warning("the GPU's UUID cannot be read (%s): device memory is measured under "
                    "this executor's lock only", exc)
        return
    DEVICE_MEMORY.attach(directory, gpu)


def watch_lifeline(fd: int) -> None:
    """End this process once the agent is gone: only the agent holds the pipe's write
    end, so EOF here means it exited or was killed (even with SIGKILL)."""
    def wait() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        log.warning("the agent is gone: ending")
        os._exit(0)

    threading.Thread(target=wait, name="lifeline", daemon=True).start()


def serve_slice(link: AgentLink, device, error, cache: CompileCache, name: str,
                compute: int = 0, region: int = 0, vgpu: int = 0,
                output: KernelOutput | None = None) -> None:
    quota = RemoteQuota(link)
    executor_regions = regions.ExecutorRegions(region, link.region, vgpu)
    exports = Exports()  # CUDA IPC among this VM's processes (ipc.py): theirs alone
    staging = StagingPool(device) if device is not None else None
    heartbeat = Heartbeat()
    stats = Stats(link)
    sessions: dict[str, tuple[Session, threading.Thread]] = {}
    lock = threading.Lock()
    retiring = threading.Event()

    def run(session: Session, key: str) -> None:
        try:
            session.serve()  # ends closed, whatever happened
        finally:
            stats.ended(session)
            with lock:
                sessions.pop(key, None)
                idle = not sessions
            try:
                link.send(messages.CLOSED, peer=session.peer)
            except OSError:
                pass
            if idle and retiring.is_set():
                try:
                    link.sock.shutdown(socket.SHUT_RD)  # ends the main loop below
                except OSError:
                    pass

    def start(sock: socket.socket, peer: str, key: str) -> None:
        """A session and its thread; where they cannot be had, the guest is let go."""
        session = None
        try:
            session = Session(sock, device, peer=peer, cache=cache, device_error=error,
                              quota=quota, owns_device=False, slice_name=name, compute=compute,
                              vgpus=quota.vgpus, staging=staging, heartbeat=heartbeat,
                              on_poisoned=poison, executor_regions=executor_regions,
                              neighbours=neighbours, kernel_output=output, ipc=exports)
            thread = threading.Thread(target=run, args=(session, key), name=key, daemon=True)
            stats.add(session)
            with lock:
                sessions[key] = (session, thread)
            thread.start()
        except Exception:  # this connection's failure, never the executor's
            log.error("%s: cannot serve this connection; closing it", peer, exc_info=True)
            with lock:
                sessions.pop(key, None)
            if session is not None:
                session.close()
                stats.ended(session)
            else:
                sock.close()
            try:
                link.send(messages.CLOSED, peer=peer)
            except OSError:
                pass

    def neighbours() -> list[Session]:
        """This executor's sessions: the connections of this VM's vGPU, no other's."""
        with lock:
            return [s for s, _ in sessions.values()]

    poisoned = threading.Event()

    def poison(status: int) -> None:
        """A kernel fault poisoned this process: the agent retires it (once)."""
        if not poisoned.is_set():
            poisoned.set()
            log.warning("slice %s: CUDA error %d poisons this executor; asking the agent to "
                        "replace it for the VM's next programs", name, status)
            try:
                link.send(messages.POISONED, status=status)
            except OSError:
                pass
            if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
                # MPS takes no new client, for any VM, while a faulted one lives: end
                # this one's guests once their error replies are out, so it exits.
                threading.Timer(_FAULT_GRACE, disconnect_all).start()

    def disconnect_all() -> None:
        with lock:
            live = [s for s, _ in sessions.values()]
        log.warning("slice %s: ending the %d connections of this faulted MPS client so the "
                    "MPS server takes clients again", name, len(live))
        for session in live:
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    counter = 0
    while True:
        message, msg, fds = link.receive()
        if message is None:
            break
        if message is messages.CONN:
            counter += 1
            key = f"{msg['peer']}#{counter}"
            start(adopt(fds[0]), msg["peer"], key)
        elif message is messages.REPLY:
            link.deliver(msg)
        elif message is messages.REGION_FD:
            link.deliver({**msg, "fd": fds[0]})
        elif message is messages.RETIRE:
            log.info("slice %s: retiring once its %d connections close", name, len(sessions))
            retiring.set()
            with lock:
                if not sessions:
                    break
    link.fail_all()
    with lock:
        live = list(sessions.values())
    for session, _ in live:  # the slice is gone: disconnect its guests
        try:
            session.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    for _, thread in live:
        thread.join(timeout=10)
    stats.close()  # after its guests' sessions ended: their last counts go too
    if staging is not None:
        staging.close()
    if device is not None:
        executor_regions.close()
        device.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="hvgpu-executor")
    ap.add_argument("--fd", type=int)
    ap.add_argument("--control-fd", type=int)
    ap.add_argument("--vm", default="")
    ap.add_argument("--vgpu", type=int, default=0)
    ap.add_argument("--compute", type=int, default=0)
    # --shm: its name when an agent started before an upgrade spawns this executor
    ap.add_argument("--region", "--shm", dest="region", type=int, default=0,
                    help="bytes of regions")
    ap.add_argument("--peer", default="")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--device", default=DEFAULT_DEVICE)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--log-format", default="text", choices=logs.FORMATS,
                    help="the agent's (its stderr is the agent's)")
    ap.add_argument("--lifeline", type=int, help="read end of the agent's lifeline pipe")
    ap.add_argument("--confine", default="auto", choices=sandbox.MODES)
    ap.add_argument("--allow-read", action="append", default=[], metavar="PATH")
    ap.add_argument("--allow-write", action="append", default=[], metavar="PATH")
    ap.add_argument("--gpu-locks", default=None, metavar="DIR",
                    help="where the executors of one agent share a device-memory lock per GPU")
    args = ap.parse_args(argv)
    if args.gpu_locks:
        args.allow_write.append(args.gpu_locks)
    name = args.vm if args.vgpu == 0 else f"{args.vm}#{args.vgpu}"  # for people only
    who = f"slice {name}" if args.control_fd is not None else args.peer
    # Every line of an executor is about its VM (or its one host-local peer): one
    # budget for all of them, so a guest cannot flood the host's log through it.
    logs.setup(args.log_level, args.log_format, f"executor[{who}]", about=name or args.peer)
    # Confined before any guest input is read: first while this process has one
    # thread, then, narrower, once the driver has loaded what it needs.
    sandbox.private_dirs(args.cache_dir)
    sandbox.enter(sandbox.serving_paths(args.cache_dir, args.allow_read, args.allow_write),
                  args.confine)
    if args.lifeline is not None:
        watch_lifeline(args.lifeline)
    cache = CompileCache(args.cache_dir)
    device, error = open_device(args.device, args.gpu, args.vgpu)
    if device is not None and args.gpu_locks:
        share_device_memory_lock(device, args.gpu_locks)
    log.info("confinement: %s; uid %d, gid %d", sandbox.narrow(
        sandbox.serving_paths(args.cache_dir, args.allow_read, args.allow_write)),
        os.getuid(), os.getgid())
    # What kernels print goes to the guests, not to the agent's log.
    output = KernelOutput.install() if device is not None else None
    if args.control_fd is not None:
        serve_slice(AgentLink(adopt_control(args.control_fd)), device, error, cache, name,
                    args.compute, args.region, args.vgpu, output)
        return 0
    executor_regions = regions.ExecutorRegions(args.region)  # memfds only: no VM, no device region
    Session(adopt(args.fd), device, peer=args.peer, cache=cache, device_error=error,
            heartbeat=Heartbeat(), executor_regions=executor_regions,
            kernel_output=output).serve()  # its own staging pool, closed with it
    return 0


if __name__ == "__main__":
    sys.exit(main())
