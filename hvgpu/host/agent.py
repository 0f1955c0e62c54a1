"""The host agent's data-lane front door: accept guests, hand each to an executor.

The agent listens on vsock and any configured unix / hybrid-vsock / tcp
address. For every accepted connection it learns the peer's identity from the
transport and starts an executor process that inherits the socket and serves
that guest alone; the agent never reads guest traffic, so one guest's bulk
copy or crash cannot stall another. When a guest vanishes its executor exits
and the process's exit frees everything it held on the GPU.

Must not import CUDA: executors do.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvgpu.errors import HvgpuError, TransportError
from hvgpu.virtio.address import VMADDR_CID_ANY, Address
from hvgpu.virtio.protocol import DEFAULT_PORT
from hvgpu.virtio.transport import Listener, listen, vsock_available

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "/var/cache/hvgpu"


@dataclass
class AgentConfig:
    listen: list[str] = field(default_factory=list)  # extra addresses
    vsock_port: int | None = DEFAULT_PORT  # None: no vsock listener
    gpu: int = 0
    cache_dir: str | None = DEFAULT_CACHE_DIR
    device: str | None = None  # executor's GpuDevice factory; tests use a double
    log_level: str = "INFO"
    env: dict = field(default_factory=dict)  # extra environment for executors


@dataclass
class Executor:
    process: subprocess.Popen
    peer: str
    started: float


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.listeners: list[Listener] = []
        self.executors: dict[int, Executor] = {}
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Open every listener; raise if none could be opened."""
        addresses = list(self.config.listen)
        if self.config.vsock_port is not None:
            if vsock_available():
                addresses.insert(0, str(Address("vsock", cid=VMADDR_CID_ANY,
                                                port=self.config.vsock_port)))
            else:
                log.warning("vsock is not available on this host (load the vhost_vsock "
                            "module); guests in VMs cannot reach this agent")
        failures = []
        for text in addresses:
            try:
                listener = listen(text)
            except HvgpuError as exc:
                failures.append(str(exc))
                log.error("%s", exc)
                continue
            self.listeners.append(listener)
            self._selector.register(listener, selectors.EVENT_READ)
            log.info("listening on %s", listener.address)
        if not self.listeners:
            raise TransportError("the agent has nowhere to listen: "
                                 + ("; ".join(failures) or "no address configured"))
        self._selector.register(self._wake_r, selectors.EVENT_READ)

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.5):
                    if key.fileobj == self._wake_r:
                        os.read(self._wake_r, 64)
                        continue
                    self._accept(key.fileobj)
                self._reap()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- work ----------------------------------------------------------------

    def _accept(self, listener: Listener) -> None:
        try:
            conn, peer = listener.accept()
        except OSError as exc:
            log.warning("accept on %s failed: %s", listener.address, exc)
            return
        try:
            proc = self._spawn(conn.fileno(), peer)
        except OSError as exc:
            log.error("cannot start an executor for %s: %s", peer, exc)
            conn.close()
            return
        conn.close()  # the executor holds its own copy
        self.executors[proc.pid] = Executor(proc, peer, time.monotonic())
        log.info("%s connected on %s: executor pid %d", peer, listener.address, proc.pid)

    def _spawn(self, fd: int, peer: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "hvgpu.host.executor", "--fd", str(fd), "--peer", peer,
               "--gpu", str(self.config.gpu), "--log-level", self.config.log_level]
        if self.config.cache_dir:
            cmd += ["--cache-dir", self.config.cache_dir]
        if self.config.device:
            cmd += ["--device", self.config.device]
        env = dict(os.environ, **self.config.env)
        return subprocess.Popen(cmd, pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL)

    def _reap(self) -> None:
        for pid, ex in list(self.executors.items()):
            code = ex.process.poll()
            if code is None:
                continue
            del self.executors[pid]
            took = time.monotonic() - ex.started
            if code == 0:
                log.info("executor pid %d for %s finished after %.1fs", pid, ex.peer, took)
            else:
                log.warning("executor pid %d for %s exited with %s after %.1fs; its GPU "
                            "resources went with it", pid, ex.peer, _describe(code), took)

    def _shutdown(self) -> None:
        for listener in self.listeners:
            try:
                self._selector.unregister(listener)
            except (KeyError, ValueError):
                pass
            listener.close()
        self.listeners = []
        for ex in self.executors.values():
            if ex.process.poll() is None:
                ex.process.terminate()
        deadline = time.monotonic() + 5
        for ex in self.executors.values():
            try:
                ex.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ex.process.kill()
                ex.process.wait()
        self.executors.clear()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._selector.close()
        log.info("agent stopped")


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def default_cache_dir() -> str:
    """/var/cache/hvgpu for root, ~/.cache/hvgpu otherwise."""
    if os.geteuid() == 0:
        return DEFAULT_CACHE_DIR
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hvgpu")
