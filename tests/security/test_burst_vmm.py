"""The C loop of one-way frames never touches pool or mapped memory the guest no
longer holds.

Pool allocations and read-write mapped ranges reach the C loop's range table
through the session's tables (tables.Mirror). Each case below lets such memory
go one way (a stream-ordered free, a pool destroyed, an unmap, access taken
back, one of two neighbouring mappings unmapped, another connection's) and then
sends a memset, a device copy or a host copy into it between two good launches:
with the C loop and, for reference, with the Python path alone, it must be
refused with the same status and frame, reach the Python path, and leave the
memory of another connection as it was. Memory still held (a pool destroyed
with an allocation live, a mapping whose handle was released) stays the C
loop's to serve.
"""

from __future__ import annotations

import struct

import pytest

from hvgpu.host.executor.launch_burst import unavailable_reason
from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=unavailable_reason() or "")

M = 1 << 20
G = 2 * M  # the test double's granularity
RW = struct.pack("<iiI", 1, 0, 3)
NONE = struct.pack("<iiI", 1, 0, 0)
NOOP = 'extern "C" __global__ void noop() {}'
INVALID_VALUE = P.CUDA_ERROR_INVALID_VALUE
CONTENT = bytes(range(256)) * 16


class PythonOnly(FakeDevice):
    def driver_entries(self):
        return {}


class Tenant:
    """A connection with a kernel, a pool allocation and a read-write mapping."""

    def __init__(self, device):
        self.g = g = SessionGuest(device)
        module = g.ok("MODULE_COMPILE", "k.cu", "", payload=NOOP.encode())[0]
        self.noop = g.ok("MODULE_GET_FUNCTION", module, "noop")
        g.ok("FUNC_GET_PARAM_INFO", self.noop)
        self.pooled = g.ok("MEM_ALLOC_ASYNC", len(CONTENT), 0, 0)
        self.va = self.mapped(G)
        for ptr in (self.pooled, self.va):
            g.ok("MEMCPY_HTOD", ptr, 0, payload=CONTENT)

    def mapped(self, size, chunks=1, access=RW):
        g = self.g
        va = g.ok("MEM_ADDRESS_RESERVE", size * chunks, 0, 0, 0)
        for i in range(chunks):
            h = g.ok("MEM_CREATE", size, 1, 0, 1, 0, 0)
            g.ok("MEM_MAP", va + i * size, size, 0, h, 0)
        g.ok("MEM_SET_ACCESS", va, size * chunks, access)
        return va

    def launch(self):
        return self.g.oneway("LAUNCH_KERNEL", self.noop, 1, 1, 1, 1, 1, 1, 0, 0, b"")

    def touches(self, ptr, n=64):
        """One frame of each kind that writes [ptr, ptr + n)."""
        g = self.g
        return {"memset": lambda: g.oneway("MEMSET", ptr, n, 0xFF, 1, 0),
                "device copy": lambda: g.oneway("MEMCPY_DTOD", ptr, self.pooled, n, 0),
                "host copy": lambda: g.oneway("MEMCPY_HTOD", ptr, 0, payload=b"\xff" * n)}


def pool_freed(me, v):
    ptr = me.g.ok("MEM_ALLOC_ASYNC", 4096, 0, 0)
    me.g.send(me.g.oneway("MEM_FREE_ASYNC", ptr, 0))
    return ptr


def destroyed_pool_freed(me, v):
    pool = me.g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    ptr = me.g.ok("MEM_ALLOC_ASYNC", 4096, pool, 0)
    me.g.ok("MEM_POOL_DESTROY", pool)
    me.g.send(me.g.oneway("MEM_FREE_ASYNC", ptr, 0))
    return ptr


def destroyed_pool_live(me, v):
    pool = me.g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    ptr = me.g.ok("MEM_ALLOC_ASYNC", 4096, pool, 0)
    me.g.ok("MEM_POOL_DESTROY", pool)  # as CUDA: it goes with its last allocation
    return ptr


def trimmed_pool(me, v):
    pool = me.g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    me.g.ok("MEM_POOL_SET_ATTRIBUTE", pool, 4, (1 << 64) - 1)
    ptr = me.g.ok("MEM_ALLOC_ASYNC", 4096, pool, 0)
    me.g.send(me.g.oneway("MEM_FREE_ASYNC", ptr, 0))
    me.g.ok("MEM_POOL_TRIM_TO", pool, 0)
    return ptr


def unmapped(me, v):
    va = me.mapped(G)
    me.g.ok("MEM_UNMAP", va, G)
    return va


def remapped_without_access(me, v):
    va = me.mapped(G)
    me.g.ok("MEM_UNMAP", va, G)
    h = me.g.ok("MEM_CREATE", G, 1, 0, 1, 0, 0)
    me.g.ok("MEM_MAP", va, G, 0, h, 0)  # mapped again, access not given again
    return va


