"""CUDA IPC among one VM's processes cannot reach what was not exported to them, nor
another VM's memory, nor free the exporter's memory, nor leave memory held.

Each connection here is one process of the VM (its own session of the VM's one
executor). An IPC handle is a token of the executor's table: guessed, forged,
truncated, withdrawn (its allocation freed) or another VM's, it opens nothing;
opened by the process that exported it, it is refused as the driver refuses it
(CUDA_ERROR_INVALID_CONTEXT); memory opened from it is the exporter's, which the
importer cannot free and which stays charged to the slice, and valid for the
importer, until the last process holding it lets go.
"""

from __future__ import annotations

import os
import time

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.host.executor import ipc
from hvgpu.virtio import protocol as P

M = 1 << 20
SIZE = P.IPC_HANDLE_SIZE
INTERPROCESS = 0x4 | 0x2  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING


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


@pytest.fixture
def vm1(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    return agent.vm_address("vm1")


def test_two_processes_share_memory_and_the_importer_cannot_free_it(vm1, control):
    with Connection(vm1) as a, Connection(vm1) as b:
        ptr = a.call("MEM_ALLOC", 4 * M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr + 100)[0]  # any address inside: its base
        assert len(token) == SIZE and a.call("IPC_GET_MEM_HANDLE", ptr)[0] == token
        assert b.call("IPC_OPEN_MEM_HANDLE", 0, token) == (ptr, 4 * M)
        b.call("MEMSET", ptr, 16, 0x5A, 1, 0)
        assert a.call("MEMCPY_DTOH", ptr, 16, 0)[-1] == b"\x5a" * 16
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_FREE", ptr)  # not the importer's
        assert b.call("IPC_OPEN_MEM_HANDLE", 1, token) == (ptr, 4 * M)  # counted again
        assert b.call("IPC_CLOSE_MEM_HANDLE", ptr) == (1,)
        assert b.call("IPC_CLOSE_MEM_HANDLE", ptr) == (0,)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_CLOSE_MEM_HANDLE", ptr)  # twice
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEMCPY_DTOH", ptr, 16, 0)  # closed
        a.call("MEM_FREE", ptr)


def test_opening_in_the_exporting_process_is_refused_as_the_driver_refuses_it(vm1):
    with Connection(vm1) as a:
        ptr = a.call("MEM_ALLOC", M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        _refused(P.CUDA_ERROR_INVALID_CONTEXT, a, "IPC_OPEN_MEM_HANDLE", 0, token)
        event = a.call("EVENT_CREATE", INTERPROCESS)[0]
        etoken = a.call("IPC_GET_EVENT_HANDLE", event)[0]
        _refused(P.CUDA_ERROR_INVALID_CONTEXT, a, "IPC_OPEN_EVENT_HANDLE", etoken)


def test_guessed_forged_and_misshapen_handles_open_nothing(vm1):
    with Connection(vm1) as a, Connection(vm1) as b:
        ptr = a.call("MEM_ALLOC", M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        event = a.call("EVENT_CREATE", INTERPROCESS)[0]
        etoken = a.call("IPC_GET_EVENT_HANDLE", event)[0]
        forged = [bytes(SIZE), b"\xff" * SIZE, os.urandom(SIZE),
                  ptr.to_bytes(8, "little") + bytes(SIZE - 8),  # the address, as drivers do
                  token[:-1] + bytes([token[-1] ^ 1]), token[:SIZE - 1], token + b"\0",
                  b"", token * 2]
        for bad in forged:
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_MEM_HANDLE", 0, bad)
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_EVENT_HANDLE", bad)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_MEM_HANDLE", 0, etoken)  # an event's
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_EVENT_HANDLE", token)  # memory's
        for flags in (2, 3, 0x80000000):
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_MEM_HANDLE", flags, token)
        assert b.call("IPC_OPEN_MEM_HANDLE", 0, token)[0] == ptr  # the true one still opens


def test_only_its_own_cu_mem_alloc_memory_and_interprocess_events_are_exported(vm1):
    with Connection(vm1) as a, Connection(vm1) as b:
        ptr = a.call("MEM_ALLOC", M)[0]
        for bad in (0, ptr - 1, ptr + M, 1 << 63):
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_GET_MEM_HANDLE", bad)
            _refused(P.CUDA_ERROR_INVALID_VALUE, a, "IPC_GET_MEM_HANDLE", bad)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_GET_MEM_HANDLE", ptr)  # a's, not b's
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        b.call("IPC_OPEN_MEM_HANDLE", 0, token)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_GET_MEM_HANDLE", ptr)  # no re-export
        pool = a.call("MEM_ALLOC_ASYNC", M, 0, 0)[0]  # pool memory: not cuIpcGetMemHandle's
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "IPC_GET_MEM_HANDLE", pool)
        plain = a.call("EVENT_CREATE", 0)[0]
        timing = a.call("EVENT_CREATE", 0x4)[0]  # interprocess, but timed
        for event in (plain, timing):
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "IPC_GET_EVENT_HANDLE", event)
        event = a.call("EVENT_CREATE", INTERPROCESS)[0]
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "IPC_GET_EVENT_HANDLE", event)  # a's
        opened = b.call("IPC_OPEN_EVENT_HANDLE", a.call("IPC_GET_EVENT_HANDLE", event)[0])[0]
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "IPC_GET_EVENT_HANDLE", opened)
        for bad in (0, 1, 12345, ptr + 1, pool):  # opened ptr; never these
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_CLOSE_MEM_HANDLE", bad)
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "IPC_CLOSE_MEM_HANDLE", ptr)  # never opened


