"""Memory pools shared among one VM's processes cannot reach what was not exported to
them, nor another VM's pools, nor free what is not theirs, nor leave memory held or
free it twice.

Each connection is one process of the VM (its own session of the VM's one executor).
A pool's token (cuMemPoolExportToShareableHandle) and an allocation's
(cuMemPoolExportPointer) are tokens of the executor's table: guessed, forged, of
another kind, withdrawn (the pool destroyed, the allocation freed) or another VM's,
they import nothing. An imported pool allocates nothing; a pointer imports only into
the pool it came from. The memory stays charged to the slice, and valid for whoever
still holds it, until the last process lets go, in whichever order they free or end.
"""

from __future__ import annotations

import os
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.host.executor import ipc
from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import SessionGuest
from tests.security.test_accounting import Ledger

M = 1 << 20
SIZE = P.IPC_HANDLE_SIZE
POSIX_FD = 1
INVALID, NOT_SUPPORTED = P.CUDA_ERROR_INVALID_VALUE, P.CUDA_ERROR_NOT_SUPPORTED


def _refused(status, conn, op, *args):
    with pytest.raises(CudaError) as info:
        conn.call(op, *args)
    assert info.value.status == status, info.value
    return info.value


def _used(control) -> int:
    return control.call("status")[0]["mem_used"]


def _eventually(control, value) -> None:
    deadline = time.monotonic() + 20
    while _used(control) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _used(control) == value


def _pool(conn, handle_types=POSIX_FD):
    return conn.call("MEM_POOL_CREATE", 1, handle_types, 1, 0, 0, 0)[0]


def _free(conn, ptr, stream=0):
    """cuMemFreeAsync (one-way), then a synchronisation: its error, if any."""
    conn.post("MEM_FREE_ASYNC", ptr, stream)
    conn.call("STREAM_SYNCHRONIZE", stream)


def _shared(a, b, size=4 * M):
    """a's exportable pool and an allocation from it, both imported by b."""
    pool = _pool(a)
    ptr = a.call("MEM_ALLOC_ASYNC", size, pool, 0)[0]
    imported = b.call("MEM_POOL_IMPORT", POSIX_FD, 0, a.call("MEM_POOL_EXPORT", pool,
                                                             POSIX_FD, 0)[0])[0]
    token = a.call("MEM_POOL_EXPORT_POINTER", ptr)[0]
    return pool, ptr, imported, token


@pytest.fixture
def vm1(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    return agent.vm_address("vm1")


def test_a_pool_and_its_allocation_are_shared_and_the_importer_frees_only_its_import(
        vm1, control):
    with Connection(vm1) as a, Connection(vm1) as b:
        pool, ptr, imported, token = _shared(a, b)
        assert len(token) == SIZE and a.call("MEM_POOL_EXPORT_POINTER", ptr)[0] == token
        assert a.call("MEM_POOL_EXPORT", pool, POSIX_FD, 0)[0] == \
            a.call("MEM_POOL_EXPORT", pool, POSIX_FD, 0)[0]  # the same each time
        a.call("MEMSET", ptr, 16, 0x11, 1, 0)
        assert b.call("MEM_POOL_IMPORT_POINTER", imported, token) == (ptr, 4 * M)
        assert b.call("MEMCPY_DTOH", ptr, 16, 0)[-1] == b"\x11" * 16
        b.call("MEMSET", ptr, 16, 0x22, 1, 0)
        _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", imported, token)  # imported already
        _refused(INVALID, b, "MEM_FREE", ptr)  # not cuMemAlloc's
        _free(b, ptr)
        with pytest.raises(CudaError) as info:  # freed twice: refused at the next sync
            _free(b, ptr)
        assert info.value.status == INVALID
        _refused(INVALID, b, "MEMCPY_DTOH", ptr, 16, 0)  # no longer b's to reach
        assert a.call("MEMCPY_DTOH", ptr, 16, 0)[-1] == b"\x22" * 16
        _free(a, ptr)
        a.call("MEM_POOL_DESTROY", pool)
        b.call("MEM_POOL_DESTROY", imported)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "MEM_POOL_DESTROY", imported)  # twice
        _eventually(control, 0)


