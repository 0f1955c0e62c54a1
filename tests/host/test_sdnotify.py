"""sd_notify: the agent tells systemd it is ready and stopping, over a datagram socket
given by path or in the abstract namespace, and no child inherits the socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from hvgpu.host import sdnotify
from tests.conftest import REPO


@pytest.fixture
def release():
    yield
    sdnotify.release()


def receive(sock: socket.socket) -> dict:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_status_and_stopping_reach_the_socket(tmp_path, release, abstract):
    name = f"@hvgpu-test-{os.getpid()}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:] if abstract else name)
        sock.settimeout(30)
        env = {"NOTIFY_SOCKET": name, "OTHER": "1"}
        assert sdnotify.claim(env)
        assert env == {"OTHER": "1"}  # taken: no child process inherits it
        assert sdnotify.ready("serving 2 slices\non vsock")
        assert receive(sock) == {"READY": "1", "STATUS": "serving 2 slices on vsock"}
        assert sdnotify.status("attached vm1")
        assert receive(sock) == {"STATUS": "attached vm1"}
        assert sdnotify.stopping()
        assert receive(sock)["STOPPING"] == "1"


def test_nothing_is_sent_without_a_socket_and_a_dead_one_fails_nothing(tmp_path, release):
    assert not sdnotify.claim({})
    assert not sdnotify.ready("x")
    assert not sdnotify.claim({"NOTIFY_SOCKET": "vsock:2:9"})  # not spoken here
    assert sdnotify.claim({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not sdnotify.ready("x")  # logged, not raised


def from_agent(sock: socket.socket, proc: subprocess.Popen) -> dict:
    """The agent's next notification; its error output if it ended instead."""
    for _ in range(300):
        try:
            return receive(sock)
        except TimeoutError:
            if proc.poll() is not None:
                pytest.fail(f"the agent ended ({proc.returncode}): {proc.stderr.read()}")
    pytest.fail("no notification from the agent in 300 s")


def test_the_agent_says_ready_once_it_serves_and_stopping_on_sigterm(tmp_path):
    path = tmp_path / "notify"
    (tmp_path / "agent.toml").write_text("log-format = 'json'\n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(1)
        control = tmp_path / "control.sock"
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvgpu.host.cli", "-c", "test:///default",
             "--control", str(control), "agent", "--no-vsock", "--no-mps",
             "--listen", f"unix://{tmp_path}/data.sock", "--state-dir", str(tmp_path / "s"),
             "--cache-dir", str(tmp_path / "c"), "--executor-user", "root",
             "--config", str(tmp_path / "agent.toml")],
            cwd=REPO, env=dict(os.environ, NOTIFY_SOCKET=str(path), PYTHONPATH=str(REPO)),
            stderr=subprocess.PIPE, text=True)
        try:
            first = from_agent(sock, proc)
            assert first["READY"] == "1"
            assert control.exists()  # the control socket is up before READY=1
            assert f"unix://{tmp_path}/data.sock" in first["STATUS"]
            proc.send_signal(signal.SIGTERM)
            assert from_agent(sock, proc)["STOPPING"] == "1"
            assert proc.wait(timeout=60) == 0
            lines = proc.stderr.read().splitlines()
            # the file's log-format applied: one JSON object a line
            assert lines and all(line.startswith("{") for line in lines), lines
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