def test_a_freed_allocations_token_opens_nothing_and_its_memory_lives_while_held(
        vm1, control):
    with Connection(vm1) as a, Connection(vm1) as b, Connection(vm1) as c:
        ptr = a.call("MEM_ALLOC", 4 * M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        b.call("IPC_OPEN_MEM_HANDLE", 0, token)
        a.call("MEMSET", ptr, 8, 7, 1, 0)
        a.call("MEM_FREE", ptr)
        _refused(P.CUDA_ERROR_INVALID_VALUE, c, "IPC_OPEN_MEM_HANDLE", 0, token)  # withdrawn
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "IPC_GET_MEM_HANDLE", ptr)
        assert b.call("MEMCPY_DTOH", ptr, 8, 0)[-1] == b"\7" * 8  # still b's to read
        assert _used(control) == 4 * M  # and still charged to the VM's slice
        other = a.call("MEM_ALLOC", 4 * M)[0]
        assert other != ptr  # the driver has not had it back
        b.call("IPC_CLOSE_MEM_HANDLE", ptr)
        _eventually(control, 4 * M)  # what is left: `other`
        a.call("MEM_FREE", other)
        _eventually(control, 0)


def test_an_exporter_that_ends_leaves_its_memory_to_the_importer_then_it_goes(vm1, control):
    with Connection(vm1) as b:
        a = Connection(vm1)
        ptr = a.call("MEM_ALLOC", 2 * M)[0]
        a.call("MEMSET", ptr, 4, 9, 1, 0)
        b.call("IPC_OPEN_MEM_HANDLE", 0, a.call("IPC_GET_MEM_HANDLE", ptr)[0])
        a.close()
        time.sleep(0.3)
        assert b.call("MEMCPY_DTOH", ptr, 4, 0)[-1] == b"\t" * 4
        assert _used(control) == 2 * M
    _eventually(control, 0)  # the importer ended too: nothing is left held


def test_events_are_shared_and_outlive_the_exporters_destroy_while_opened(vm1):
    with Connection(vm1) as a, Connection(vm1) as b:
        event = a.call("EVENT_CREATE", INTERPROCESS)[0]
        token = a.call("IPC_GET_EVENT_HANDLE", event)[0]
        assert a.call("IPC_GET_EVENT_HANDLE", event)[0] == token
        first = b.call("IPC_OPEN_EVENT_HANDLE", token)[0]
        second = b.call("IPC_OPEN_EVENT_HANDLE", token)[0]
        assert first != second  # each open is an event of its own to destroy
        a.call("EVENT_RECORD", event, 0)
        b.call("STREAM_WAIT_EVENT", 0, first, 0)
        b.call("EVENT_SYNCHRONIZE", first)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "EVENT_ELAPSED_TIME", first, second)
        a.call("EVENT_DESTROY", event)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_EVENT_HANDLE", token)  # withdrawn
        b.call("EVENT_SYNCHRONIZE", second)  # still there for the processes that hold it
        b.call("EVENT_DESTROY", first)
        b.call("EVENT_DESTROY", second)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "EVENT_DESTROY", second)


