"""The executor's end of its control channel to the agent.

A slice's executor receives guest connections (their sockets passed with
SCM_RIGHTS) and orders (retire) from the agent, and asks the agent to
reserve and release memory in the slice's quota ledger. Messages are JSON,
one per SOCK_SEQPACKET datagram. Must not serve guests itself (sessions do).
"""

from __future__ import annotations

import itertools
import json
import threading

from hvgpu.errors import CudaError
from hvgpu.virtio.transport import receive_message, send_message


class AgentLink:
    def __init__(self, sock):
        self.sock = sock
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}

    def send(self, msg: dict) -> None:
        with self._send_lock:
            send_message(self.sock, json.dumps(msg).encode())

    def request(self, msg: dict) -> dict:
        """Send and wait for the agent's reply (delivered by the main loop)."""
        rid = next(self._ids)
        slot = [threading.Event(), None]
        self._waiting[rid] = slot
        self.send(dict(msg, id=rid))
        if not slot[0].wait(30):
            self._waiting.pop(rid, None)
            raise CudaError(10006, "the agent did not answer a quota request")
        return slot[1]

    def receive(self) -> tuple[dict | None, list[int]]:
        data, fds = receive_message(self.sock)
        if not data:
            return None, fds
        return json.loads(data), fds

    def deliver(self, msg: dict) -> None:
        slot = self._waiting.pop(msg.get("id"), None)
        if slot is not None:
            slot[1] = msg
            slot[0].set()

    def fail_all(self) -> None:
        for slot in list(self._waiting.values()):
            slot[1] = {"ok": False, "status": 10006, "message": "the agent went away"}
            slot[0].set()
        self._waiting.clear()


class RemoteQuota:
    """What the agent keeps for this slice: its quota ledger, and its VM's vGPU count."""

    def __init__(self, link: AgentLink):
        self.link = link

    def reserve(self, n: int) -> None:
        reply = self.link.request({"op": "reserve", "n": n})
        if not reply.get("ok"):
            raise CudaError(reply.get("status", 2), reply.get("message", ""))

    def release(self, n: int) -> None:
        self.link.send({"op": "release", "n": n})

    def usage(self) -> tuple[int, int]:
        reply = self.link.request({"op": "usage"})
        return reply["used"], reply["limit"]

    def vgpus(self) -> int:
        """How many vGPUs the slice's VM has now."""
        return int(self.link.request({"op": "vgpus"}).get("count", 1))
