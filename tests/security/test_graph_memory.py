"""A hostile guest against graph memory nodes: an allocation node past the quota is
refused at instantiation and nothing is left instantiated; a free node names only
addresses this connection's allocation nodes returned (not another connection's, not
cuMemAlloc memory, not an address at all); absurd sizes and locations are refused; a
connection's live graph allocations and charge go when it closes. Each refusal leaves
the session serving."""

from __future__ import annotations

import struct

import pytest

from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.test_accounting import Ledger
from tests.security.test_graphs import RELAXED, _stream
from tests.security.test_regions import MiB, Guest

DEVICE, INVALID_VALUE, OUT_OF_MEMORY = 1, 1, 2


@pytest.fixture
def guest():
    g = Guest()
    yield g
    g.close()


def _alloc_node(g, graph, size, deps=b""):
    return g.call("GRAPH_ADD_MEM_ALLOC_NODE", graph, size, DEVICE, 0, deps)


def _graph(g):
    status, (graph,) = g.call("GRAPH_CREATE", 0)
    assert status == 0
    return graph


def test_an_allocation_node_past_the_quota_is_refused_at_instantiation(guest):
    ledger = Ledger(64 * MiB)
    guest.session.quota = ledger
    graph = _graph(guest)
    status, (node, dptr) = _alloc_node(guest, graph, 100 * MiB)
    assert status == 0 and dptr  # an address costs nothing yet
    alive = guest.device.graphs_alive
    status, why = guest.call("GRAPH_INSTANTIATE", graph, 0)
    assert status == OUT_OF_MEMORY, why
    assert guest.device.graphs_alive == alive and ledger.used == 0  # nothing instantiated
    # under the quota: charged its whole granules while instantiated
    small = _graph(guest)
    assert _alloc_node(guest, small, 3 * MiB)[0] == 0
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", small, 0)
    assert status == 0 and ledger.used == 4 * MiB
    assert guest.call("PING")[0] == 0  # still serving
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert ledger.used == 0  # never launched: the driver's pool holds nothing


