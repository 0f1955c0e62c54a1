"""A hostile guest against the graph ops CUDA's samples need beyond capture and
node-by-node building: cloning a graph and finding a node's copy in a clone.

Every handle names something of this connection (another connection's graph or
node is refused, as an unknown one is), a clone counts its nodes against the
connection's bound as the graph it copies does, and each refusal leaves the
session serving."""

from __future__ import annotations

import struct

import pytest

from hvgpu.host.executor import admission
from hvgpu.virtio import protocol as P
from tests.security.test_regions import Guest


@pytest.fixture
def guests():
    a, b = Guest(), Guest()
    yield a, b
    a.close()
    b.close()


def _ok(g: Guest, op: str, *values):
    status, got = g.call(op, *values)
    assert status == 0, (op, got)
    return got[0]


def test_a_clone_names_only_this_connections_graphs_and_their_nodes(guests):
    a, b = guests
    graph = _ok(a, "GRAPH_CREATE", 0)
    first = _ok(a, "GRAPH_ADD_EMPTY_NODE", graph, b"")
    other = _ok(a, "GRAPH_CREATE", 0)
    stranger = _ok(a, "GRAPH_ADD_EMPTY_NODE", other, b"")
    theirs = _ok(b, "GRAPH_CREATE", 0)
    their_node = _ok(b, "GRAPH_ADD_EMPTY_NODE", theirs, b"")
    # b's graph handle may be a's number too: what a holds under it is its own
    assert a.call("GRAPH_CLONE", 1 << 40)[0] == P.CUDA_ERROR_INVALID_HANDLE
    clone = _ok(a, "GRAPH_CLONE", graph)
    copy = _ok(a, "GRAPH_NODE_FIND_IN_CLONE", clone, first)
    assert copy != first
    assert _ok(a, "GRAPH_NODE_FIND_IN_CLONE", clone, first) == copy  # one handle a node
    for c, node in ((clone, stranger), (clone, their_node + 1000), (clone, copy),
                    (graph, first), (other, stranger), (1 << 40, first), (clone, 0)):
        status, why = a.call("GRAPH_NODE_FIND_IN_CLONE", c, node)
        assert status in (P.CUDA_ERROR_INVALID_VALUE, P.CUDA_ERROR_INVALID_HANDLE), (c, node)
    # b cannot reach a's clone, nor find its own node in it
    assert b.call("GRAPH_NODE_FIND_IN_CLONE", clone + 1000, their_node)[0] != 0
    # the clone's nodes are its own: a node may depend on them, and not on the original's
    assert a.call("GRAPH_ADD_EMPTY_NODE", clone, first.to_bytes(8, "little"))[0] == 1
    _ok(a, "GRAPH_ADD_EMPTY_NODE", clone, copy.to_bytes(8, "little"))
    # once the original is gone, its nodes are names of nothing
    assert a.call("GRAPH_DESTROY", graph)[0] == 0
    assert a.call("GRAPH_NODE_FIND_IN_CLONE", clone, first)[0] == P.CUDA_ERROR_INVALID_VALUE
    exec_ = _ok(a, "GRAPH_INSTANTIATE", clone, 0)
    assert a.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert a.call("GRAPH_DESTROY", clone)[0] == 0
    assert a.call("PING")[0] == 0 and b.call("PING")[0] == 0


def test_a_clone_counts_its_nodes_and_is_refused_past_the_bound(monkeypatch):
    budget = admission.NodeBudget(1500)
    monkeypatch.setattr(admission, "PROCESS_GRAPH_NODES", budget)
    monkeypatch.setattr(admission, "GRAPH_NODES_PER_CONNECTION", 1000)
    g = Guest()
    try:
        graph = _ok(g, "GRAPH_CREATE", 0)
        for _ in range(400):
            _ok(g, "GRAPH_ADD_EMPTY_NODE", graph, b"")
        clone = _ok(g, "GRAPH_CLONE", graph)
        assert budget.held == 800
        status, why = g.call("GRAPH_CLONE", clone)  # 1200 > 1000
        assert status == P.CUDA_ERROR_OUT_OF_MEMORY and "may hold 1000" in why
        assert budget.held == 800
        assert g.call("GRAPH_DESTROY", clone)[0] == 0
        assert budget.held == 400
    finally:
        g.close()
    assert budget.held == 0


