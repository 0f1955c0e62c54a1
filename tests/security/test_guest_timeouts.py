"""A silent agent is an error for the guest, never a hang; a slow GPU is not silence.

The silent agent is a unix socket that accepts and never answers. Against it,
the Python client, `hvgpu-guest info` and a program under the libcuda shim get
CUDA_ERROR_DEVICE_UNAVAILABLE (46) after HVGPU_TIMEOUT seconds, with a line
naming the address and the timeout. A synchronize that waits on a kernel
longer than HVGPU_TIMEOUT completes, because the executor sends progress frames
to guests that announce CAP_PROGRESS (and only to those).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from hvgpu.errors import CudaError, HvgpuError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.guest.client import timeout_seconds
from hvgpu.guest.shim import library
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from tests.host.test_agent import SLEEP
from tests.security.data_lane import exactly, frame, hello, raw

HERE = Path(__file__).parent
GIVE_UP = 90  # the silent agent hangs up after this, so code without timeouts fails, not hangs
SLOW_MS = 7000  # a kernel this long, against a timeout of:
TIMEOUT = "3"
STALL_TIMEOUT = "2"  # where a send stalls: twice this passes before it is judged silent


class SilentAgent:
    """Accepts connections and never sends a byte."""

    def __init__(self, path: Path):
        self.address = f"unix://{path}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._hang_up, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                return

    def _hang_up(self):
        self.stop.wait(GIVE_UP)
        self.close()

    def close(self):
        self.stop.set()
        self.listener.close()
        for sock in self.held:
            sock.close()


@pytest.fixture
def silent(tmp_path):
    agent = SilentAgent(tmp_path / "silent.sock")
    yield agent
    agent.close()


def test_the_python_client_gives_device_unavailable_against_a_silent_agent(silent, monkeypatch):
    monkeypatch.setenv("HVGPU_TIMEOUT", "2")
    with pytest.raises(CudaError) as info:
        Connection(silent.address)
    assert info.value.status == 46
    assert f"the hvgpu agent at {silent.address} did not answer for 2 s (HVGPU_TIMEOUT)" \
        in str(info.value)


def test_hvgpu_guest_info_says_so_against_a_silent_agent(silent):
    out = subprocess.run([sys.executable, "-m", "hvgpu.guest.cli", "info"], capture_output=True,
                         text=True, timeout=GIVE_UP + 30,
                         env=dict(os.environ, HVGPU_AGENT=silent.address, HVGPU_TIMEOUT="2"))
    assert out.returncode == 1
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE (46)" in out.stderr
    assert f"{silent.address} did not answer for 2 s (HVGPU_TIMEOUT)" in out.stderr


def test_timeout_values(monkeypatch):
    assert timeout_seconds("") == 60 and timeout_seconds("7.5") == 7.5
    assert timeout_seconds("0.1") == 2  # the minimum: progress frames come every second
    assert timeout_seconds("0") is None  # never
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(HvgpuError, match="HVGPU_TIMEOUT"):
            timeout_seconds(bad)


@pytest.fixture(scope="module")
def long_wait(tmp_path_factory):
    exe = tmp_path_factory.mktemp("shim") / "long_wait"
    subprocess.run(["gcc", "-o", str(exe), str(HERE / "cuda/long_wait.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    return exe


def _run(exe, address, *args, timeout=TIMEOUT):
    env = dict(os.environ, HVGPU_AGENT=address, HVGPU_TIMEOUT=timeout,
               LD_LIBRARY_PATH=str(library().parent))
    return subprocess.run([str(exe), *args], capture_output=True, text=True,
                          timeout=GIVE_UP + 30, env=env)


def test_a_program_under_the_shim_gets_device_unavailable_against_a_silent_agent(
        long_wait, silent):
    out = _run(long_wait, silent.address)
    assert out.returncode == 0, out  # no signal, no abort: the program saw an error
    assert out.stdout == "init: 46 CUDA_ERROR_DEVICE_UNAVAILABLE\n"
    assert f"the hvgpu agent at {silent.address} did not answer for {TIMEOUT} s " \
           "(HVGPU_TIMEOUT)" in out.stderr


def test_a_long_synchronize_under_the_shim_is_not_cut_short(long_wait, fake_agent):
    out = _run(long_wait, fake_agent.address, str(SLOW_MS))
    assert out.returncode == 0, out
    assert out.stdout == ("init: 0 CUDA_SUCCESS\nlaunch: 0 CUDA_SUCCESS\n"
                          "sync: 0 CUDA_SUCCESS\n"), out.stderr


def test_a_copy_under_the_shim_stalled_behind_a_long_kernel_is_not_cut_short(long_wait,
                                                                             fake_agent):
    out = _run(long_wait, fake_agent.address, str(SLOW_MS), "64", timeout=STALL_TIMEOUT)
    assert out.returncode == 0, out
    assert out.stdout == ("init: 0 CUDA_SUCCESS\nlaunch: 0 CUDA_SUCCESS\n"
                          "copy: 0 CUDA_SUCCESS\nsync: 0 CUDA_SUCCESS\n"
                          "copy back: 0 CUDA_SUCCESS, 0 wrong\n"), out.stderr


def test_a_long_synchronize_in_python_is_not_cut_short(fake_agent, monkeypatch):
    monkeypatch.setenv("HVGPU_TIMEOUT", TIMEOUT)
    with Connection(fake_agent.address) as conn:
        kernel = Program(SLEEP, connection=conn).compile().get_kernel("sleep_ms")
        launch(kernel, LaunchConfig(), SLOW_MS)
        conn.call("CTX_SYNCHRONIZE")
        conn.call("PING")


def test_a_copy_stalled_behind_a_long_kernel_is_not_cut_short(fake_agent, monkeypatch):
    monkeypatch.setenv("HVGPU_TIMEOUT", STALL_TIMEOUT)
    data = np.arange(16 << 20, dtype=np.uint32)  # 64 MiB: far more than the socket buffers
    with Connection(fake_agent.address) as conn:
        kernel = Program(SLEEP, connection=conn).compile().get_kernel("sleep_ms")
        buf = Device(connection=conn).allocate(data.nbytes)
        launch(kernel, LaunchConfig(), SLOW_MS)
        buf.copy_from(data)  # the executor takes nothing while the kernel runs
        out = np.empty_like(data)
        buf.copy_to(out)
        assert np.array_equal(out, data)


def _long_sync_frames(address: str, caps: int) -> list:
    """Every frame the agent sends while a guest waits for a synchronize behind a
    3-second kernel: (flags, op, seq, status, body_len, payload_len)."""
    with raw(address) as sock:
        sock.sendall(hello(caps=caps))
        assert _read(sock)[3] == 0
        sock.sendall(frame("MODULE_COMPILE", "sleep.cu", "", seq=2, payload=SLEEP.encode()))
        module = codec.REPLY[P.OP["MODULE_COMPILE"]].decode(_read(sock, body=True)[4])[0]
        sock.sendall(frame("MODULE_GET_FUNCTION", module, "sleep_ms", seq=3))
        function = codec.REPLY[P.OP["MODULE_GET_FUNCTION"]].decode(_read(sock, body=True)[4])[0]
        sock.sendall(frame("LAUNCH_KERNEL", function, 1, 1, 1, 1, 1, 1, 0, 0,
                           struct.pack("<i", 3000), flags=P.FLAG_ONEWAY, seq=4)
                     + frame("CTX_SYNCHRONIZE", seq=5))
        frames = []
        while not frames or frames[-1][0] & P.FLAG_PROGRESS:
            frames.append(_read(sock))
        return frames


def _read(sock, body=False):
    (_, _, flags, op, _, seq, status, blen, _, plen) = P.HEADER.unpack(
        exactly(sock, P.HEADER.size))
    data = exactly(sock, blen)
    exactly(sock, plen)
    return (flags, op, seq, status, data if body else blen, plen)


def test_progress_frames_reach_only_guests_that_asked_for_them(fake_agent):
    frames = _long_sync_frames(fake_agent.address, P.CAP_PROGRESS)
    *progress, reply = frames
    assert reply == (P.FLAG_REPLY, P.OP["CTX_SYNCHRONIZE"], 5, 0, 0, 0)
    assert progress, "no progress frame during a 3-second wait"
    for flags, op, seq, status, blen, plen in progress:
        assert flags == P.FLAG_REPLY | P.FLAG_PROGRESS and (status, blen, plen) == (0, 0, 0)
        assert (op, seq) in {(P.OP["LAUNCH_KERNEL"], 4), (P.OP["CTX_SYNCHRONIZE"], 5)}
    assert _long_sync_frames(fake_agent.address, 0) == [reply]  # no CAP_PROGRESS: none
