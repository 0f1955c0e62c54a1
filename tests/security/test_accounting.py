"""Device memory a guest makes the driver take is charged to its slice.

Allocations are charged as the driver takes them (its granularity, not the
bytes asked for), and a module's `__device__` variables are charged at load
(they take device memory with no cuMemAlloc), so many tiny allocations or a
module with a huge array cannot go past the quota, with or without MPS; and
the guest's cuMemGetInfo says what the ledger says.
"""

from __future__ import annotations

import threading
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, Program
from hvgpu.host.executor.cuda_device import driver_footprint
from hvgpu.host.executor.session import DEVICE_MEMORY
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest

M = 1 << 20
BIG = '__device__ char big[{n}];\nextern "C" __global__ void noop() {{}}\n'


def _used(conn) -> int:
    """What the slice's ledger holds, asked through the executor: its releases travel
    one-way to the agent, ahead of this question on the same channel (the control
    lane's status could still miss them)."""
    return conn.call("SLICE_INFO")[2]


def test_footprint_follows_the_driver():
    # as measured on the H200: small ones share pages in 512-byte steps, larger ones
    # take whole 2 MiB pages
    assert driver_footprint(1) == 512 and driver_footprint(513) == 1024
    assert driver_footprint(1 << 20) == 1 << 20
    assert driver_footprint((1 << 20) + 1) == 2 * M and driver_footprint(2 * M + 1) == 4 * M


def test_many_tiny_allocations_cannot_pass_the_quota(agent, control):
    control.call("attach", vm="vm1", mem="1M")
    with Connection(agent.vm_address("vm1")) as conn:
        held = []
        with pytest.raises(CudaError) as info:
            for _ in range(4096):
                held.append(conn.call("MEM_ALLOC", 1)[0])
        assert info.value.status == 2  # CUDA_ERROR_OUT_OF_MEMORY
        assert len(held) == (1 << 20) // 512  # not 1 MiB of one-byte allocations
        (st,) = control.call("status")
        assert st["mem_used"] == 1 << 20
        for ptr in held:
            conn.call("MEM_FREE", ptr)
        assert _used(conn) == 0


