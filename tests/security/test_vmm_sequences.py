"""Random sequences of virtual memory and pool calls, from fixed seeds: whatever order
a guest makes them in, the device never holds more for it than the ledger charges,
the ledger never passes the quota, no call ends the session, the C loop of one-way
frames answers every frame as the Python path alone does, and a disconnect leaves
nothing behind.

The calls aim at what the guest holds or held (its reservations, handles, mappings,
pools, allocations and streams) with sizes and offsets around them, so that most of
them reach deep into the bookkeeping rather than being refused at once.
"""

from __future__ import annotations

import random
import struct

import pytest

from hvgpu.host.executor.launch_burst import unavailable_reason
from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest
from tests.security.test_accounting import Ledger

M = 1 << 20
G = 2 * M  # the test double's granularity
QUOTA = 32 * M
ACCESS = [struct.pack("<iiI", 1, 0, flags) for flags in (3, 3, 0, 1)]  # RW twice as often
MAX = (1 << 64) - 1
STEPS = 400


class PythonOnly(FakeDevice):
    def driver_entries(self):
        return {}


class Guest:
    """One connection making random calls at what it holds."""

    def __init__(self, device, seed):
        self.rng = random.Random(seed)
        self.device, self.ledger = device, Ledger(QUOTA)
        self.g = SessionGuest(device, self.ledger)
        self.vas, self.handles, self.maps, self.ptrs = [], [], [], []
        self.ever_mapped = []  # what the guest mapped, unmapped since or not
        self.pools, self.streams = [0], [0]

    def pick(self, items, fallback=12345):
        return self.rng.choice(items) if items else fallback

    def span(self):
        """A mapping, or a run of neighbouring ones, as the guest may name them."""
        start, size = self.pick(self.maps, (0, G))
        if self.rng.random() < 0.3:
            other, other_size = self.pick(self.maps, (0, G))
            size = max(size, other + other_size - start)
        return start, size

    def call(self, op, *values):
        status, reply = self.g.call(op, *values)
        return None if status else reply[0]

    def step(self):
        rng, g = self.rng, self.g
        choice = rng.randrange(22)
        if choice == 0:
            va = self.call("MEM_ADDRESS_RESERVE", rng.choice([4, 8, 16]) * G,
                           rng.choice([0, G, 4 * G]), 0, 0)
            if va is not None:
                self.vas.append(va)
        elif choice == 1:
            g.call("MEM_ADDRESS_FREE", self.pick(self.vas), rng.choice([4, 8, 16]) * G)
        elif choice == 2:
            handle = self.call("MEM_CREATE", rng.choice([1, 2, 4]) * G, 1, 0, 1, 0, 0)
            if handle is not None:
                self.handles.append(handle)
        elif choice == 3:
            g.call("MEM_RELEASE", self.pick(self.handles))
        elif choice in (4, 5):
            start = self.pick(self.vas, 0) + rng.choice([0, 0, G, 2 * G, 4096])
            size = rng.choice([G, G, 2 * G, 4 * G])
            if g.call("MEM_MAP", start, size, rng.choice([0, 0, G]), self.pick(self.handles),
                      0)[0] == 0:
                self.maps.append((start, size))
                self.ever_mapped.append((start, size))
        elif choice == 6:
            start, size = self.span()
            if g.call("MEM_UNMAP", start, size)[0] == 0:
                self.maps = [m for m in self.maps if not start <= m[0] < start + size]
        elif choice == 7:
            g.call("MEM_SET_ACCESS", *self.span(), rng.choice(ACCESS))
        elif choice == 8:
            handle = self.call("MEM_RETAIN_HANDLE", self.pick(self.vas, 0) + rng.randrange(4 * G))
            if handle is not None:
                self.handles.append(handle)
        elif choice == 9:
            pool = self.call("MEM_POOL_CREATE", 1, 0, 1, 0, rng.choice([0, 0, 4 * M]), 0)
            if pool is not None:
                self.pools.append(pool)
        elif choice == 10:
            g.call("MEM_POOL_DESTROY", self.pick(self.pools))
        elif choice in (11, 12):
            ptr = self.call("MEM_ALLOC_ASYNC", rng.choice([100, 4096, M, 3 * M, 5 * M]),
                            self.pick(self.pools), self.pick(self.streams))
            if ptr is not None:
                self.ptrs.append(ptr)
        elif choice == 13:
            g.send(g.oneway("MEM_FREE_ASYNC", self.pick(self.ptrs), self.pick(self.streams)))
        elif choice == 14:
            g.call("MEM_POOL_SET_ATTRIBUTE", self.pick(self.pools), rng.choice([4, 4, 1, 6]),
                   rng.choice([0, 1, 4 * M, MAX]))
        elif choice == 15:
            g.call("MEM_POOL_TRIM_TO", self.pick(self.pools), rng.choice([0, 4 * M, MAX]))
        elif choice == 16:
            g.call(rng.choice(["CTX_SYNCHRONIZE", "MEM_GET_INFO"]))
        elif choice == 17:
            stream = self.call("STREAM_CREATE", 1)
            if stream is not None:
                self.streams.append(stream)
        elif choice == 18:
            g.call("STREAM_DESTROY", self.pick(self.streams[1:]))
        else:  # one-way writes into what it mapped or allocated, held still or not
            start, size = self.pick(self.ever_mapped + [(p, 4096) for p in self.ptrs],
                                    (0, 64))
            at = start + rng.randrange(size)
            n = rng.choice([1, 64, 4096, size])
            g.send(g.oneway("MEMSET", at, n, 0x5A, 1, self.pick(self.streams)),
                   g.oneway("MEMCPY_HTOD", at, 0, payload=b"\xa5" * min(n, 4096)),
                   g.oneway("MEMCPY_DTOD", start, at, n, 0))
        return choice

    def check(self):
        """The step's outcome, as the next sync reports it."""
        status, reply = self.g.call("PING")
        assert status != P.HV_INTERNAL, reply
        if status:
            assert self.g.call("PING")[0] == 0  # the deferred error was reported once
        assert self.device._used() <= self.ledger.used <= QUOTA
        return status, reply[:2] if status else ()


def trace(device, seed):
    guest = Guest(device, seed)
    steps = [(guest.step(), guest.check()) for _ in range(STEPS)]
    guest.g.close()
    assert device._used() == guest.ledger.used == 0
    assert not (device.reservations or device.mapped or device.pools or device.physical)
    return steps


@pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")
@pytest.mark.parametrize("seed", range(12))
def test_random_vmm_and_pool_calls_keep_the_quota_and_leave_nothing(seed):
    assert trace(FakeDevice(), seed) == trace(PythonOnly(), seed)
