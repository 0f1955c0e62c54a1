"""Pinned staging for bulk copies between guest sockets and device memory.

One :class:`StagingPool` per executor process: a few page-locked slots, lent
to a copy a slot at a time and given back, so the pinned memory an executor
holds is bounded however many connections copy at once (a copy waits for a
free slot rather than pinning more). Host-to-device: payload bytes are
received straight into a slot and copied to the device asynchronously on the
guest's stream while the next slot is being received. Device-to-host: copies
into the slots a copy holds are queued ahead, and each slot is sent as soon as
its copy is done. A slot is reused only after the event recorded behind its
last copy has completed.

A copy waits for a slot only while it holds none, so copies cannot deadlock
each other. Small host-to-device copies that the sessions' C loops serve are
staged in one slot taken out of the pool for good on first use
(:meth:`StagingPool.copy_ring`): a ring of segments, each with its event, so
the pinned memory an executor holds stays within the pool's. Must not parse
frames or validate guest addresses (the session does both).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

SLOT_SIZE = 8 << 20
SLOTS = 4  # per executor process: 32 MiB pinned at most
RING_SEGMENT = 64 << 10  # the largest copy a C loop stages (it must fit one segment)
_NO_TIMING = 0x2  # CU_EVENT_DISABLE_TIMING

log = logging.getLogger(__name__)


class _Slot:
    __slots__ = ("addr", "view", "event", "busy")

    def __init__(self, addr: int, view: memoryview, event: Any):
        self.addr, self.view, self.event, self.busy = addr, view, event, False


class StagingPool:
    """At most ``slots`` pinned slots of ``slot_size`` bytes, pinned on first use."""

    def __init__(self, device, slot_size: int = SLOT_SIZE, slots: int = SLOTS):
        self.device = device
        self.slot_size = slot_size
        self.limit = slots
        self.pinned = 0  # slots allocated so far
        self.idle: deque[_Slot] = deque()  # given back, oldest first
        self.cond = threading.Condition()
        self.closed = False
        self.ring_lock = threading.Lock()
        self.ring = None  # (CopyRing, its slot, its segments' events) once made
        self.ring_error = ""  # why it cannot be made, once that is known

    def _take(self, wait: bool = True) -> _Slot | None:
        with self.cond:
            while True:
                if self.closed:
                    raise CudaError(P.HV_INTERNAL, "the executor is shutting down")
                ready = next((s for s in self.idle if not s.busy), None)
                if ready is not None:
                    self.idle.remove(ready)
                    return ready
                if self.pinned < self.limit:
                    self.pinned += 1
                    slot = None
                    break
                if self.idle:  # every slot is still copying: the oldest finishes first
                    slot = self.idle.popleft()
                    break
                if not wait:
                    return None
                self.cond.wait()
        if slot is None:
            return self._new_slot()
        try:
            self.device.event_synchronize(slot.event)
        except CudaError as exc:  # the last borrower's copy failed; that copy reported it
            log.debug("staging slot's last copy failed: %s", exc)
        slot.busy = False
        return slot

    def _new_slot(self) -> _Slot:
        try:
            addr, view = self.device.host_alloc(self.slot_size)
        except BaseException:
            with self.cond:
                self.pinned -= 1
                self.cond.notify()
            raise
        try:
            return _Slot(addr, view, self.device.event_create(_NO_TIMING))
        except BaseException:
            self.device.host_free(addr)
            with self.cond:
                self.pinned -= 1
                self.cond.notify()
            raise

    def _give(self, slot: _Slot) -> None:
        with self.cond:
            self.idle.append(slot)
            self.cond.notify()

    def upload(self, read_into: Callable[[memoryview], None], dst: int, n: int, stream: Any) -> None:
        """Receive ``n`` bytes through ``read_into`` and copy them to ``dst``."""
        off = 0
        while off < n:
            k = min(self.slot_size, n - off)
            slot = self._take()
            try:
                read_into(slot.view[:k])
                self.device.memcpy_htod_async(dst + off, slot.addr, k, stream)
                slot.busy = True
                self.device.event_record(slot.event, stream)
            finally:
                self._give(slot)
            off += k

    def download(self, src: int, n: int, stream: Any, start: Callable[[], None],
                 send: Callable[[memoryview], None]) -> None:
        """Copy ``n`` bytes from ``src`` and pass them to ``send`` in order.

        ``start`` runs once the first chunk has arrived, i.e. after any error
        of the stream's earlier work has shown itself, and before any bytes are
        sent, so the caller can still answer with an error instead.
        """
        queued: deque = deque()
        off = 0

        def enqueue(slot: _Slot) -> None:
            nonlocal off
            k = min(self.slot_size, n - off)
            queued.append((slot, k))
            self.device.memcpy_dtoh_async(slot.addr, src + off, k, stream)
            slot.busy = True
            self.device.event_record(slot.event, stream)
            off += k

        try:
            if off < n:
                enqueue(self._take())
            while off < n and len(queued) < self.limit:
                extra = self._take(wait=False)
                if extra is None:
                    break
                enqueue(extra)
            first = True
            while queued:
                slot, k = queued[0]
                self.device.event_synchronize(slot.event)
                slot.busy = False
                queued.popleft()
                if first:
                    first = False
                    start()
                try:
                    send(slot.view[:k])
                except BaseException:
                    self._give(slot)
                    raise
                if off < n:
                    enqueue(slot)
                else:
                    self._give(slot)
            if first:
                start()
        finally:
            for slot, _ in queued:
                self._give(slot)

    def copy_ring(self):
        """The ring the C loops stage small copies in (a ``launch_burst.CopyRing``),
        made from one slot on first use; None where it cannot be had."""
        with self.ring_lock:
            if self.ring is None and not self.ring_error:
                try:
                    self.ring = self._make_ring()
                except (CudaError, OSError, MemoryError, ValueError) as exc:
                    self.ring_error = str(exc)
                    log.info("small copies go through the staging slots: %s", exc)
            return self.ring[0] if self.ring is not None else None

    def _make_ring(self):
        from hvgpu.host.executor.launch_burst import CopyRing  # a C library, loaded on use
        slot = self._take()
        events = []
        try:
            for _ in range(self.slot_size // RING_SEGMENT):
                events.append(self.device.event_create(_NO_TIMING))
            ring = CopyRing(slot.addr, self.slot_size, RING_SEGMENT,
                            [self.device.handle_value(e) for e in events])
        except BaseException:
            for event in events:
                self.device.event_destroy(event)
            self._give(slot)
            raise
        return ring, slot, events

    def close(self) -> None:
        """Free every slot; copies still running get an error."""
        with self.cond:
            self.closed = True
            slots, self.idle = list(self.idle), deque()
            self.cond.notify_all()
        with self.ring_lock:
            ring, self.ring = self.ring, None
        if ring is not None:
            if ring[0].close():
                slots.append(ring[1])
            else:  # a loop is still inside it; the process is ending: leave it be
                log.warning("a session's C loop still holds the copy ring at close")
                ring = None
        if slots:
            try:
                self.device.bind_thread()  # closed by whichever thread ends the executor
            except Exception:
                pass
        for event in ring[2] if ring is not None else ():
            try:
                self.device.event_synchronize(event)  # its segment's last copies
                self.device.event_destroy(event)
            except Exception:
                pass
        for slot in slots:
            try:
                if slot.busy:
                    self.device.event_synchronize(slot.event)
                self.device.event_destroy(slot.event)
                self.device.host_free(slot.addr)
            except Exception:  # the context may already be gone; the process exits next
                pass
