"""The control lane: ControlAPI over gRPC on a unix socket (server and client).

The only module in hvgpu that imports gRPC. Messages are JSON documents (the
API's own dicts), so there is no generated code to keep in step. The socket
is born mode 0600 (bound under a private umask, whatever the agent's umask),
then opened to a configured group as 0660. A socket that another agent still
listens on is never removed. Must not add behaviour: every call is one
ControlAPI method, run on the agent's loop (``Agent.commands``) when the server
is given that; the caller's identity as its client states it (user, uid, pid:
the socket's mode and group decide who may call at all) goes with the call to
the audit log.
"""

from __future__ import annotations

import grp
import json
import os
import pwd

import grpc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hvgpu.errors import HvgpuError, TransportError
from hvgpu.virtio.transport import claim_unix_path, private_umask

SERVICE = "hvgpu.Control"
METHODS = ("gpus", "attach", "detach", "resize", "list", "status")


def default_socket() -> str:
    if os.geteuid() == 0:
        return "/run/hvgpu/control.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/hvgpu-{os.getuid()}"
    return str(Path(runtime) / "hvgpu" / "control.sock")


def _encode(doc) -> bytes:
    return json.dumps(doc).encode()


CALLER_KEY = "hvgpu-caller"


def _caller(context) -> str:
    stated = dict(context.invocation_metadata() or ()).get(CALLER_KEY, "")
    return f"{stated[:120] or 'an unnamed client'} (stated) on the control socket"


class ControlGroupError(HvgpuError):
    """--control-group names a group that an untrusted user of the agent's is in."""

    code = "control-group-untrusted"


def check_group(group: str | None, executor_user) -> None:
    """Refuse a control group that contains the user executors (and the MPS server)
    run as (launch.ExecutorUser): executors run what guests send and may be
    compromised, and the group may resize and detach every VM's slices. As its
    primary group or a supplementary one, both count; executors that run as the
    agent's own user (``switch`` false) own the socket anyway."""
    if not group or not getattr(executor_user, "switch", False):
        return
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise HvgpuError(f"no group named {group!r} for the control socket") from None
    if gid in (executor_user.gid, *executor_user.groups):
        raise ControlGroupError(
            f"--control-group {group} contains the executor user {executor_user.name} "
            f"(uid {executor_user.uid}): executors run guests' code as that user, and the "
            "group may attach, resize and detach every VM's slices. Choose a group the "
            f"executor user is not in (groupadd hvgpu-admin), or take {executor_user.name} "
            f"out of {group}")


def serve(api, path: str, group: str | None = None) -> grpc.Server:
    """``api``: a ControlAPI, or Agent.commands' view of one (then each call runs on
    the agent's loop and is audited with its caller)."""
    def make(name):
        def handler(request, context):
            target = api.as_caller(_caller(context)) if hasattr(api, "as_caller") else api
            if not isinstance(request, dict):
                return {"ok": False, "code": "bad-request",
                        "message": f"{name} takes a JSON object of named arguments"}
            if any(str(k).startswith("_") for k in request):  # the agent's own, never a caller's
                return {"ok": False, "code": "bad-request",
                        "message": f"{name} takes no argument starting with '_'"}
            try:
                return {"ok": True, "result": getattr(target, name)(**request)}
            except HvgpuError as exc:
                return {"ok": False, "code": exc.code, "message": str(exc)}
            except TypeError as exc:  # an argument the method does not take
                return {"ok": False, "code": "bad-request", "message": str(exc)}
        return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=json.loads,
                                                   response_serializer=_encode)

    sock = Path(path)
    if not sock.parent.is_dir():
        old = os.umask(0o022)  # the directory: others may pass through, never write
        try:
            sock.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        except OSError as exc:
            raise TransportError(f"cannot make the control socket's directory "
                                 f"{sock.parent}: {exc.strerror}") from None
        finally:
            os.umask(old)
    claim_unix_path(path)  # removes a stale socket; refuses a live agent's
    server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="control"),
                         handlers=[grpc.method_handlers_generic_handler(
                             SERVICE, {name: make(name) for name in METHODS})])
    with private_umask():
        try:
            bound = server.add_insecure_port(f"unix://{path}")
        except RuntimeError:  # newer gRPC raises where older ones returned 0
            bound = 0
        if not bound:
            server.stop(0)
            raise TransportError(f"cannot open the control socket {path}: its directory "
                                 "must exist and be writable (--control PATH)")
        server.start()
    if group:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except KeyError:
            server.stop(0)
            raise HvgpuError(f"no group named {group!r} for the control socket") from None
        os.chmod(path, 0o660)
    else:
        os.chmod(path, 0o600)
    return server


class ControlClient:
    def __init__(self, path: str | None = None, timeout: float = 60.0):
        self.path = path or os.environ.get("HVGPU_CONTROL") or default_socket()
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{self.path}")

    def call(self, name: str, **kwargs):
        stub = self.channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=_encode,
                                        response_deserializer=json.loads)
        try:
            reply = stub({k: v for k, v in kwargs.items() if v is not None}, timeout=self.timeout,
                         metadata=((CALLER_KEY, _me()),))
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise TransportError(f"no agent answers on {self.path}: is `hvgpu agent` "
                                     "running, and may you open its control socket (root or "
                                     "its group)?") from None
            raise TransportError(f"control call {name} failed: {exc.details()}") from None
        if not reply["ok"]:
            raise HvgpuError(reply["message"], code=reply["code"])
        return reply["result"]

    def close(self) -> None:
        self.channel.close()


def _me() -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "?"
    return f"{name} (uid {uid}, pid {os.getpid()})"