def test_a_module_with_a_huge_device_array_is_refused(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        with pytest.raises(CudaError) as info:
            Program(BIG.format(n=512 * M), connection=conn).compile()
        assert info.value.status == 2 and "variables" in str(info.value)
        assert control.call("status")[0]["mem_used"] == 0
        dev = Device(connection=conn)
        dev.allocate(8 * M)  # the guest is still served


def test_module_variables_count_against_the_quota_and_in_mem_info(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        module = Program(BIG.format(n=40 * M), connection=conn).compile()
        assert control.call("status")[0]["mem_used"] == 40 * M
        assert dev.mem_info() == (24 * M, 64 * M)
        with pytest.raises(CudaError) as info:
            dev.allocate(32 * M)  # 40 + 32 > 64
        assert info.value.status == 2
        module.close()
        assert _used(conn) == 0
        dev.allocate(32 * M)


def test_a_disconnect_returns_everything_charged(agent, control):
    control.call("attach", vm="vm1", mem="64M")
    with Connection(agent.vm_address("vm1")) as conn:
        Program(BIG.format(n=10 * M), connection=conn).compile()
        Device(connection=conn).allocate(3 * M)
    import time
    deadline = time.monotonic() + 20
    while control.call("status")[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.call("status")[0]["mem_used"] == 0


# -- a module's charge is measured: nothing may give memory back meanwhile ----------


class Ledger:
    """A slice's quota ledger, as the agent keeps it (RemoteQuota's interface)."""

    def __init__(self, limit: int):
        self.used, self.limit, self.lock = 0, limit, threading.Lock()

    def reserve(self, n: int) -> None:
        with self.lock:
            if self.used + n > self.limit:
                raise CudaError(2, f"{n} bytes more do not fit the quota")
            self.used += n

    def release(self, n: int) -> None:
        with self.lock:
            self.used -= n

    def usage(self) -> tuple[int, int]:
        return self.used, self.limit


class LoadWaitsForASync(FakeDevice):
    """Loading a module marked ``// slow`` lets another connection synchronise in the
    middle of the load (between the session's two readings of free memory)."""

    def __init__(self):
        super().__init__()
        self.loading, self.synced = threading.Event(), threading.Event()

    def module_load(self, image):
        module = super().module_load(image)
        if b"// slow" in bytes(image):
            self.loading.set()
            assert self.synced.wait(30)
        return module

    def stream_synchronize(self, stream):
        super().stream_synchronize(stream)
        self.synced.set()


def test_a_pool_giving_memory_back_during_another_load_does_not_hide_the_module():
    """Two programs of one VM: A frees 40 MiB of pool memory and synchronises while
    B loads a module with 40 MiB of variables. Were the pool's memory given back by
    A's synchronisation, B's load would look free and the VM would hold 40 MiB the
    ledger does not know of (again and again)."""
    device, ledger = LoadWaitsForASync(), Ledger(64 * M)
    a, b = SessionGuest(device, ledger), SessionGuest(device, ledger)
    ptr = a.ok("MEM_ALLOC_ASYNC", 40 * M, 0, 0)
    a.send(a.oneway("MEM_FREE_ASYNC", ptr, 0))
    loaded = []
    load = threading.Thread(target=lambda: loaded.append(b.call(
        "MODULE_COMPILE", "b.cu", "", payload=b"// slow\n" + BIG.format(n=40 * M).encode())))
    load.start()
    assert device.loading.wait(30)
    a.ok("STREAM_SYNCHRONIZE", 0)
    load.join(30)
    a.close()
    if loaded[0][0] == 0:  # loaded: then it is charged
        assert ledger.used >= device._used() >= 40 * M
    else:  # or refused for the quota, as 40 + 40 MiB would pass it
        assert loaded[0][0] == 2
    assert ledger.used >= device._used()
    b.close()
    assert ledger.used == device._used() == 0


class Watchful(FakeDevice):
    """Records each call that gave device memory back while the executor's
    DEVICE_MEMORY lock (the one a module load measures under) was free."""

    CALLS = ("mem_free", "mem_release", "mem_unmap", "module_unload", "pool_free",
             "pool_trim", "pool_destroy", "stream_synchronize", "event_synchronize",
             "synchronize")

    def __init__(self):
        super().__init__()
        self.unlocked: list[str] = []
        for name in self.CALLS:
            setattr(self, name, self._watched(name, getattr(self, name)))

    def _watched(self, name, call):
        def watched(*args):
            before = self._used()
            try:
                return call(*args)
            finally:
                # one connection at a time here: the lock is free unless this thread holds
                # it, which another thread finds out (the lock is re-entrant)
                if self._used() < before and _free_elsewhere(DEVICE_MEMORY):
                    self.unlocked.append(name)
        return watched


def _free_elsewhere(lock) -> bool:
    got = []

    def probe():
        if lock.acquire(blocking=False):
            lock.release()
            got.append(True)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return bool(got)


def test_device_memory_goes_back_only_under_the_lock_a_module_load_measures_under():
    device, ledger = Watchful(), Ledger(64 * M)
    g = SessionGuest(device, ledger)
    for sync in (("STREAM_SYNCHRONIZE", 0), ("CTX_SYNCHRONIZE",)):
        ptr = g.ok("MEM_ALLOC_ASYNC", 5 * M, 0, 0)
        g.send(g.oneway("MEM_FREE_ASYNC", ptr, 0))
        g.ok(*sync)
        assert device._used() == ledger.used == 0, sync  # given back, as threshold 0 asks
    event = g.ok("EVENT_CREATE", 0)
    ptr = g.ok("MEM_ALLOC_ASYNC", 5 * M, 0, 0)
    g.send(g.oneway("MEM_FREE_ASYNC", ptr, 0), g.oneway("EVENT_RECORD", event, 0))
    g.ok("EVENT_SYNCHRONIZE", event)
    assert device._used() == ledger.used == 0
    status, _ = g.call("MODULE_COMPILE", "big.cu", "", payload=BIG.format(n=100 * M).encode())
    assert status == 2  # refused for the quota, and unloaded
    g.ok("MODULE_COMPILE", "k.cu", "", payload=BIG.format(n=M).encode())
    g.ok("MEM_ALLOC", 3 * M)
    pool = g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    g.ok("MEM_ALLOC_ASYNC", 3 * M, pool, 0)
    handle = g.ok("MEM_CREATE", 2 * M, 1, 0, 1, 0, 0)
    va = g.ok("MEM_ADDRESS_RESERVE", 4 * M, 0, 0, 0)
    g.ok("MEM_MAP", va, 2 * M, 0, handle, 0)
    g.close()  # everything goes back at the disconnect
    assert device._used() == ledger.used == 0
    assert device.unlocked == []


def test_a_pools_release_threshold_is_the_guests_to_read_back():
    g = SessionGuest(FakeDevice(), Ledger(64 * M))
    pool = g.ok("MEM_POOL_DEFAULT")
    assert g.ok("MEM_POOL_GET_ATTRIBUTE", pool, 4) == 0
    g.ok("MEM_POOL_SET_ATTRIBUTE", pool, 4, 6 * M)
    assert g.ok("MEM_POOL_GET_ATTRIBUTE", pool, 4) == 6 * M
    ptrs = [g.ok("MEM_ALLOC_ASYNC", 3 * M, 0, 0) for _ in range(3)]  # three 4 MiB chunks
    g.send(*(g.oneway("MEM_FREE_ASYNC", p, 0) for p in ptrs))
    g.ok("CTX_SYNCHRONIZE")
    # trimmed toward the threshold: chunks given back, and at least the threshold kept, as
    # cuMemPoolTrimTo promises (tests/contract/test_pools.py holds the double to it)
    assert 6 * M <= g.ok("MEM_POOL_GET_ATTRIBUTE", pool, 5) < 12 * M
    g.close()


class FreesWaitForTheGpu(FakeDevice):
    """As the driver: a stream-ordered free takes effect when its stream gets there
    (here: at a synchronisation), and a pool destroyed while frees are pending keeps
    its memory until they are done."""

    def __init__(self):
        super().__init__()
        self.pending: list = []  # (ptr, stream) freed, not yet reached
        self.doomed: list = []  # pools destroyed with frees pending

    def pool_free(self, ptr, stream):
        if not any(ptr in pool.live for pool in [*self.pools.values(), *self.doomed]):
            raise CudaError(1, "fake: not a pool allocation")
        self.pending.append(ptr)

    def pool_destroy(self, pool):
        if pool.live:
            self.doomed.append(pool)  # released once its frees are done
            del self.pools[id(pool)]
        else:
            super().pool_destroy(pool)

    def _synchronized(self):
        for ptr in self.pending:
            for pool in [*self.pools.values(), *self.doomed]:
                if ptr in pool.live:
                    self.pools.setdefault(id(pool), pool)
                    super().pool_free(ptr, None)
        self.pending.clear()
        for pool in self.doomed:
            if not pool.live:
                del self.pools[id(pool)]
        self.doomed = [pool for pool in self.doomed if pool.live]
        super()._synchronized()

    def _used(self):
        return super()._used() + sum(pool.reserved for pool in self.doomed
                                     if id(pool) not in self.pools)


def test_pool_memory_is_back_with_the_driver_before_a_disconnect_returns_its_charge():
    """Were the pools destroyed with their frees still queued, the driver would keep
    their memory after the ledger took the charge back: for as long as the guest's
    streams are kept busy (by another of its connections), that memory is its own
    and no one's charge."""
    device, ledger = FreesWaitForTheGpu(), Ledger(64 * M)
    g = SessionGuest(device, ledger)
    stream = g.ok("STREAM_CREATE", 1)
    g.ok("MEM_ALLOC_ASYNC", 5 * M, 0, stream)
    pool = g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    g.ok("MEM_ALLOC_ASYNC", 3 * M, pool, 0)
    doomed = g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    g.ok("MEM_ALLOC_ASYNC", M, doomed, stream)
    g.ok("MEM_POOL_DESTROY", doomed)
    assert ledger.used == device._used() == 12 * M  # whole granules, as the pools hold them
    g.close()
    assert device._used() == ledger.used == 0


class SlowLoads(FakeDevice):
    """The double, whose module loads take a while after taking their memory (as the
    driver's do while it sets the module up), and whose instantiations take memory."""

    def __init__(self):
        super().__init__()
        self.exec_bytes = 8 * M
        self.loading = threading.Event()

    def module_load(self, image):
        module = super().module_load(image)
        self.loading.set()
        time.sleep(0.3)
        return module


def test_a_release_by_another_connection_never_shrinks_what_a_module_load_is_charged():
    """Twelve 16 MiB modules were held under a 64 MiB quota when instantiations were freed
    while loads were being measured: every release now waits for the measurement."""
    from hvgpu.virtio import codec
    from hvgpu.virtio import protocol as P
    from tests.security.data_lane import frame, read_reply
    from tests.security.test_graphs import GLOBAL, _stream
    from tests.security.test_regions import Guest

    device = SlowLoads()
    loader, other = Guest(device=device), Guest(device=device)
    ledger = Ledger(256 * M)
    loader.session.quota = other.session.quota = ledger
    try:
        s = _stream(other)
        assert other.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
        other.post("MEMSET", other.alloc(4096), 64, 1, 1, s)
        status, (graph,) = other.call("STREAM_END_CAPTURE", s)
        status, (exec_,) = other.call("GRAPH_INSTANTIATE", graph, 0)
        assert status == 0
        image = (b".version 8.0\n.target sm_90\n.global .align 4 .b8 big[16777216];\n"
                 b".visible .entry noop()\n{\n ret;\n}\n\0")
        loaded = []

        def load():
            loader.seq += 1
            loader.sock.sendall(frame("MODULE_LOAD_DATA", seq=loader.seq, payload=image))
            _, _, _, status, body = read_reply(loader.sock)
            loaded.append((status, codec.REPLY[P.OP["MODULE_LOAD_DATA"]].decode(body)
                           if not status else body))

        t = threading.Thread(target=load)
        t.start()
        assert device.loading.wait(10)  # the load is being measured: free an instantiation
        assert other.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
        t.join(30)
        status, (module,) = loaded[0]
        assert status == 0
        assert loader.session.module_charges[module] >= 16 * M
    finally:
        loader.close()
        other.close()


# -- a pool's memory is charged until the driver has it back -------------------------


class Watched(Ledger):
    """The ledger of one guest, which notes each moment it charges less than the
    device holds: after each release it is given, and after each frame."""

    def __init__(self, limit: int, device):
        super().__init__(limit)
        self.device, self.below = device, []

    def release(self, n: int) -> None:
        super().release(n)
        self.look(f"release of {n}")

    def look(self, when: str) -> None:
        held = self.device._used()
        if held > self.used:
            self.below.append((when, held, self.used))


@pytest.mark.parametrize("double", [FakeDevice, FreesWaitForTheGpu])
def test_a_stream_ordered_free_gives_no_charge_back_before_the_driver_has_the_memory(double):
    """The frames of the stateful fuzz's pool steps, each seen by the ledger as it is
    served: a free leaves the memory in its pool (the driver's cuMemFreeAsync does
    not release it, a synchronisation or a trim past the release threshold does), so
    only a trim, a synchronisation or a destroyed pool's last free gives a charge
    back, and only after the driver has the memory. FreesWaitForTheGpu frees as the
    driver does, when the stream gets there; FakeDevice at once."""
    device = double()
    ledger = Watched(32 * M, device)
    g = SessionGuest(device, ledger)

    def served(op, *values, oneway=False):
        if oneway:  # one-way: served once the PING behind it is answered
            g.send(g.oneway(op, *values))
            g.ok("PING")
        else:
            g.call(op, *values)
        ledger.look(op)

    pool = g.ok("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
    ledger.look("MEM_POOL_CREATE")
    ptr = g.ok("MEM_ALLOC_ASYNC", M, pool, 0)
    ledger.look("MEM_ALLOC_ASYNC")
    assert ledger.used == device._used() == 2 * M  # the pool's granule
    served("MEM_POOL_DESTROY", pool)  # with an allocation live: it goes with that
    served("MEM_FREE_ASYNC", ptr, 0, oneway=True)  # the last one: the pool goes
    assert ledger.used == device._used() == 0
    kept = g.ok("MEM_ALLOC_ASYNC", 3 * M, 0, 0)  # the guest's default pool
    ledger.look("MEM_ALLOC_ASYNC")
    served("MEM_FREE_ASYNC", kept, 0, oneway=True)
    assert ledger.used == 4 * M  # freed into its pool, which still holds it
    # reused where the free was done, else the pool grows: charged as it holds, either way
    again = g.ok("MEM_ALLOC_ASYNC", 3 * M, 0, 0)
    ledger.look("MEM_ALLOC_ASYNC")
    assert ledger.used == device._used() == (4 if double is FakeDevice else 8) * M
    served("MEM_FREE_ASYNC", again, 0, oneway=True)
    served("STREAM_SYNCHRONIZE", 0)  # past the release threshold (0): given back
    assert ledger.used == device._used() == 0
    ptr = g.ok("MEM_ALLOC_ASYNC", M, 0, 0)
    ledger.look("MEM_ALLOC_ASYNC")
    served("MEM_FREE_ASYNC", ptr, 0, oneway=True)
    served("MEM_POOL_TRIM_TO", g.ok("MEM_POOL_DEFAULT"), 0)
    g.close()
    assert ledger.used == device._used() == 0
    assert ledger.below == []