def access_taken_back(me, v):
    va = me.mapped(G)
    me.g.ok("MEM_SET_ACCESS", va, G, NONE)
    return va


def read_only(me, v):
    return me.mapped(G, access=struct.pack("<iiI", 1, 0, 1))


def released_and_unmapped(me, v):
    va = me.mapped(G)
    h = me.g.ok("MEM_RETAIN_HANDLE", va)
    me.g.ok("MEM_RELEASE", h)  # the retained reference
    me.g.ok("MEM_RELEASE", h)  # the creating one: the mapping holds it now
    me.g.ok("MEM_UNMAP", va, G)
    return va


def second_of_two_unmapped(me, v):
    """Two neighbouring mappings are one range for copies; the second goes."""
    va = me.mapped(G, chunks=2)
    me.g.ok("MEM_UNMAP", va + G, G)
    return va + G - 32  # 32 bytes still mapped, the rest not


def first_of_two_unmapped(me, v):
    va = me.mapped(G, chunks=2)
    me.g.ok("MEM_UNMAP", va, G)
    return va + G - 32


def past_a_pool_allocation(me, v):
    return me.pooled + len(CONTENT) - 32


def across_two_pool_allocations(me, v):
    a = me.g.ok("MEM_ALLOC_ASYNC", 512, 0, 0)
    b = me.g.ok("MEM_ALLOC_ASYNC", 512, 0, 0)
    assert b == a + 512  # neighbours in the pool
    return a + 480


def past_a_mapping(me, v):
    return me.va + G - 32


def victims_pool_allocation(me, v):
    return v.pooled


def victims_mapping(me, v):
    return v.va


# what lets the memory go -> it is refused (INVALID_VALUE) or still served (0)
CASES = {
    "a pool allocation freed stream-ordered": (pool_freed, INVALID_VALUE),
    "the last allocation of a destroyed pool, freed": (destroyed_pool_freed, INVALID_VALUE),
    "a live allocation of a destroyed pool": (destroyed_pool_live, 0),
    "a freed allocation of a trimmed pool": (trimmed_pool, INVALID_VALUE),
    "an unmapped range": (unmapped, INVALID_VALUE),
    "a range mapped again, its access not given again": (remapped_without_access,
                                                         INVALID_VALUE),
    "a mapping whose access was taken back": (access_taken_back, INVALID_VALUE),
    "a read-only mapping": (read_only, INVALID_VALUE),
    "a mapping of a released handle, unmapped": (released_and_unmapped, INVALID_VALUE),
    "into the second of two mappings, unmapped": (second_of_two_unmapped, INVALID_VALUE),
    "from the first of two mappings, unmapped": (first_of_two_unmapped, INVALID_VALUE),
    "past the end of a pool allocation": (past_a_pool_allocation, INVALID_VALUE),
    "across two pool allocations": (across_two_pool_allocations, INVALID_VALUE),
    "past the end of a mapping": (past_a_mapping, INVALID_VALUE),
    "another connection's pool allocation": (victims_pool_allocation, INVALID_VALUE),
    "another connection's mapping": (victims_mapping, INVALID_VALUE),
}
KINDS = ("memset", "device copy", "host copy")


def attempt(device):
    """For each case and kind: (the status at the next sync, the frame it names, whether
    the Python path read the frame, the victim's memory after)."""
    victim = Tenant(device)
    out = {}
    for case, (let_go, _) in CASES.items():
        for kind in KINDS:
            me = Tenant(device)
            bad = me.touches(let_go(me, victim))[kind]()
            me.g.python_ops.clear()
            me.g.send(me.launch(), bad, me.launch())
            status, values = me.g.call("PING")
            me.g.ok("PING")  # and it goes on
            op, seq = struct.unpack_from("<4xH2xI", bad)
            out[case, kind] = (status, values[:2] if status else (op, seq),
                               op in me.g.python_ops,
                               victim.g.ok("MEMCPY_DTOH", victim.pooled, len(CONTENT), 0)
                               + victim.g.ok("MEMCPY_DTOH", victim.va, len(CONTENT), 0))
            me.g.close()
    victim.g.close()
    return out


@pytest.fixture(scope="module")
def outcomes():
    return attempt(FakeDevice()), attempt(PythonOnly())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_memory_the_guest_let_go_is_refused_in_the_c_loop_as_in_python(outcomes, case, kind):
    (status, named, to_python, memory) = outcomes[0][case, kind]
    reference = outcomes[1][case, kind]
    assert status == reference[0] == CASES[case][1]
    assert named == reference[1]  # the hostile frame itself is named
    assert memory == reference[3] == CONTENT * 2  # the victim's memory as it was
    # refused: the C loop left it to the Python path; held: the C loop served it
    assert to_python == bool(status)