def test_a_freed_allocations_export_imports_nothing_and_its_memory_lives_while_held(
        vm1, control):
    with Connection(vm1) as a, Connection(vm1) as b, Connection(vm1) as c:
        pool, ptr, imported, token = _shared(a, b)
        a.call("MEMSET", ptr, 8, 7, 1, 0)
        b.call("MEM_POOL_IMPORT_POINTER", imported, token)
        theirs = c.call("MEM_POOL_IMPORT", POSIX_FD, 0, a.call("MEM_POOL_EXPORT", pool,
                                                               POSIX_FD, 0)[0])[0]
        _free(a, ptr)  # before the importer, which CUDA forbids: b keeps it all the same
        _refused(INVALID, c, "MEM_POOL_IMPORT_POINTER", theirs, token)  # withdrawn
        _refused(INVALID, a, "MEM_POOL_EXPORT_POINTER", ptr)  # a pointer export of a freed one
        assert b.call("MEMCPY_DTOH", ptr, 8, 0)[-1] == b"\7" * 8
        assert _used(control) == 4 * M  # still charged to the VM's slice
        other = a.call("MEM_ALLOC_ASYNC", 4 * M, pool, 0)[0]
        assert other != ptr  # the driver has not had it back
        pool_token = a.call("MEM_POOL_EXPORT", pool, POSIX_FD, 0)[0]
        a.call("MEM_POOL_DESTROY", pool)  # with `other` live: it goes with it
        _refused(INVALID, c, "MEM_POOL_IMPORT", POSIX_FD, 0, pool_token)  # withdrawn
        _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "MEM_POOL_EXPORT", pool, POSIX_FD, 0)
        _free(b, ptr)  # the last holder: freed now
        _free(a, other)
        c.call("MEM_POOL_DESTROY", theirs)
        b.call("MEM_POOL_DESTROY", imported)
        _eventually(control, 0)


def test_forged_misshapen_and_mismatched_tokens_import_nothing(vm1):
    with Connection(vm1) as a, Connection(vm1) as b:
        pool, ptr, imported, token = _shared(a, b)
        pool_token = a.call("MEM_POOL_EXPORT", pool, POSIX_FD, 0)[0]
        forged = [bytes(SIZE), b"\xff" * SIZE, os.urandom(SIZE),
                  ptr.to_bytes(8, "little") + bytes(SIZE - 8),
                  token[:-1] + bytes([token[-1] ^ 1]), token[:SIZE - 1], token + b"\0", b"",
                  token * 2]
        for bad in forged:
            _refused(INVALID, b, "MEM_POOL_IMPORT", POSIX_FD, 0, bad)
            _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", imported, bad)
        _refused(INVALID, b, "MEM_POOL_IMPORT", POSIX_FD, 0, token)  # a pointer's
        _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", imported, pool_token)  # a pool's
        vmm = a.call("MEM_CREATE", 2 * M, 1, POSIX_FD, 1, 0, 0)[0]
        vmm_token = a.call("MEM_EXPORT", vmm, POSIX_FD, 0)[0]
        _refused(INVALID, b, "MEM_POOL_IMPORT", POSIX_FD, 0, vmm_token)
        _refused(INVALID, b, "MEM_IMPORT", POSIX_FD, pool_token)
        _refused(INVALID, b, "IPC_OPEN_MEM_HANDLE", 0, token)
        for handle_type, flags in ((2, 0), (8, 0), (0, 0), (POSIX_FD, 1)):
            _refused(INVALID, b, "MEM_POOL_IMPORT", handle_type, flags, pool_token)
            _refused(INVALID, a, "MEM_POOL_EXPORT", pool, handle_type, flags)
        # into a pool b did not import, or imported from another pool
        own = _pool(b)
        _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", own, token)
        _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", 0, token)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "MEM_POOL_IMPORT_POINTER", 12345, token)
        second = _pool(a)
        other = b.call("MEM_POOL_IMPORT", POSIX_FD, 0,
                       a.call("MEM_POOL_EXPORT", second, POSIX_FD, 0)[0])[0]
        _refused(INVALID, b, "MEM_POOL_IMPORT_POINTER", other, token)
        # the exporting process imports its own pool, not its own pointer
        mine = a.call("MEM_POOL_IMPORT", POSIX_FD, 0, pool_token)[0]
        _refused(P.CUDA_ERROR_INVALID_CONTEXT, a, "MEM_POOL_IMPORT_POINTER", mine, token)
        assert b.call("MEM_POOL_IMPORT_POINTER", imported, token)[0] == ptr  # the true one


