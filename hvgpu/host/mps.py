"""The MPS control daemon the agent starts (or joins) and the limits of its clients.

Each slice's executor is an MPS client started with
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its compute share) and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its memory quota), so the driver itself
enforces both. The limits are read once, when the client process starts:
a running executor keeps the ones it started with. Must not start clients.

The pipe and log directories live in the agent's runtime directory, not its
state directory (0700): executors run as another user and must reach them.
MPS starts one server per client uid, as that uid but not with its group
(seen on the H200: a server for the executor user, with the directories
root's and that user's group's, exited at once and its client got 805), so
with ``owner`` (the executor user) the directories are that user's (0770,
group theirs too): the root daemon reaches them anyway, nobody else does.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)
CONTROL = "nvidia-cuda-mps-control"


class MpsDaemon:
    def __init__(self, directory: str | os.PathLike, group: int | None = None,
                 owner: int | None = None):
        self.directory = Path(directory)
        self.group = group
        self.owner = owner
        self.pipe_dir = self.directory / "pipe"
        self.log_dir = self.directory / "log"
        self.running = False
        self.reason = ""

    @property
    def base_env(self) -> dict:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def start(self) -> bool:
        """Start the control daemon, or join one already serving these directories."""
        binary = shutil.which(CONTROL)
        if binary is None:
            self.reason = f"{CONTROL} is not installed; compute is time-shared"
            return False
        self._make_dirs()
        env = dict(os.environ, **self.base_env)
        if (self.pipe_dir / "control").exists():
            probe = subprocess.run([binary], input="get_server_list\n", env=env, text=True,
                                   capture_output=True, timeout=10)
            if probe.returncode == 0:
                log.info("joined the MPS control daemon at %s", self.pipe_dir)
                self.running = True
                return True
        # Its sockets must admit the executor user's group: the directories are setgid
        # to that group, and this umask leaves group rights on what the daemon makes
        # (seen on the H200: with the default, an hvgpu-user client got 805).
        proc = subprocess.run([binary, "-d"], env=env, capture_output=True, text=True, timeout=30,
                              umask=0o007 if self.group is not None else 0o077)
        if proc.returncode != 0:
            self.reason = (f"{CONTROL} -d failed: {(proc.stderr or proc.stdout).strip()}; "
                           "compute is time-shared")
            log.warning("%s", self.reason)
            return False
        log.info("started the MPS control daemon (pipes in %s)", self.pipe_dir)
        self.running = True
        return True

    def _make_dirs(self) -> None:
        for d in (self.directory, self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            if self.group is not None:
                os.chown(d, os.geteuid() if self.owner is None else self.owner, self.group,
                         follow_symlinks=False)
            os.chmod(d, (0o750 if d == self.directory else 0o2770) if self.group is not None
                     else 0o700, follow_symlinks=False)

    def client_env(self, mem: int, compute: int) -> dict:
        """Environment of an executor that must stay within (mem, compute)."""
        env = dict(self.base_env)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, mem >> 20)}M"
        if compute:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(compute)
        return env

    def stop(self) -> None:
        if not self.running:
            return
        env = dict(os.environ, **self.base_env)
        subprocess.run([CONTROL], input="quit\n", env=env, text=True, capture_output=True,
                       timeout=30)
        self.running = False
        log.info("stopped the MPS control daemon")