def test_another_vms_token_opens_nothing(agent, control):
    control.call("attach", vm="vm1", mem="8M")
    control.call("attach", vm="vm2", mem="8M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as z:
        ptr = a.call("MEM_ALLOC", M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        etoken = a.call("IPC_GET_EVENT_HANDLE", a.call("EVENT_CREATE", INTERPROCESS)[0])[0]
        _refused(P.CUDA_ERROR_INVALID_VALUE, z, "IPC_OPEN_MEM_HANDLE", 0, token)
        _refused(P.CUDA_ERROR_INVALID_VALUE, z, "IPC_OPEN_EVENT_HANDLE", etoken)
        _refused(P.CUDA_ERROR_INVALID_VALUE, z, "MEMCPY_DTOH", ptr, 16, 0)


def test_a_token_minted_in_one_executor_is_refused_by_another():
    mine, theirs = ipc.Exports(), ipc.Exports()
    export = mine.export(ipc.MEMORY, object(), base=0x1000, size=16)
    assert mine.find(export.token, ipc.MEMORY) is export
    with pytest.raises(CudaError) as info:
        theirs.find(export.token, ipc.MEMORY)
    assert info.value.status == P.CUDA_ERROR_INVALID_VALUE
    tokens = {mine.export(ipc.EVENT, object()).token for _ in range(1000)}
    assert len(tokens) == 1000  # random, never repeated


def test_memory_opened_by_a_process_is_let_go_when_it_ends(vm1, control):
    with Connection(vm1) as a:
        ptr = a.call("MEM_ALLOC", 2 * M)[0]
        token = a.call("IPC_GET_MEM_HANDLE", ptr)[0]
        b = Connection(vm1)
        b.call("IPC_OPEN_MEM_HANDLE", 0, token)
        b.call("IPC_OPEN_MEM_HANDLE", 0, token)
        b.close()  # never closed the handle
        time.sleep(0.3)
        a.call("MEM_FREE", ptr)  # the last holder: freed now
        _eventually(control, 0)


# -- VMM memory shared as a POSIX file descriptor (cuMemExportToShareableHandle) ----------

G = 2 * M  # the test double's granularity
RW = (1).to_bytes(4, "little") + (0).to_bytes(4, "little") + (3).to_bytes(4, "little")
POSIX_FD = 1


def _mapped(conn, handle, size=G):
    va = conn.call("MEM_ADDRESS_RESERVE", size, 0, 0, 0)[0]
    conn.call("MEM_MAP", va, size, 0, handle, 0)
    conn.call("MEM_SET_ACCESS", va, size, RW)
    return va


def test_vmm_memory_is_shared_by_its_token_and_outlives_its_exporter(vm1, control):
    with Connection(vm1) as b:
        a = Connection(vm1)
        handle = a.call("MEM_CREATE", G, 1, POSIX_FD, 1, 0, 0)[0]
        token = a.call("MEM_EXPORT", handle, POSIX_FD, 0)[0]
        assert len(token) == SIZE and a.call("MEM_EXPORT", handle, POSIX_FD, 0)[0] == token
        va = _mapped(a, handle)
        a.call("MEMSET", va, 8, 0x33, 1, 0)
        mine = b.call("MEM_IMPORT", POSIX_FD, token)[0]
        assert b.call("MEM_HANDLE_INFO", mine) == (G,)
        vb = _mapped(b, mine)
        assert b.call("MEMCPY_DTOH", vb, 8, 0)[-1] == b"\x33" * 8  # the same memory
        again = a.call("MEM_IMPORT", POSIX_FD, token)[0]  # the exporter may import it too
        a.call("MEM_RELEASE", again)
        a.close()  # the exporter ends: b's mapping still holds the memory, still charged
        time.sleep(0.3)
        assert b.call("MEMCPY_DTOH", vb, 8, 0)[-1] == b"\x33" * 8
        assert _used(control) == G
        b.call("MEM_RELEASE", mine)
        b.call("MEM_UNMAP", vb, G)  # the last holder: the driver has it back
        _eventually(control, 0)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_IMPORT", POSIX_FD, token)  # gone


def test_vmm_exports_refuse_what_cannot_be_shared_and_tokens_that_name_nothing(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm1")) as b, \
            Connection(agent.vm_address("vm2")) as z:
        plain = a.call("MEM_CREATE", G, 1, 0, 1, 0, 0)[0]
        _refused(P.CUDA_ERROR_INVALID_VALUE, a, "MEM_EXPORT", plain, POSIX_FD, 0)
        shared = a.call("MEM_CREATE", G, 1, POSIX_FD, 1, 0, 0)[0]
        for handle_type, flags in ((2, 0), (8, 0), (0, 0), (POSIX_FD, 1)):
            _refused(P.CUDA_ERROR_INVALID_VALUE, a, "MEM_EXPORT", shared, handle_type, flags)
        for bad in (0, 1, 12345, shared + 1):
            _refused(P.CUDA_ERROR_INVALID_HANDLE, a, "MEM_EXPORT", bad, POSIX_FD, 0)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "MEM_EXPORT", shared, POSIX_FD, 0)  # a's
        _refused(P.CUDA_ERROR_NOT_SUPPORTED, a, "MEM_CREATE", G, 1, 2, 1, 0, 0)  # Win32
        token = a.call("MEM_EXPORT", shared, POSIX_FD, 0)[0]
        for bad in (bytes(SIZE), os.urandom(SIZE), token[:-1], token + b"\0", b""):
            _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_IMPORT", POSIX_FD, bad)
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_IMPORT", 2, token)
        _refused(P.CUDA_ERROR_INVALID_VALUE, z, "MEM_IMPORT", POSIX_FD, token)  # another VM
        ptr = a.call("MEM_ALLOC", M)[0]  # a cuIpc token is not a VMM one, nor the reverse
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_IMPORT", POSIX_FD,
                 a.call("IPC_GET_MEM_HANDLE", ptr)[0])
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "IPC_OPEN_MEM_HANDLE", 0, token)
        imported = b.call("MEM_IMPORT", POSIX_FD, token)[0]
        b.call("MEM_RELEASE", imported)
        _refused(P.CUDA_ERROR_INVALID_HANDLE, b, "MEM_RELEASE", imported)  # released twice
        a.call("MEM_RELEASE", shared)  # nothing holds it now: the token goes with it
        _refused(P.CUDA_ERROR_INVALID_VALUE, b, "MEM_IMPORT", POSIX_FD, token)