def test_only_exportable_pools_and_their_live_allocations_are_exported(vm1):
    with Connection(vm1) as a, Connection(vm1) as b:
        _refused(NOT_SUPPORTED, a, "MEM_POOL_CREATE", 1, 2, 1, 0, 0, 0)  # Win32 handles
        _refused(NOT_SUPPORTED, a, "MEM_POOL_CREATE", 1, 8, 1, 0, 0, 0)  # fabric
        plain = _pool(a, 0)
        _refused(INVALID, a, "MEM_POOL_EXPORT", plain, POSIX_FD, 0)
        _refused(INVALID, a, "MEM_POOL_EXPORT", 0, POSIX_FD, 0)  # the default pool
        for bad in (1, 12345, plain + 100):
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "MEM_POOL_EXPORT", bad, POSIX_FD, 0)
        ptr = a.call("MEM_ALLOC_ASYNC", M, plain, 0)[0]
        _refused(INVALID, a, "MEM_POOL_EXPORT_POINTER", ptr)  # its pool is not exportable
        pool, shared, imported, token = _shared(a, b)
        for bad in (0, shared + 512, shared - 1, 1 << 63):  # not an allocation's start
            _refused(INVALID, a, "MEM_POOL_EXPORT_POINTER", bad)
        _refused(INVALID, b, "MEM_POOL_EXPORT_POINTER", shared)  # a's, not b's
        b.call("MEM_POOL_IMPORT_POINTER", imported, token)
        _refused(INVALID, b, "MEM_POOL_EXPORT_POINTER", shared)  # no re-export
        _refused(INVALID, b, "MEM_POOL_EXPORT", imported, POSIX_FD, 0)
        # an imported pool allocates nothing and is its exporter's to tune
        _refused(INVALID, b, "MEM_ALLOC_ASYNC", M, imported, 0)
        _refused(NOT_SUPPORTED, b, "MEM_POOL_SET_ATTRIBUTE", imported, 4, 0)
        _refused(NOT_SUPPORTED, b, "MEM_POOL_TRIM_TO", imported, 0)
        assert b.call("MEM_POOL_GET_ATTRIBUTE", imported, 7)[0] >= 4 * M  # used: a's
        fresh = a.call("MEM_ALLOC_ASYNC", M, pool, 0)[0]
        a.call("MEM_POOL_DESTROY", pool)  # with allocations live, one of them imported
        _refused(INVALID, a, "MEM_POOL_EXPORT_POINTER", fresh)  # its pool is destroyed
        never = _pool(a)  # never exported before it was destroyed
        unshared = a.call("MEM_ALLOC_ASYNC", M, never, 0)[0]
        a.call("MEM_POOL_DESTROY", never)
        _refused(INVALID, a, "MEM_POOL_EXPORT_POINTER", unshared)
        assert a.call("MEM_POOL_EXPORT_POINTER", shared)[0] == token  # exported before
        assert b.call("MEMCPY_DTOH", shared, 4, 0)[-1] == a.call("MEMCPY_DTOH", shared, 4, 0)[-1]


