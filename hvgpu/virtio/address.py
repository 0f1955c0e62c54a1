"""Parse and print the addresses agents listen on and guests connect to.

    vsock://CID:PORT        virtio-vsock (CID "any" to listen on every CID,
                            "host" for CID 2, where a guest finds the agent)
    unix:///path            a unix stream socket
    hvsock:///path:PORT     Firecracker / Cloud Hypervisor hybrid vsock: guest
                            connections to PORT arrive on unix socket
                            ``/path_PORT``; a host-side connect sends
                            ``CONNECT PORT`` over ``/path``
    tcp://HOST:PORT         TCP, for remote use

Pure parsing: must not open sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvgpu.errors import AddressError
from hvgpu.virtio.protocol import DEFAULT_PORT, HOST_CID

VMADDR_CID_ANY = 0xFFFFFFFF
VMADDR_PORT_ANY = 0xFFFFFFFF  # bind's "any port": no one could connect to it
# Ports by scheme: TCP's are 16 bits; vsock's (and Firecracker's hybrid vsock's) 32.
MAX_PORT = {"tcp": 0xFFFF, "vsock": VMADDR_PORT_ANY - 1, "hvsock": VMADDR_PORT_ANY - 1}
FORMS = ("vsock://CID:PORT", "unix:///path", "hvsock:///path:PORT", "tcp://HOST:PORT")


@dataclass(frozen=True)
class Address:
    scheme: str
    path: str = ""
    host: str = ""
    cid: int = 0
    port: int = 0

    def __str__(self) -> str:
        if self.scheme == "vsock":
            cid = "any" if self.cid == VMADDR_CID_ANY else str(self.cid)
            return f"vsock://{cid}:{self.port}"
        if self.scheme == "unix":
            return f"unix://{self.path}"
        if self.scheme == "hvsock":
            return f"hvsock://{self.path}:{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    @property
    def hvsock_listen_path(self) -> str:
        """Where the VMM delivers guest connections to ``port``."""
        return f"{self.path}_{self.port}"


def _port(text: str, original: str, scheme: str) -> int:
    """A port of ``scheme``: 1..65535 for tcp, 1..2^32-2 for vsock and hvsock (0 and
    the any-port would listen where no one knows to connect)."""
    try:
        port = int(text)
    except ValueError:
        raise AddressError(f"{original!r}: port {text!r} is not a number") from None
    if not 0 < port <= MAX_PORT[scheme]:
        raise AddressError(f"{original!r}: port {port} is out of range: a {scheme} port is "
                           f"1 to {MAX_PORT[scheme]}")
    return port


def parse_address(text: str) -> Address:
    """Parse one of :data:`FORMS`; raise :class:`AddressError` naming them."""
    original = text
    scheme, sep, rest = text.partition("://")
    if not sep or not rest:
        raise AddressError(f"{original!r} is not an address; use one of: {', '.join(FORMS)}")
    scheme = scheme.lower()
    if scheme == "unix":
        if not rest.startswith("/"):
            raise AddressError(f"{original!r}: a unix socket path must be absolute "
                               "(unix:///run/hvgpu.sock)")
        return Address("unix", path=rest)
    if scheme == "hvsock":
        path, colon, port = rest.rpartition(":")
        if not colon or not path.startswith("/"):
            raise AddressError(f"{original!r}: expected hvsock:///path/to/vm.vsock:PORT")
        return Address("hvsock", path=path, port=_port(port, original, "hvsock"))
    if scheme == "vsock":
        cid_text, colon, port = rest.partition(":")
        cid_text = cid_text.lower()
        if cid_text in ("", "any", "-1"):
            cid = VMADDR_CID_ANY
        elif cid_text == "host":
            cid = HOST_CID
        else:
            try:
                cid = int(cid_text)
            except ValueError:
                raise AddressError(f"{original!r}: CID {cid_text!r} is not a number, "
                                   "'any' or 'host'") from None
        if not 0 <= cid <= VMADDR_CID_ANY:
            raise AddressError(f"{original!r}: CID {cid} is out of range: a CID is 0 to "
                               f"{VMADDR_CID_ANY} ('any'), 2 the host")
        return Address("vsock", cid=cid,
                       port=_port(port, original, "vsock") if colon else DEFAULT_PORT)
    if scheme == "tcp":
        if rest.startswith("["):
            host, bracket, tail = rest[1:].partition("]")
            if not bracket or not tail.startswith(":"):
                raise AddressError(f"{original!r}: expected tcp://[IPv6]:PORT")
            port = tail[1:]
        else:
            host, colon, port = rest.rpartition(":")
            if not colon:
                raise AddressError(f"{original!r}: expected tcp://HOST:PORT")
        if not host:
            raise AddressError(f"{original!r}: the host is missing")
        return Address("tcp", host=host, port=_port(port, original, "tcp"))
    raise AddressError(f"{original!r}: unknown scheme {scheme!r}; use one of: {', '.join(FORMS)}")