def test_what_a_launch_left_live_stays_charged_until_freed_and_trimmed(guest):
    ledger = Ledger(64 * MiB)
    guest.session.quota = ledger
    s = _stream(guest)
    graph = _graph(guest)
    status, (_, dptr) = _alloc_node(guest, graph, 8 * MiB)
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", graph, 0)
    guest.post("GRAPH_LAUNCH", exec_, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    # live: copies and memsets reach it as any device memory of this guest's
    guest.post("MEMSET", dptr, 16, 7, 1, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert ledger.used == 8 * MiB  # the allocation outlives its graph
    assert guest.call("MEM_FREE", dptr)[0] == 0
    assert ledger.used == 8 * MiB  # the driver's pool keeps it until a trim
    assert guest.call("DEVICE_GRAPH_MEM_TRIM")[0] == 0
    assert ledger.used == 0
    # the address is nobody's now: naming it is refused
    assert guest.call("MEM_FREE", dptr)[0] == INVALID_VALUE
    guest.post("MEMSET", dptr, 16, 7, 1, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == INVALID_VALUE


def test_a_free_node_names_only_this_connections_graph_allocations():
    device = FakeDevice()
    a, b = Guest(device=device), Guest(device=device)
    try:
        ga, gb = _graph(a), _graph(b)
        status, (_, theirs) = _alloc_node(a, ga, MiB)
        assert status == 0
        # another connection's graph allocation
        status, why = b.call("GRAPH_ADD_MEM_FREE_NODE", gb, theirs, b"")
        assert status == INVALID_VALUE, why
        # cuMemAlloc memory, and an address that is nothing
        plain = b.alloc(MiB)
        assert b.call("GRAPH_ADD_MEM_FREE_NODE", gb, plain, b"")[0] == INVALID_VALUE
        assert b.call("GRAPH_ADD_MEM_FREE_NODE", gb, 0xDEAD0000, b"")[0] == INVALID_VALUE
        # nor may it copy into it or free it
        s = _stream(b)
        b.post("MEMSET", theirs, 16, 1, 1, s)
        assert b.call("STREAM_SYNCHRONIZE", s)[0] == INVALID_VALUE
        assert b.call("MEM_FREE", theirs)[0] == INVALID_VALUE
        # its own, once; not twice in one graph
        status, (node, mine) = _alloc_node(b, gb, MiB)
        dep = struct.pack("<Q", node)
        assert b.call("GRAPH_ADD_MEM_FREE_NODE", gb, mine, dep)[0] == 0
        assert b.call("GRAPH_ADD_MEM_FREE_NODE", gb, mine, dep)[0] == INVALID_VALUE
        assert b.call("PING")[0] == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("size,location,status", [
    (0, (DEVICE, 0), INVALID_VALUE),
    ((1 << 64) - 1, (DEVICE, 0), OUT_OF_MEMORY),
    (1 << 50, (DEVICE, 0), OUT_OF_MEMORY),
    (MiB, (DEVICE, 1), P.CUDA_ERROR_INVALID_DEVICE),
    (MiB, (2, 0), P.CUDA_ERROR_NOT_SUPPORTED),  # host memory
])
def test_absurd_allocation_nodes_are_refused(guest, size, location, status):
    graph = _graph(guest)
    got, why = guest.call("GRAPH_ADD_MEM_ALLOC_NODE", graph, size, *location, b"")
    assert got == status, why
    assert guest.call("PING")[0] == 0


def test_graph_memory_attributes_and_their_refusals(guest):
    assert guest.call("DEVICE_GRAPH_MEM_ATTRIBUTE", 0, 0, 0)[0] == 0
    for attr, value in ((0, 0), (2, 0), (1, 5), (7, 0)):  # current figures, non-zero, unknown
        assert guest.call("DEVICE_GRAPH_MEM_ATTRIBUTE", attr, 1, value)[0] == INVALID_VALUE
    assert guest.call("DEVICE_GRAPH_MEM_ATTRIBUTE", 9, 0, 0)[0] == INVALID_VALUE
    assert guest.call("DEVICE_GRAPH_MEM_ATTRIBUTE", 1, 1, 0)[0] == 0
    assert guest.call("GRAPH_NODE_GET_TYPE", 12345)[0] != 0  # no such node


def test_a_captured_allocation_and_free_become_nodes_and_the_connection_cleans_up():
    device = FakeDevice()
    g = Guest(device=device)
    s = _stream(g)
    assert g.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0
    status, (dptr,) = g.call("MEM_ALLOC_ASYNC", 4 * MiB, 0, s)
    assert status == 0
    g.post("MEMSET", dptr, 64, 3, 1, s)  # later captured work reaches it
    status, (graph,) = g.call("STREAM_END_CAPTURE", s)
    assert status == 0
    status, (count, nodes) = g.call("GRAPH_GET_NODES", graph, 8)
    assert count == 2
    status, (kind, _, got, size) = g.call("GRAPH_NODE_GET_TYPE",
                                           struct.unpack_from("<Q", nodes)[0])
    assert (status, kind, got, size) == (0, 10, dptr, 4 * MiB)
    status, (exec_,) = g.call("GRAPH_INSTANTIATE", graph, 0)
    g.post("GRAPH_LAUNCH", exec_, s)
    assert g.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert bytes(device.graph_live[dptr][:64]) == b"\x03" * 64
    # relaunched with its allocation unfreed: the driver's refusal
    g.post("GRAPH_LAUNCH", exec_, s)
    assert g.call("STREAM_SYNCHRONIZE", s)[0] == INVALID_VALUE
    # the connection goes with the allocation live: freed, and the pool trimmed
    g.close()
    assert not device.graph_live and device.graph_reserved == 0


def test_a_captured_free_is_a_free_node_of_graph_memory_only(guest):
    s = _stream(guest)
    status, (pooled,) = guest.call("MEM_ALLOC_ASYNC", MiB, 0, s)  # not capturing: the pool's
    assert status == 0
    assert guest.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0
    status, (dptr,) = guest.call("MEM_ALLOC_ASYNC", MiB, 0, s)
    guest.post("MEM_FREE_ASYNC", dptr, s)
    assert guest.call("PING")[0] == 0
    guest.post("MEM_FREE_ASYNC", dptr, s)  # twice in one graph
    assert guest.call("PING")[0] == INVALID_VALUE
    status, why = guest.call("STREAM_END_CAPTURE", s)
    assert status == P.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, why  # the refusal lost it
    assert guest.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0
    guest.post("MEM_FREE_ASYNC", pooled, s)  # memory no graph allocated
    assert guest.call("PING")[0] == P.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert guest.call("STREAM_END_CAPTURE", s)[0] != 0
    guest.post("MEM_FREE_ASYNC", pooled, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