def test_another_vms_tokens_import_nothing(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    control.call("attach", vm="vm2", mem="8M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as z:
        pool = _pool(a)
        ptr = a.call("MEM_ALLOC_ASYNC", M, pool, 0)[0]
        pool_token = a.call("MEM_POOL_EXPORT", pool, POSIX_FD, 0)[0]
        token = a.call("MEM_POOL_EXPORT_POINTER", ptr)[0]
        _refused(INVALID, z, "MEM_POOL_IMPORT", POSIX_FD, 0, pool_token)
        mine = z.call("MEM_POOL_IMPORT", POSIX_FD, 0,
                      z.call("MEM_POOL_EXPORT", _pool(z), POSIX_FD, 0)[0])[0]
        _refused(INVALID, z, "MEM_POOL_IMPORT_POINTER", mine, token)
        _refused(INVALID, z, "MEMCPY_DTOH", ptr, 16, 0)


def test_a_token_minted_in_one_executor_is_refused_by_another():
    mine, theirs = ipc.Exports(), ipc.Exports()
    for kind in (ipc.POOL, ipc.POINTER):
        export = mine.export(kind, object(), base=0x1000, size=16)
        assert mine.find(export.token, kind) is export
        with pytest.raises(CudaError) as info:
            theirs.find(export.token, kind)
        assert info.value.status == INVALID


def test_an_exporter_that_ends_leaves_the_pool_to_its_importer_then_it_goes(vm1, control):
    with Connection(vm1) as b:
        a = Connection(vm1)
        pool, ptr, imported, token = _shared(a, b)
        a.call("MEMSET", ptr, 4, 9, 1, 0)
        b.call("MEM_POOL_IMPORT_POINTER", imported, token)
        a.close()  # never freed nor destroyed anything
        time.sleep(0.3)
        assert b.call("MEMCPY_DTOH", ptr, 4, 0)[-1] == b"\t" * 4
        assert _used(control) == 4 * M
        _free(b, ptr)
        assert _used(control) == 4 * M  # the pool still holds it: b imported it
        b.call("MEM_POOL_DESTROY", imported)  # the last holder: the pool goes
        _eventually(control, 0)


def test_an_importer_that_ends_lets_go_of_its_imports(vm1, control):
    with Connection(vm1) as a:
        b = Connection(vm1)
        pool, ptr, imported, token = _shared(a, b)
        b.call("MEM_POOL_IMPORT_POINTER", imported, token)
        b.close()  # freed nothing, destroyed nothing
        time.sleep(0.3)
        _free(a, ptr)  # the last holder: freed now
        a.call("MEM_POOL_DESTROY", pool)
        _eventually(control, 0)
    _eventually(control, 0)


def _device_holds_nothing(device) -> bool:
    return not device.pools and device._used() == 0


@pytest.mark.parametrize("order", ["importer first", "exporter first", "exporter ends",
                                   "importer ends", "both end", "pool destroyed first"])
def test_every_order_of_letting_go_frees_once_and_uncharges_once(order):
    """Two processes of one VM on one executor (one device, one table, one slice), each
    way round: the driver has every byte back, each exactly once, and the slice's
    charge comes back to 0."""
    device, ledger, exports = FakeDevice(), Ledger(64 * M), ipc.Exports()
    a, b = SessionGuest(device, ledger, exports), SessionGuest(device, ledger, exports)
    pool = a.ok("MEM_POOL_CREATE", 1, POSIX_FD, 1, 0, 0, 0)
    ptr = a.ok("MEM_ALLOC_ASYNC", 4 * M, pool, 0)
    imported = b.ok("MEM_POOL_IMPORT", POSIX_FD, 0, a.ok("MEM_POOL_EXPORT", pool, POSIX_FD, 0))
    assert b.ok("MEM_POOL_IMPORT_POINTER", imported, a.ok("MEM_POOL_EXPORT_POINTER", ptr)) \
        == (ptr, 4 * M)
    charged = ledger.used
    assert charged >= 4 * M
    free_a = a.oneway("MEM_FREE_ASYNC", ptr, 0)
    free_b = b.oneway("MEM_FREE_ASYNC", ptr, 0)
    if order == "importer first":
        b.send(free_b)
        b.ok("MEM_POOL_DESTROY", imported)
        assert device.pools and ledger.used == charged
        a.send(free_a)
        a.ok("MEM_POOL_DESTROY", pool)
    elif order == "exporter first":
        a.send(free_a)
        a.ok("MEM_POOL_DESTROY", pool)
        assert device.pools and ledger.used == charged  # b holds the allocation
        b.send(free_b)
        b.ok("STREAM_SYNCHRONIZE", 0)
        assert device.pools and ledger.used == charged  # and the pool
        b.ok("MEM_POOL_DESTROY", imported)
    elif order == "exporter ends":
        a.close()
        assert device.pools and ledger.used == charged
        b.send(free_b)
        b.ok("MEM_POOL_DESTROY", imported)
    elif order == "importer ends":
        b.close()
        assert ledger.used == charged
        a.send(free_a)
        a.ok("MEM_POOL_DESTROY", pool)
    elif order == "both end":
        a.close()
        b.close()
    elif order == "pool destroyed first":
        a.ok("MEM_POOL_DESTROY", pool)
        b.ok("MEM_POOL_DESTROY", imported)
        assert device.pools and ledger.used == charged  # the allocations hold it
        b.send(free_b)
        b.ok("STREAM_SYNCHRONIZE", 0)
        a.send(free_a)
        a.ok("STREAM_SYNCHRONIZE", 0)
    for guest in (a, b):
        if guest.thread.is_alive():
            guest.ok("STREAM_SYNCHRONIZE", 0)  # the last free's error, if any
            guest.close()
    assert _device_holds_nothing(device), device.pools
    assert ledger.used == 0
    assert len(exports) == 0
