"""The guest process's default connections to the agent, one per vGPU.

Objects of the guest API use device 0's default connection unless given one
(or a ``Device(N)``); each is opened on first use from ``$HVGPU_AGENT`` (or
vsock to the host; see ``client.default_address``). A default connection
that was lost (``AgentLost``) or closed is replaced by a new one on its next
use; objects made on the old one (buffers, modules, streams) went with it and
keep raising ``AgentLost``. Must not import ``hvgpu.host``.
"""

from __future__ import annotations

import threading

from hvgpu.guest.client import Connection, default_address

_lock = threading.Lock()
_defaults: dict[int, Connection] = {}


def connect(address=None, device: int = 0) -> Connection:
    """Open a connection and make it the default for ``device`` in this process."""
    conn = Connection(address if address is not None else default_address(device))
    with _lock:
        old, _defaults[device] = _defaults.get(device), conn
    if old is not None:
        old.close()
    return conn


def default_connection(device: int = 0) -> Connection:
    with _lock:
        conn = _defaults.get(device)
        if conn is None or conn.closed:
            conn = _defaults[device] = Connection(default_address(device))
        return conn


def device_count() -> int:
    """How many vGPUs this VM has (cudaGetDeviceCount)."""
    return default_connection(0).call("DEVICE_GET_COUNT")[0]
