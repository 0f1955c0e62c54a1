"""The host memory a guest's graphs hold is counted and bounded.

The driver keeps every node of a capture, a graph and an instantiated graph in the
executor's host memory (about 500 bytes a captured memset on the H200: a million of
them grew the executor by 497 MiB while the slice's quota showed 4 KiB). Each
connection may hold GRAPH_NODES_PER_CONNECTION nodes and each executor (a VM's vGPU)
GRAPH_NODES together; past either, a captured frame fails (and so its capture), and
an instantiation or an added node is refused, with CUDA_ERROR_OUT_OF_MEMORY. What a
connection held is given back when its graphs go, or it closes.
"""

from __future__ import annotations

import pytest

from hvgpu.host.executor import admission
from hvgpu.virtio import protocol as P
from tests.fake_gpu import FakeDevice
from tests.security.test_regions import MiB, Guest

GLOBAL = 0


@pytest.fixture
def bounds(monkeypatch):
    budget = admission.NodeBudget(1500)
    monkeypatch.setattr(admission, "PROCESS_GRAPH_NODES", budget)
    monkeypatch.setattr(admission, "GRAPH_NODES_PER_CONNECTION", 1000)
    return budget


def _capture(g: Guest, memsets: int) -> tuple[int, int, int]:
    """(status of the capture's end, its graph, the stream)."""
    status, (s,) = g.call("STREAM_CREATE", 1)
    dptr = g.alloc(MiB)
    status, (_, graph) = g.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    assert status == 0
    for i in range(memsets):
        g.post("MEMSET", dptr + i % 1024, 1, i & 0xFF, 1, s)
    status, got = g.call("STREAM_END_CAPTURE", s)
    return status, graph, s


def test_a_capture_past_the_connections_bound_fails_and_holds_nothing(bounds):
    g = Guest()
    try:
        status, _, _ = _capture(g, 1200)
        assert status != 0  # its 1001st frame failed: the capture made no graph
        assert bounds.held == 0
        # the frame's own error comes at the next call, as one-way errors do; then the
        # connection goes on
        assert g.call("PING")[0] == P.CUDA_ERROR_OUT_OF_MEMORY
        assert g.call("PING")[0] == 0
        status, graph, _ = _capture(g, 900)  # one within the bound is a graph
        assert status == 0 and bounds.held == 900
    finally:
        g.close()
    assert bounds.held == 0  # given back when the connection closed


def test_an_instantiation_past_the_bound_is_refused_and_destroying_gives_back(bounds):
    g = Guest()
    try:
        status, graph, _ = _capture(g, 600)
        assert status == 0 and bounds.held == 600
        status, why = g.call("GRAPH_INSTANTIATE", graph, 0)  # another 600: 1200 > 1000
        assert status == P.CUDA_ERROR_OUT_OF_MEMORY and "may hold 1000" in why
        assert bounds.held == 600
        assert g.call("GRAPH_DESTROY", graph)[0] == 0
        assert bounds.held == 0
        status, graph, _ = _capture(g, 400)
        status, (exec_,) = g.call("GRAPH_INSTANTIATE", graph, 0)
        assert status == 0 and bounds.held == 800
        assert g.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
        assert bounds.held == 400
    finally:
        g.close()
    assert bounds.held == 0


def test_connections_of_one_vm_share_its_bound(bounds):
    device = FakeDevice()
    first, second = Guest(device=device), Guest(device=device)
    try:
        assert _capture(first, 900)[0] == 0
        status, _, _ = _capture(second, 700)  # 900 + 700 > 1500: its 601st frame failed
        assert status != 0
        assert bounds.held == 900
        assert second.call("PING")[0] == P.CUDA_ERROR_OUT_OF_MEMORY
        assert second.call("PING")[0] == 0
    finally:
        first.close()
        second.close()
    assert bounds.held == 0


def test_nodes_added_by_hand_count_too(bounds):
    g = Guest()
    try:
        status, (graph,) = g.call("GRAPH_CREATE", 0)
        assert status == 0
        for _ in range(1000):
            assert g.call("GRAPH_ADD_EMPTY_NODE", graph, b"")[0] == 0
        status, why = g.call("GRAPH_ADD_EMPTY_NODE", graph, b"")
        assert status == P.CUDA_ERROR_OUT_OF_MEMORY
        assert bounds.held == 1000
    finally:
        g.close()
    assert bounds.held == 0
