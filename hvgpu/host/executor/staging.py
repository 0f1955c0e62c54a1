"""Pinned staging ring for bulk copies between a socket and device memory.

Host-to-device: payload bytes are received straight into a page-locked slot
and copied to the device asynchronously on the guest's stream, while the next
slot is being received. Device-to-host: copies into several slots are queued
ahead, and each slot is sent as soon as its copy is done. A slot is reused
only after the event recorded behind its last copy has completed.

Must not parse frames or validate guest addresses (the session does both).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

SLOT_SIZE = 8 << 20
SLOTS = 4


class _Slot:
    __slots__ = ("addr", "view", "event", "busy")

    def __init__(self, addr: int, view: memoryview, event: Any):
        self.addr, self.view, self.event, self.busy = addr, view, event, False


class StagingRing:
    def __init__(self, device, slot_size: int = SLOT_SIZE, slots: int = SLOTS):
        self.device = device
        self.slot_size = slot_size
        self.slots: list[_Slot] = []
        self.next = 0
        for _ in range(slots):
            addr, view = device.host_alloc(slot_size)
            self.slots.append(_Slot(addr, view, device.event_create(0x2)))  # disable timing

    def _take(self) -> _Slot:
        slot = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        if slot.busy:
            self.device.event_synchronize(slot.event)
            slot.busy = False
        return slot

    def upload(self, read_into: Callable[[memoryview], None], dst: int, n: int, stream: Any) -> None:
        """Receive ``n`` bytes through ``read_into`` and copy them to ``dst``."""
        off = 0
        while off < n:
            k = min(self.slot_size, n - off)
            slot = self._take()
            read_into(slot.view[:k])
            self.device.memcpy_htod_async(dst + off, slot.addr, k, stream)
            self.device.event_record(slot.event, stream)
            slot.busy = True
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

        def enqueue():
            nonlocal off
            k = min(self.slot_size, n - off)
            slot = self._take()
            self.device.memcpy_dtoh_async(slot.addr, src + off, k, stream)
            self.device.event_record(slot.event, stream)
            slot.busy = True
            queued.append((slot, k))
            off += k

        while off < n and len(queued) < len(self.slots):
            enqueue()
        first = True
        while queued:
            slot, k = queued.popleft()
            self.device.event_synchronize(slot.event)
            slot.busy = False
            if first:
                start()
                first = False
            send(slot.view[:k])
            if off < n:
                enqueue()
        if first:
            start()

    def close(self) -> None:
        for slot in self.slots:
            try:
                if slot.busy:
                    self.device.event_synchronize(slot.event)
                self.device.event_destroy(slot.event)
                self.device.host_free(slot.addr)
            except Exception:  # the context may already be gone; the process exits next
                pass
        self.slots = []