def _q(*nodes) -> bytes:
    return b"".join(n.to_bytes(8, "little") for n in nodes)


def test_a_conditional_node_takes_only_its_graphs_handles_and_bounded_bodies(guests):
    a, b = guests
    graph = _ok(a, "GRAPH_CREATE", 0)
    other = _ok(a, "GRAPH_CREATE", 0)
    handle = _ok(a, "GRAPH_CONDITIONAL_HANDLE_CREATE", graph, 1, 1)
    foreign = _ok(a, "GRAPH_CONDITIONAL_HANDLE_CREATE", other, 1, 1)
    assert a.call("GRAPH_CONDITIONAL_HANDLE_CREATE", graph, 1, 2)[0] == 1  # no such flag
    assert a.call("GRAPH_CONDITIONAL_HANDLE_CREATE", 1 << 40, 1, 0)[0] == 400
    for handle_, kind, size in ((handle, 3, 1), (handle, 0, 0), (handle, 2, 1 << 31),
                                (handle, 2, P.MAX_CONDITIONAL_BODIES + 1), (foreign, 0, 1),
                                (foreign + 1, 0, 1), (0, 0, 1), ((1 << 64) - 1, 1, 1)):
        status, why = a.call("GRAPH_ADD_CONDITIONAL_NODE", graph, handle_, kind, size, b"")
        assert status == P.CUDA_ERROR_INVALID_VALUE, (handle_, kind, size, why)
    node, bodies = a.call("GRAPH_ADD_CONDITIONAL_NODE", graph, handle, 0, 1, b"")[1]
    (body,) = struct.unpack("<Q", bodies)
    inner = _ok(a, "GRAPH_ADD_EMPTY_NODE", body, b"")
    # a body's nodes are its own, not its node's graph's; and the handles of the graph its
    # node is in may be named by conditional nodes in it
    assert a.call("GRAPH_ADD_EMPTY_NODE", graph, _q(inner))[0] == 1
    assert a.call("GRAPH_ADD_EMPTY_NODE", body, _q(node))[0] == 1
    _, nested = a.call("GRAPH_ADD_CONDITIONAL_NODE", body, handle, 1, 1, b"")[1]
    # a body goes with its node's graph: not destroyed, instantiated or cloned alone
    for op, args in (("GRAPH_DESTROY", (body,)), ("GRAPH_INSTANTIATE", (body, 0)),
                     ("GRAPH_CLONE", (body,))):
        assert a.call(op, *args)[0] == P.CUDA_ERROR_INVALID_VALUE, op
    # another connection cannot add to it
    assert b.call("GRAPH_ADD_EMPTY_NODE", body, b"")[0] != 0
    exec_ = _ok(a, "GRAPH_INSTANTIATE", graph, 0)
    assert a.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert a.call("GRAPH_DESTROY", graph)[0] == 0
    (nested_body,) = struct.unpack("<Q", nested)
    for gone in (body, nested_body):
        assert a.call("GRAPH_ADD_EMPTY_NODE", gone, b"")[0] == 400
    assert a.call("PING")[0] == 0 and b.call("PING")[0] == 0


def test_a_conditional_nodes_bodies_count_against_the_bound(monkeypatch):
    budget = admission.NodeBudget(1500)
    monkeypatch.setattr(admission, "PROCESS_GRAPH_NODES", budget)
    monkeypatch.setattr(admission, "GRAPH_NODES_PER_CONNECTION", 1000)
    g = Guest()
    try:
        graph = _ok(g, "GRAPH_CREATE", 0)
        handle = _ok(g, "GRAPH_CONDITIONAL_HANDLE_CREATE", graph, 0, 0)
        _, bodies = g.call("GRAPH_ADD_CONDITIONAL_NODE", graph, handle, 2, 4, b"")[1]
        for body in struct.unpack("<4Q", bodies):
            for _ in range(150):
                _ok(g, "GRAPH_ADD_EMPTY_NODE", body, b"")
        assert budget.held == 601
        # the instantiation counts the bodies' nodes too: 1202 > 1000
        status, why = g.call("GRAPH_INSTANTIATE", graph, 0)
        assert status == P.CUDA_ERROR_OUT_OF_MEMORY, why
        assert g.call("GRAPH_DESTROY", graph)[0] == 0
        assert budget.held == 0
    finally:
        g.close()
    assert budget.held == 0
