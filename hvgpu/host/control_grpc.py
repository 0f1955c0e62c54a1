"""The control lane: ControlAPI over gRPC on a unix socket (server and client).

The only module in hvgpu that imports gRPC. Messages are JSON documents (the
API's own dicts), so there is no generated code to keep in step. The socket
is born mode 0600 (bound under a private umask, whatever the agent's umask),
then opened to a configured group as 0660. A socket that another agent still
listens on is never removed. Must not add behaviour: every call is one
ControlAPI method, run on the agent's loop (``Agent.commands``) when the server
is given that; who called goes with the call to the audit log.

Who called is what the kernel says (SO_PEERCRED: pid, uid, gid), with what the
client states beside it. gRPC cannot say it: for a unix socket its peer is
"unix:", and its local credentials' auth context holds only the words "local".
So the control socket is not gRPC's own: :class:`Relay` accepts on it, reads
each client's credentials, and pipes the client's bytes to gRPC's socket in a
private directory over a connection of its own, from a socket the kernel
names (autobind); gRPC gives that name as the call's peer, and the handler
finds the credentials by it. A call from any other peer is refused.
"""

from __future__ import annotations

import errno
import grp
import json
import logging
import os
import pwd
import selectors
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field

import grpc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hvgpu.errors import HvgpuError, TransportError
from hvgpu.host.logs import Budget
from hvgpu.virtio.transport import (Listener, connect_autobound, listen, peer_credentials,
                                    private_umask)

log = logging.getLogger(__name__)

SERVICE = "hvgpu.Control"
METHODS = ("gpus", "attach", "detach", "resize", "list", "status")


def default_socket() -> str:
    if os.geteuid() == 0:
        return "/run/hvgpu/control.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/hvgpu-{os.getuid()}"
    return str(Path(runtime) / "hvgpu" / "control.sock")


def _encode(doc) -> bytes:
    return json.dumps(doc).encode()


class _Undecodable(str):
    """A request body that is no JSON: why, for the handler to refuse the call with.
    gRPC calls the deserializer outside the handler, where an exception becomes an
    INTERNAL status and a traceback in gRPC's log, not the caller's bad request."""


# A body of JSON null: gRPC takes a deserializer's None for its own failure (INTERNAL,
# logged), so null stands as this, which the handler refuses as no JSON object.
_NULL = ()


