"""Sockets for the data lane: listen, accept with the peer's identity, connect.

The only module in hvgpu that creates sockets. A peer's identity comes from
the transport itself (the vsock CID that ``accept`` reports, the unix peer
credentials, the hybrid-vsock socket a VMM delivered it on), never from
anything the peer says. Must not know the protocol above framing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct

from hvgpu.errors import TransportError
from hvgpu.virtio.address import Address, parse_address

# Large kernel buffers keep bulk copies streaming. The *FORCE options pass
# net.core.{w,r}mem_max and need CAP_NET_ADMIN (the agent runs as root);
# elsewhere the plain options apply, capped by the kernel.
_BUFSIZE = 8 << 20
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33


def _tune(sock: socket.socket) -> socket.socket:
    for force, plain in ((_SO_SNDBUFFORCE, socket.SO_SNDBUF), (_SO_RCVBUFFORCE, socket.SO_RCVBUF)):
        for opt in (force, plain):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, _BUFSIZE)
                break
            except OSError:
                continue
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    elif sock.family == getattr(socket, "AF_VSOCK", None):
        # virtio-vsock credits the peer with this much; the default is 256 KiB.
        for opt in ("SO_VM_SOCKETS_BUFFER_MAX_SIZE", "SO_VM_SOCKETS_BUFFER_SIZE"):
            try:
                sock.setsockopt(socket.AF_VSOCK, getattr(socket, opt), _BUFSIZE)
            except (AttributeError, OSError):
                pass
    return sock


def vsock_available() -> bool:
    """True when this kernel can create AF_VSOCK sockets."""
    family = getattr(socket, "AF_VSOCK", None)
    if family is None:
        return False
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


class Listener:
    """A listening socket that knows how to name the peers it accepts."""

    def __init__(self, address: Address, sock: socket.socket, unlink: str | None = None):
        self.address = address
        self.sock = sock
        self._unlink = unlink

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> tuple[socket.socket, str]:
        conn, peer = self.sock.accept()
        _tune(conn)
        scheme = self.address.scheme
        if scheme == "vsock":
            return conn, f"vsock:{peer[0]}"
        if scheme == "tcp":
            return conn, f"tcp:{peer[0]}:{peer[1]}"
        if scheme == "hvsock":
            # One socket per VM: the VMM that delivered it names the VM.
            return conn, f"hvsock:{self.address.path}"
        pid, uid, _gid = peer_credentials(conn)
        return conn, f"unix:uid={uid},pid={pid}"

    def close(self) -> None:
        self.sock.close()
        if self._unlink:
            try:
                os.unlink(self._unlink)
            except FileNotFoundError:
                pass


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a unix socket's peer, as the kernel recorded them when it
    connected (SO_PEERCRED): what it is, not what it says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def connect_autobound(path: str, timeout: float = 5.0) -> tuple[socket.socket, str]:
    """A unix stream connection to ``path`` from a socket the kernel names itself
    (Linux's autobind: a unique name in the abstract namespace), and that name
    without its leading NUL: the server sees it as this end's address."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind("")  # an empty address: the kernel picks a unique abstract name
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    name = sock.getsockname()  # Python gives an abstract name as bytes, NUL first
    return sock, name[1:].decode("ascii") if isinstance(name, bytes) else name.lstrip("\0")


@contextlib.contextmanager
def private_umask():
    """Sockets bound inside are 0600 at birth, whatever the process's umask was: a
    chmod afterwards would leave a moment when anyone could connect."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def claim_unix_path(path: str) -> None:
    """Remove a stale socket left by a dead agent; refuse to steal a live one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise TransportError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise TransportError(f"another process is already listening on {path}")


def listen(address: Address | str, backlog: int = 128) -> Listener:
    if isinstance(address, str):
        address = parse_address(address)
    try:
        if address.scheme in ("unix", "hvsock"):
            path = address.path if address.scheme == "unix" else address.hvsock_listen_path
            claim_unix_path(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with private_umask():
                sock.bind(path)
            sock.listen(backlog)
            return Listener(address, sock, unlink=path)
        if address.scheme == "vsock":
            if not vsock_available():
                raise TransportError("this kernel has no AF_VSOCK support (load the "
                                     "vhost_vsock module on a KVM host)")
            sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
            sock.bind((address.cid, address.port))
            sock.listen(backlog)
            return Listener(address, sock)
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        return Listener(address, sock)
    except OSError as exc:
        raise TransportError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def listen_tcp(host: str, port: int, backlog: int = 64) -> socket.socket:
    """A plain, non-blocking TCP listening socket on ``host`` (a name, an IPv4 or IPv6
    address) and ``port`` (0: any free one), for servers that are not the data lane
    (the metrics endpoint): no large buffers, no Nagle tuning. Raises OSError."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(address: Address | str, timeout: float | None = 10.0) -> socket.socket:
    """Open a stream to ``address``; blocking mode once connected."""
    if isinstance(address, str):
        address = parse_address(address)
    try:
        if address.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(address.path)
        elif address.scheme == "hvsock":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(address.path)
            _hvsock_handshake(sock, address)
        elif address.scheme == "vsock":
            if not vsock_available():
                raise TransportError("this kernel has no AF_VSOCK support: is this a VM "
                                     "with a virtio-vsock device (hvgpu attach adds one)?")
            sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect((address.cid, address.port))
        else:
            sock = socket.create_connection((address.host, address.port), timeout=timeout)
    except OSError as exc:
        hint = ""
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ECONNRESET):
            hint = ": is the hvgpu agent running and listening there?"
        raise TransportError(f"cannot connect to {address}: {exc.strerror or exc}{hint}",
                             code="connect-timeout" if isinstance(exc, TimeoutError)
                             else None) from None
    sock.settimeout(None)
    return _tune(sock)


def _hvsock_handshake(sock: socket.socket, address: Address) -> None:
    line = b""
    try:
        sock.sendall(f"CONNECT {address.port}\n".encode())
        while not line.endswith(b"\n") and len(line) <= 64:
            chunk = sock.recv(1)
            if not chunk:
                break
            line += chunk
    except OSError:
        pass
    if not line.endswith(b"\n"):
        raise TransportError(f"{address}: the VMM closed the hybrid-vsock handshake "
                             f"(nothing listens on port {address.port} in the guest?)")
    if not line.startswith(b"OK "):
        raise TransportError(f"{address}: hybrid-vsock handshake refused: "
                             f"{line.decode(errors='replace').strip()!r}")


def adopt(fd: int) -> socket.socket:
    """Wrap a connected stream socket inherited from the agent (executor side)."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    return _tune(sock)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def control_pair() -> tuple[socket.socket, socket.socket]:
    """A message-preserving pair for the agent-executor control channel."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def adopt_control(fd: int) -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd)


def send_message(sock: socket.socket, data: bytes, fds=()) -> None:
    """One control message, optionally carrying file descriptors (SCM_RIGHTS)."""
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def send_with_fds(sock: socket.socket, data: bytes, fds) -> None:
    """A frame on a stream socket whose first byte carries ``fds`` (SCM_RIGHTS)."""
    sent = socket.send_fds(sock, [data], list(fds))
    if sent < len(data):
        sock.sendall(data[sent:])


def receive_message(sock: socket.socket, maxfds: int = 1) -> tuple[bytes, list[int]]:
    """(b"", []) when the other end has closed."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, maxfds)
    except (ConnectionResetError, OSError):
        return b"", []
    return data, fds
