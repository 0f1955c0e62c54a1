"""A GPU test double that behaves like a compromised executor.

Loading a module whose image starts with :data:`PROBE` makes the executor try
what an attacker with code execution in it would: read host files, write
outside its cache directory, open TCP connections, signal the agent, run a
host program. What happened comes back to the guest in the error of that
MODULE_LOAD (a JSON object after ``probe:``); the executor keeps serving.
:class:`LyingLayoutDevice` answers what a compromised executor could, to the guest.
Lives under tests/ only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

from hvgpu.errors import CudaError
from tests.fake_gpu import FakeDevice

PROBE = b"HVGPU-PROBE\n"


def probe_image(**targets) -> bytes:
    """The module image that asks for ``targets``: read=[...], write=[...], listdir=[...],
    unix=[socket paths], tcp=PORT, signal=PID, run=[argv], python=True (start the
    interpreter as the NVRTC child would: the one thing that must work)."""
    return PROBE + json.dumps(targets).encode()


def results(message: str) -> dict:
    return json.loads(re.search(r"probe:(\{.*\})", message, re.S).group(1))


def _attempt(fn) -> str:
    try:
        got = fn()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"denied: {type(exc).__name__}: {exc}"
    return "ALLOWED" + (f" {json.dumps(sorted(got))}" if isinstance(got, list) else "")


def _read(path):
    with open(path, "rb") as f:
        f.read(1)


def _write(path):
    with open(path, "wb") as f:
        f.write(b"written by a compromised executor\n")


def _connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def _unix(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)


def _bind(_):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()


def _run(argv):
    subprocess.run(argv, check=True, timeout=30, capture_output=True)


def run_probes(targets: dict) -> dict:
    out = {"pid": os.getpid(), "uid": os.getuid()}
    for path in targets.get("read", ()):
        out[f"read {path}"] = _attempt(lambda p=path: _read(p))
    for path in targets.get("listdir", ()):
        out[f"listdir {path}"] = _attempt(lambda p=path: os.listdir(p))
    for path in targets.get("write", ()):
        out[f"write {path}"] = _attempt(lambda p=path: _write(p))
    for path in targets.get("unix", ()):
        out[f"unix connect {path}"] = _attempt(lambda p=path: _unix(p))
    if "tcp" in targets:
        out["tcp connect"] = _attempt(lambda: _connect(targets["tcp"]))
        out["tcp bind"] = _attempt(lambda: _bind(None))
    if "signal" in targets:
        pid = targets["signal"]
        out["signal 0"] = _attempt(lambda: os.kill(pid, 0))
        out["SIGCONT"] = _attempt(lambda: os.kill(pid, signal.SIGCONT))  # harmless if it lands
    if "run" in targets:
        out["run"] = _attempt(lambda: _run(targets["run"]))
    if targets.get("python"):  # what the NVRTC child needs: the interpreter and hvgpu
        out["python child"] = _attempt(lambda: _run(
            [sys.executable, "-c", "import hvgpu.host.executor.__main__, numpy"]))
    try:
        from hvgpu.host.executor import sandbox
        out["confinement"] = sandbox.describe()
    except ImportError:
        out["confinement"] = "unknown"
    return out


class HostileDevice(FakeDevice):
    def module_load(self, image):
        image = bytes(image)
        if image.startswith(PROBE):
            found = run_probes(json.loads(image[len(PROBE):]))
            raise CudaError(200, "probe:" + json.dumps(found))
        return super().module_load(image)


class LyingLayoutDevice(FakeDevice):
    """Says every kernel takes one parameter at offset 16 of 0xFFFFFFF8 bytes: an end
    past 2**32 that wraps to 8 in 32-bit arithmetic. The guest copies each parameter
    where the layout says, so it must not believe this one."""

    def param_layout(self, function):
        return [(16, 0xFFFFFFF8)]