def _decode(body: bytes):
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: [[[[... nested deep
        return _Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")
    return _NULL if doc is None else doc


CALLER_KEY = "hvgpu-caller"
STATED_MAX = 120  # characters of what a client states about itself, in the audit line

# What the relay holds: connections at once (only root and --control-group may
# connect; a CLI call holds one for its duration), and bytes of one direction
# of one connection before it stops reading that side (a control message is
# a few KiB).
RELAY_CLIENTS = 64
RELAY_BUFFER = 1 << 20
RELAY_REST = 0.5  # seconds without accepting once accept ran out of descriptors


@dataclass(frozen=True)
class Caller:
    """A control client as the kernel knows it."""

    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        try:
            name = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            name = "?"
        return f"{name} (uid {self.uid}, gid {self.gid}, pid {self.pid})"


def _stated(context) -> str:
    stated = str(dict(context.invocation_metadata() or ()).get(CALLER_KEY, ""))
    if len(stated) > STATED_MAX:
        stated = stated[:STATED_MAX] + "..."
    return repr(stated) if stated else "nothing"


@dataclass(eq=False)
class _Pipe:
    """One client's connection and the relay's own to gRPC (index 0 and 1)."""

    socks: tuple
    name: str  # the relay end's autobound name: gRPC's peer "unix-abstract:NAME"
    caller: Caller
    out: tuple = field(default_factory=lambda: (bytearray(), bytearray()))  # to send to each
    eof: list = field(default_factory=lambda: [False, False])  # each has sent its last byte
    shut: list = field(default_factory=lambda: [False, False])  # told each there is no more
    events: list = field(default_factory=lambda: [0, 0])  # registered with the selector


class Relay:
    """Accepts on the public control socket and pipes each client to gRPC's private
    socket, keeping the client's kernel credentials under the name gRPC will give as
    the call's peer. One thread and a selector; RELAY_CLIENTS at most."""

    def __init__(self, listener: Listener, upstream: str):
        self.listener = listener
        self.upstream = upstream
        self._callers: dict[str, Caller] = {}  # read by gRPC's threads (dict ops are atomic)
        self._pipes: set[_Pipe] = set()
        self._log = Budget(lines=1, per=10.0)
        self._rest_until: float | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.listener.sock.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._sel.register(self.listener.sock, selectors.EVENT_READ, "listen")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="hvgpu-control-relay",
                                        daemon=True)
        self._thread.start()

    def caller(self, peer: str) -> Caller | None:
        """The credentials of the client whose call gRPC reports from ``peer``."""
        kind, _, name = peer.partition(":")
        return self._callers.get(name) if kind == "unix-abstract" else None

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=10)
        os.close(self._wake_w)

    def _serve(self) -> None:
        try:
            while not self._stopping:
                timeout = 1.0
                if self._rest_until is not None:
                    timeout = max(0.0, min(timeout, self._rest_until - time.monotonic()))
                for key, events in self._sel.select(timeout):
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._on(*key.data, events)
                if self._rest_until is not None and time.monotonic() >= self._rest_until:
                    self._rest_until = None
                    self._sel.register(self.listener.sock, selectors.EVENT_READ, "listen")
        except Exception:  # a bug here ends the control lane, never the agent
            log.exception("the control socket's relay failed; control calls are not served")
        finally:
            for pipe in list(self._pipes):
                self._close(pipe)
            self._sel.close()
            self.listener.close()
            os.close(self._wake_r)

    def _say(self, what: str, exc: OSError) -> None:
        dropped = self._log.take(what)
        if dropped is not None:
            more = f" ({dropped} more since the last such line)" if dropped else ""
            log.warning("control socket: %s: %s%s", what, exc.strerror or exc, more)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._say("accepting a client failed", exc)
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._sel.unregister(self.listener.sock)  # it would fail again at once
                self._rest_until = time.monotonic() + RELAY_REST
            return
        if len(self._pipes) >= RELAY_CLIENTS:
            conn.close()
            self._say("refused a client", OSError(f"{RELAY_CLIENTS} clients are connected"))
            return
        try:
            caller = Caller(*peer_credentials(conn))
            up, name = connect_autobound(self.upstream)
        except OSError as exc:
            conn.close()
            self._say("reaching the control server failed", exc)
            return
        conn.setblocking(False)
        up.setblocking(False)
        pipe = _Pipe((conn, up), name, caller)
        self._callers[name] = caller
        self._pipes.add(pipe)
        self._update(pipe)

    def _on(self, pipe: _Pipe, side: int, events: int) -> None:
        if pipe not in self._pipes:  # its other side's event, earlier in this turn, closed it
            return
        other = 1 - side
        sock = pipe.socks[side]
        try:
            if events & selectors.EVENT_WRITE and pipe.out[side]:
                del pipe.out[side][:sock.send(pipe.out[side])]
            if events & selectors.EVENT_READ and not pipe.eof[side]:
                data = sock.recv(65536)
                if data:
                    pipe.out[other].extend(data)
                else:
                    pipe.eof[side] = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # a reset: the whole connection ends
            self._close(pipe)
            return
        for s in (0, 1):  # one side is done and all it sent has gone: tell the other
            if pipe.eof[s] and not pipe.out[1 - s] and not pipe.shut[1 - s]:
                pipe.shut[1 - s] = True
                try:
                    pipe.socks[1 - s].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if all(pipe.shut):
            self._close(pipe)
        else:
            self._update(pipe)

    def _update(self, pipe: _Pipe) -> None:
        """Read a side while the other's buffer has room; write a side with bytes for it."""
        for s in (0, 1):
            want = 0
            if not pipe.eof[s] and len(pipe.out[1 - s]) < RELAY_BUFFER:
                want |= selectors.EVENT_READ
            if pipe.out[s]:
                want |= selectors.EVENT_WRITE
            if want == pipe.events[s]:
                continue
            if not pipe.events[s]:
                self._sel.register(pipe.socks[s], want, (pipe, s))
            elif not want:
                self._sel.unregister(pipe.socks[s])
            else:
                self._sel.modify(pipe.socks[s], want, (pipe, s))
            pipe.events[s] = want

    def _close(self, pipe: _Pipe) -> None:
        # Forgotten before its name is freed: a later socket given the same name
        # must not be taken for this caller.
        self._callers.pop(pipe.name, None)
        self._pipes.discard(pipe)
        for s, sock in enumerate(pipe.socks):
            if pipe.events[s]:
                self._sel.unregister(sock)
            sock.close()


class ControlServer:
    """The control lane as served: gRPC on a socket in a private directory, and the
    relay on the public control socket."""

    def __init__(self, server: grpc.Server, relay: Relay, private: Path):
        self.server, self.relay, self.private = server, relay, private

    def stop(self, grace: float | None = None):
        done = self.server.stop(grace)
        done.wait((grace or 0) + 1)  # calls in flight send their replies through the relay
        self.relay.stop()
        shutil.rmtree(self.private.parent, ignore_errors=True)
        return done


class ControlGroupError(HvgpuError):
    """--control-group names a group that an untrusted user of the agent's is in."""

    code = "control-group-untrusted"


def check_group(group: str | None, executor_user) -> None:
    """Refuse a control group that contains the user executors (and the MPS server)
    run as (spawn.ExecutorUser): executors run what guests send and may be
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


def serve(api, path: str, group: str | None = None) -> ControlServer:
    """``api``: a ControlAPI, or Agent.commands' view of one (then each call runs on
    the agent's loop and is audited with its caller)."""
    relay: Relay | None = None

    def make(name):
        def handler(request, context):
            caller = relay.caller(context.peer()) if relay is not None else None
            if caller is None:  # not through the control socket: nobody vouches for it
                return {"ok": False, "code": "unidentified-caller",
                        "message": "control calls are taken on the control socket only"}
            who = f"{caller}, stating {_stated(context)}, on the control socket"
            target = api.as_caller(who) if hasattr(api, "as_caller") else api
            if isinstance(request, _Undecodable):
                return {"ok": False, "code": "bad-request",
                        "message": f"{name} takes a JSON object of named arguments; the "
                                   f"request is no JSON ({request})"}
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
        return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=_decode,
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
    public = listen(f"unix://{path}")  # removes a stale socket; refuses a live agent's
    # gRPC's own socket: in a directory of the agent's alone (0700), short enough for
    # a unix socket's path wherever the public one is.
    private = Path(tempfile.mkdtemp(prefix="hvgpu-control-")) / "grpc.sock"
    server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="control"),
                         handlers=[grpc.method_handlers_generic_handler(
                             SERVICE, {name: make(name) for name in METHODS})])

    def undo():
        server.stop(0)
        public.close()
        shutil.rmtree(private.parent, ignore_errors=True)

    with private_umask():
        try:
            bound = server.add_insecure_port(f"unix://{private}")
        except RuntimeError:  # newer gRPC raises where older ones returned 0
            bound = 0
        if not bound:
            undo()
            raise TransportError(f"cannot open the control server's socket {private}")
        server.start()
    try:
        if group:
            try:
                os.chown(path, -1, grp.getgrnam(group).gr_gid)
            except KeyError:
                raise HvgpuError(f"no group named {group!r} for the control socket") from None
            os.chmod(path, 0o660)
        else:
            os.chmod(path, 0o600)
    except BaseException:
        undo()
        raise
    relay = Relay(public, str(private))
    return ControlServer(server, relay, private)


