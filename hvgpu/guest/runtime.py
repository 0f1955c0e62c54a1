"""The guest process's default connection to the agent.

Objects of the guest API use the default connection unless given one; it is
opened on first use from ``$HVGPU_AGENT`` (or vsock to the host). Must not
import ``hvgpu.host``.
"""

from __future__ import annotations

import threading

from hvgpu.guest.client import Connection

_lock = threading.Lock()
_default: Connection | None = None


def connect(address=None) -> Connection:
    """Open a connection and make it the default for this process."""
    global _default
    conn = Connection(address)
    with _lock:
        old, _default = _default, conn
    if old is not None:
        old.close()
    return conn


def default_connection() -> Connection:
    global _default
    with _lock:
        if _default is None or _default.closed:
            _default = Connection()
        return _default
