"""The executor's end of the executor lane (hvgpu.host.executor.messages).

A slice's executor receives guest connections and orders (retire) from the
agent, asks the agent to reserve and release memory in the slice's quota
ledger, and reports what its guests did (STATS: the agent's metrics). Every
message is encoded and checked by the lane's table. Must not serve guests
itself (sessions do), and never makes a session's thread wait for a report.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading

from hvgpu.errors import CudaError
from hvgpu.host.executor import messages
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import receive_message, send_message

log = logging.getLogger("hvgpu.executor")

REPLY_TIMEOUT = 30.0  # the agent answers at once; longer means it is gone or stuck
STATS_EVERY = 2.0  # seconds between reports while the counts change
_COUNTERS = ("launches", "round_trips", "to_gpu", "from_gpu")


class AgentLink:
    def __init__(self, sock):
        self.sock = sock
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}

    def send(self, message: messages.Message, /, **fields) -> None:
        data = messages.encode(message, **fields)
        with self._send_lock:
            send_message(self.sock, data)

    def request(self, message: messages.Message, /, **fields) -> dict:
        """Send and wait for the agent's reply (delivered by the main loop)."""
        rid = next(self._ids)
        slot = [threading.Event(), None]
        self._waiting[rid] = slot
        self.send(message, id=rid, **fields)
        if not slot[0].wait(REPLY_TIMEOUT) and self._waiting.pop(rid, None) is not None:
            raise CudaError(P.HV_INTERNAL, "the agent did not answer a quota request")
        slot[0].wait()  # the answer came as time ran out: it is being handed over
        return slot[1]  # (REGION's carries a descriptor, which must not be dropped)

    def receive(self) -> tuple[messages.Message | None, dict, list[int]]:
        """The agent's next message; (None, {}, []) when the channel ended or the
        agent sent what the lane does not allow (then this executor ends)."""
        data, fds = receive_message(self.sock)
        if not data:
            for fd in fds:
                os.close(fd)
            return None, {}, []
        try:
            message, fields = messages.decode(data, len(fds), messages.TO_EXECUTOR)
        except messages.LaneError as exc:
            log.error("the agent sent a message this executor does not understand (%s); "
                      "ending", exc)
            for fd in fds:
                os.close(fd)
            return None, {}, []
        return message, fields, fds

    def region(self) -> tuple[int, int]:
        """(fd, size) of the VM's region device region, opened by the agent."""
        reply = self.request(messages.REGION)
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
        if n > messages.MAX_BYTES:  # the lane carries no such size: no GPU has it
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"{n} bytes is more than any GPU has")
        reply = self.link.request(messages.RESERVE, n=n)
        if not reply.get("ok"):
            raise CudaError(reply.get("status", P.CUDA_ERROR_OUT_OF_MEMORY),
                            reply.get("message", ""))

    def release(self, n: int) -> None:
        self.link.send(messages.RELEASE, n=n)

    def usage(self) -> tuple[int, int]:
        reply = self.link.request(messages.USAGE)
        if "used" not in reply:
            raise CudaError(reply.get("status", P.HV_INTERNAL), reply.get("message", ""))
        return reply["used"], reply["limit"]

    def utilization(self) -> int | None:
        """The slice's GPU utilisation in percent, as the agent last measured it; None
        where it does not know (its USAGE reply has no util)."""
        reply = self.link.request(messages.USAGE)
        if "used" not in reply:
            raise CudaError(reply.get("status", P.HV_INTERNAL), reply.get("message", ""))
        return reply.get("util")

    def vgpus(self) -> int:
        """How many vGPUs the slice's VM has now."""
        return self.link.request(messages.VGPUS).get("count", 1)


class Stats:
    """Totals of this executor's guests since it started (sessions that ended, plus
    those still serving), sent to the agent by a thread of their own every
    :data:`STATS_EVERY` seconds while they change, and once more at exit. The agent
    adds up what each executor reports, so its counters outlive any executor."""

    def __init__(self, link: AgentLink, every: float = STATS_EVERY):
        self.link, self.every = link, every
        self._lock = threading.Lock()  # the sessions' set and what ended
        self._send_lock = threading.Lock()  # one report at a time, in order
        self._live: set = set()
        self._ended = dict.fromkeys(_COUNTERS, 0)
        self._ended_errors: dict[int, int] = {}
        self._sent: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, session) -> None:
        with self._lock:
            self._live.add(session)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hvgpu-stats",
                                                daemon=True)
                self._thread.start()

    def ended(self, session) -> None:
        """The session closed: its final counts join the totals."""
        counts = session.stats()
        with self._lock:
            if session not in self._live:
                return
            self._live.discard(session)
            _add(self._ended, self._ended_errors, counts)

    def totals(self) -> dict:
        with self._lock:
            live = list(self._live)
            totals, errors = dict(self._ended), dict(self._ended_errors)
        for session in live:
            _add(totals, errors, session.stats())
        return {**{k: min(v, messages.MAX_COUNT) for k, v in totals.items()},
                "errors": _commonest(errors)}

    def send(self) -> None:
        """A report, if anything changed since the last one."""
        with self._send_lock:
            totals = self.totals()
            if totals == self._sent:
                return
            try:
                self.link.send(messages.STATS, **totals)
            except OSError:  # the agent is gone or going: nobody to tell
                return
            self._sent = totals

    def close(self) -> None:
        """The last report (the executor is ending)."""
        self._stop.set()
        self.send()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.send()
            except Exception:  # a report lost is a metric late, never a guest's failure
                log.debug("reporting stats failed", exc_info=True)


def _add(totals: dict, errors: dict, counts: dict) -> None:
    for k in _COUNTERS:
        totals[k] += counts[k]
    for status, n in counts["errors"].items():
        errors[status] = errors.get(status, 0) + n


def _commonest(errors: dict[int, int]) -> dict[str, int]:
    """Counts by status as the lane carries them: statuses it can name, the commonest
    if there are more than a report holds."""
    named = [(n, s) for s, n in errors.items() if 0 < s <= messages.MAX_STATUS and n > 0]
    named.sort(reverse=True)
    return {str(s): min(n, messages.MAX_COUNT) for n, s in named[:messages.STATS_STATUSES_MAX]}