class OutcomeUnknown(TransportError):
    """A change was sent to the agent, and no reply came: the agent may or may not have
    made it (it stopped, or did not answer in time, while working on it)."""

    code = "outcome-unknown"


# Calls that change something: when one goes unanswered, whether it took effect is unknown.
CHANGES = frozenset({"attach", "detach", "resize"})
CONNECT_TIMEOUT = 10.0  # seconds to reach the agent's control socket


class ControlClient:
    """Calls the agent over its control socket.

    It first connects to the socket itself (and closes that connection), so that a
    missing or refused socket ("no agent answers": nothing was asked) is told apart
    from a call the agent received and did not answer (:class:`OutcomeUnknown` for a
    change): gRPC gives both the same status, UNAVAILABLE. An agent that stops between
    the two is reported as the second: its outcome is then truly unknown here."""

    def __init__(self, path: str | None = None, timeout: float = 60.0):
        self.path = path or os.environ.get("HVGPU_CONTROL") or default_socket()
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{self.path}")

    def _unreachable(self) -> TransportError | None:
        """Why nothing answers on the socket, as the kernel says it when this client
        connects (before anything is sent); None when something accepts there."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(CONNECT_TIMEOUT)
            probe.connect(self.path)
            return None
        except FileNotFoundError:
            why = "there is no socket there"
        except ConnectionRefusedError:
            why = "nothing listens on it (an agent that stopped left it behind)"
        except PermissionError:
            why = "you may not open it: it is root's, or its --control-group's"
        except OSError as exc:
            why = exc.strerror or str(exc)
        finally:
            probe.close()
        return TransportError(f"no agent answers on {self.path} ({why}): is `hvgpu agent` "
                              "running, and may you open its control socket (root or its "
                              "group)? Nothing was asked of it")

    def call(self, name: str, **kwargs):
        unreachable = self._unreachable()
        if unreachable is not None:
            raise unreachable
        stub = self.channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=_encode,
                                        response_deserializer=json.loads)
        try:
            reply = stub({k: v for k, v in kwargs.items() if v is not None}, timeout=self.timeout,
                         metadata=((CALLER_KEY, _me()),))
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.CANCELLED):
                raise self._unanswered(name, kwargs, exc.code()) from None
            raise TransportError(f"control call {name} failed: {exc.details()}") from None
        if not reply["ok"]:
            raise HvgpuError(reply["message"], code=reply["code"])
        return reply["result"]

    def _unanswered(self, name: str, kwargs: dict, code) -> TransportError:
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            how = f"no reply came within {self.timeout:g} s"
        else:
            how = "the connection closed before its reply came (the agent stopped or restarted)"
        if name not in CHANGES:
            return TransportError(f"the agent on {self.path} took the {name} call, and {how}. "
                                  "Nothing was changed; ask again once it answers")
        vm = kwargs.get("vm")
        what = f"{name} {vm}" if vm else name
        return OutcomeUnknown(
            f"the agent on {self.path} received `{what}`, and {how}: whether it was done "
            f"is unknown. Once the agent answers again (systemctl status hvgpu-agent), "
            "`hvgpu list` and `hvgpu status` show what it holds; its log says what "
            "happened (journalctl -u hvgpu-agent)")

    def close(self) -> None:
        self.channel.close()


def _me() -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "?"
    return f"{name} (uid {uid}, pid {os.getpid()})"
