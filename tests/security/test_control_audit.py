"""Who the audit log says called the control lane: the kernel's word, not the client's.

Before: the audit line carried what the client stated about itself, so a client
stating 'root (uid 0, pid 1)' was logged as root, pid 1. Now the line carries
the credentials the kernel recorded for the control socket's peer (SO_PEERCRED)
and the stated text beside them, marked as stated.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import grpc
import pytest

from hvgpu.host import control_grpc
from tests.conftest import REPO

FORGED = "root (uid 0, pid 1)"


def _call(target: str, name: str, stated: str = FORGED, **args):
    channel = grpc.insecure_channel(f"unix://{target}")
    try:
        stub = channel.unary_unary(f"/{control_grpc.SERVICE}/{name}",
                                   request_serializer=lambda d: json.dumps(d).encode(),
                                   response_deserializer=json.loads)
        return stub(args, timeout=30, metadata=((control_grpc.CALLER_KEY, stated),))
    finally:
        channel.close()


def _audit_lines(caplog, op: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "hvgpu.audit" and r.getMessage().startswith(f"control {op} by ")]


def test_a_forged_identity_is_logged_as_stated_beside_the_kernels(agent, caplog):
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    assert _call(agent.control, "attach", vm="vm1", mem="64M")["ok"]
    (line,) = _audit_lines(caplog, "attach")
    me = f"(uid {os.getuid()}, gid {os.getgid()}, pid {os.getpid()})"
    assert f"by {_name(os.getuid())} {me}, stating {FORGED!r}, on the control socket" in line


def test_another_process_is_logged_with_its_own_pid(agent, caplog):
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    code = ("import sys; from tests.security.test_control_audit import _call; "
            "r = _call(sys.argv[1], 'detach', vm='vm2'); sys.exit(0 if not r['ok'] else 1)")
    proc = subprocess.Popen([sys.executable, "-c", code, agent.control], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.wait(timeout=60) == 0
    (line,) = _audit_lines(caplog, "detach")
    assert f", pid {proc.pid}), stating {FORGED!r}" in line
    assert f"pid {os.getpid()})" not in line


def test_a_call_that_bypasses_the_control_socket_is_refused(agent, caplog):
    caplog.set_level(logging.DEBUG, logger="hvgpu.audit")
    private = str(agent.server.private)  # gRPC's own socket, in a directory of the agent's
    assert oct(os.stat(os.path.dirname(private)).st_mode & 0o777) == "0o700"
    reply = _call(private, "attach", vm="vm1", mem="64M")
    assert reply == {"ok": False, "code": "unidentified-caller",
                     "message": "control calls are taken on the control socket only"}
    assert _audit_lines(caplog, "attach") == []  # nothing ran
    assert agent.api.list() == []


def _name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        pytest.skip("this uid has no name")
