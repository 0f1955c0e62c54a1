"""The executor's end of the executor lane (hvgpu.host.executor.lane).

A slice's executor receives guest connections and orders (retire) from the
agent, and asks the agent to reserve and release memory in the slice's quota
ledger. Every message is encoded and checked by the lane's table. Must not
serve guests itself (sessions do).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading

from hvgpu.errors import CudaError
from hvgpu.host.executor import lane
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import receive_message, send_message

log = logging.getLogger("hvgpu.executor")

REPLY_TIMEOUT = 30.0  # the agent answers at once; longer means it is gone or stuck


class AgentLink:
    def __init__(self, sock):
        self.sock = sock
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}

    def send(self, message: lane.Message, /, **fields) -> None:
        data = lane.encode(message, **fields)
        with self._send_lock:
            send_message(self.sock, data)

    def request(self, message: lane.Message, /, **fields) -> dict:
        """Send and wait for the agent's reply (delivered by the main loop)."""
        rid = next(self._ids)
        slot = [threading.Event(), None]
        self._waiting[rid] = slot
        self.send(message, id=rid, **fields)
        if not slot[0].wait(REPLY_TIMEOUT) and self._waiting.pop(rid, None) is not None:
            raise CudaError(P.HV_INTERNAL, "the agent did not answer a quota request")
        slot[0].wait()  # the answer came as time ran out: it is being handed over
        return slot[1]  # (REGION's carries a descriptor, which must not be dropped)

    def receive(self) -> tuple[lane.Message | None, dict, list[int]]:
        """The agent's next message; (None, {}, []) when the channel ended or the
        agent sent what the lane does not allow (then this executor ends)."""
        data, fds = receive_message(self.sock)
        if not data:
            for fd in fds:
                os.close(fd)
            return None, {}, []
        try:
            message, fields = lane.decode(data, len(fds), lane.TO_EXECUTOR)
        except lane.LaneError as exc:
            log.error("the agent sent a message this executor does not understand (%s); "
                      "ending", exc)
            for fd in fds:
                os.close(fd)
            return None, {}, []
        return message, fields, fds

    def region(self) -> tuple[int, int]:
        """(fd, size) of the VM's shared-memory device region, opened by the agent."""
        reply = self.request(lane.REGION)
        fd = reply.get("fd")
        if fd is None:
            raise CudaError(reply.get("status", P.HV_INTERNAL), reply.get("message", ""))
        return fd, reply["size"]

    def deliver(self, fields: dict) -> None:
        slot = self._waiting.pop(fields["id"], None)
        if slot is not None:
            slot[1] = fields
            slot[0].set()
        elif "fd" in fields:  # nobody waits for it any more
            os.close(fields["fd"])

    def fail_all(self) -> None:
        for slot in list(self._waiting.values()):
            slot[1] = {"ok": False, "status": P.HV_INTERNAL, "message": "the agent went away"}
            slot[0].set()
        self._waiting.clear()


class RemoteQuota:
    """What the agent keeps for this slice: its quota ledger, and its VM's vGPU count."""

    def __init__(self, link: AgentLink):
        self.link = link

    def reserve(self, n: int) -> None:
        if n > lane.MAX_BYTES:  # the lane carries no such size: no GPU has it
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"{n} bytes is more than any GPU has")
        reply = self.link.request(lane.RESERVE, n=n)
        if not reply.get("ok"):
            raise CudaError(reply.get("status", P.CUDA_ERROR_OUT_OF_MEMORY),
                            reply.get("message", ""))

    def release(self, n: int) -> None:
        self.link.send(lane.RELEASE, n=n)

    def usage(self) -> tuple[int, int]:
        reply = self.link.request(lane.USAGE)
        if "used" not in reply:
            raise CudaError(reply.get("status", P.HV_INTERNAL), reply.get("message", ""))
        return reply["used"], reply["limit"]

    def utilization(self) -> int | None:
        """The slice's GPU utilisation in percent, as the agent last measured it; None
        where it does not know (its USAGE reply has no util)."""
        reply = self.link.request(lane.USAGE)
        if "used" not in reply:
            raise CudaError(reply.get("status", P.HV_INTERNAL), reply.get("message", ""))
        return reply.get("util")

    def vgpus(self) -> int:
        """How many vGPUs the slice's VM has now."""
        return self.link.request(lane.VGPUS).get("count", 1)
