"""Telling systemd how the agent is doing: the sd_notify datagram protocol.

Under ``Type=notify`` systemd passes a unix datagram socket in
``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace) and waits
for ``READY=1`` before it counts the service as started; ``STOPPING=1`` says
the agent is shutting down and ``STATUS=...`` is the one line ``systemctl
status`` shows. Each message is one datagram of ``KEY=VALUE`` lines.

:func:`claim` takes the address out of the environment once, at the start of
``hvgpu agent`` (so that no child, the MPS daemon included, inherits it and
speaks for the agent); until then, and where systemd gave no socket,
:func:`notify` does nothing. This is the one socket outside
hvgpu/virtio/transport.py: it is systemd's, and carries no guest's data.

Must not fail the agent: a notification that cannot be sent is logged at
DEBUG and dropped.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV = "NOTIFY_SOCKET"
_address: bytes | None = None


def parse_address(value: str | None) -> bytes | None:
    """The socket address of ``$NOTIFY_SOCKET``: a path, or ``@name`` for an abstract
    one; ``None`` for nothing or a kind this module does not speak (``vsock:``)."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + os.fsencode(value[1:])
    if value.startswith("/"):
        return os.fsencode(value)
    log.debug("%s=%r: not a unix socket; systemd is not notified", ENV, value)
    return None


def claim(environ=None) -> bool:
    """Take the notify socket from the environment (removing it there); True when
    systemd waits for notifications."""
    global _address
    environ = os.environ if environ is None else environ
    _address = parse_address(environ.pop(ENV, None))
    return _address is not None


def release() -> None:
    """Forget the socket (tests, and an agent that has stopped)."""
    global _address
    _address = None


def _line(text: str) -> str:
    return " ".join(str(text).split())  # one line: a newline would start another field


def notify(*fields: str) -> bool:
    """Send ``fields`` (``KEY=VALUE`` strings) as one datagram; False when not sent."""
    if _address is None:
        return False
    data = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(data, _address)
    except OSError as exc:
        log.debug("could not notify systemd (%s): %s", fields, exc)
        return False
    return True


def ready(status: str) -> bool:
    return notify("READY=1", f"STATUS={_line(status)}")


def status(text: str) -> bool:
    return notify(f"STATUS={_line(text)}")


def stopping(text: str = "stopping: closing listeners and ending executors") -> bool:
    return notify("STOPPING=1", f"STATUS={_line(text)}")
