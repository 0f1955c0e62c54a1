"""A hostile guest against stream capture and graphs: a graph never replays from memory
the executor has reused or let go of (its staging buffers, a detached region, an
unloaded module, a destroyed event), never allocates outside the quota, and whatever a
connection leaves captured or instantiated is gone when it closes. Each refusal leaves
the session serving."""

from __future__ import annotations

import mmap
import os
import struct

import pytest

from hvgpu.errors import CudaError
from hvgpu.host.executor import graphs, regions
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame, read_reply
from tests.security.test_regions import MiB, Guest

GLOBAL, RELAXED = 0, 2


@pytest.fixture
def guest():
    g = Guest()
    yield g
    g.close()


def _stream(g: Guest) -> int:
    status, (stream,) = g.call("STREAM_CREATE", 1)
    assert status == 0
    return stream


def _region(g: Guest, size=4 * MiB):
    fd, status, got = g.attach_memfd(size)
    assert status == 0, got
    return got[0], mmap.mmap(fd, size), fd


def test_a_captured_copy_from_the_region_replays_what_the_region_holds_then(guest):
    region, view, fd = _region(guest)
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    assert status == 0 and cid > 0 and graph >= 16
    guest.post("MEMCPY_HTOD_REGION", dptr, region, 0, 0, 8, s)
    guest.post("MEMSET", dptr + 8, 8, 0x5A, 1, s)
    guest.post("MEMCPY_DTOH_REGION", region, 0, 4096, dptr, 16, s)
    assert guest.call("STREAM_END_CAPTURE", s) == (0, (graph,))
    assert view[4096:4112] == bytes(16)  # captured, not run
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", graph, 0)
    assert status == 0
    for word in (b"first...", b"second.."):
        view[0:8] = word
        guest.post("GRAPH_LAUNCH", exec_, s)
        assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
        assert view[4096:4112] == word + b"\x5a" * 8
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    view.close()
    os.close(fd)


def test_copies_the_executor_stages_are_refused_on_a_capturing_stream(guest):
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0
    # a device-to-host copy on the socket: refused at once, nothing captured
    status, why = guest.call("MEMCPY_DTOH", dptr, 64, s)
    assert status == 900 and "pageable" in why
    # stream-ordered allocation is an allocation node (charged when instantiated); freeing
    # memory no graph allocated is refused on a capturing stream
    status, (captured,) = guest.call("MEM_ALLOC_ASYNC", MiB, 0, s)
    assert status == 0 and captured not in guest.session.pools.owner
    status, got = guest.call("STREAM_END_CAPTURE", s)
    assert status == 0
    assert guest.call("GRAPH_DESTROY", got[0])[0] == 0
    # not capturing any more: the same copy goes through
    assert guest.call("MEMCPY_DTOH", dptr, 64, s)[0] == 0


def test_a_pageable_copy_with_bytes_is_refused_and_its_bytes_skipped(guest):
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0
    guest.seq += 1
    guest.sock.sendall(frame("MEMCPY_HTOD", dptr, s, flags=P.FLAG_ONEWAY, seq=guest.seq,
                             payload=b"x" * 4096))
    status, why = guest.call("PING")
    assert status == 900 and "pageable" in why  # the deferred refusal
    assert guest.session.counts["h2d_bytes"] == 0
    # the capture lost the copy, so it ends as no graph (as the driver invalidates a
    # capture on what it cannot capture)
    status, why = guest.call("STREAM_END_CAPTURE", s)
    assert status == 901, why
    assert guest.device.graphs_alive == 0


def test_a_region_a_graph_may_copy_to_stays_mapped_until_the_last_graph_goes(guest):
    region, view, fd = _region(guest)
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("MEMCPY_DTOH_REGION", region, 0, 0, dptr, 64, s)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", graph, 0)
    assert guest.call("REGION_DETACH", region)[0] == 0  # the guest's handle goes at once
    guest.post("MEMCPY_DTOH_REGION", region, 0, 0, dptr, 64, s)  # not the guest's any more
    status, why = guest.call("PING")
    assert status != 0 and "region" in why
    assert guest.device.registered  # but the executor keeps it mapped and registered
    assert guest.executor_regions.budget.used == 4 * MiB
    guest.post("GRAPH_LAUNCH", exec_, s)  # the replay writes memory still mapped
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert guest.device.registered  # the instantiation still copies to it
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    view.close()
    os.close(fd)


def test_a_room_of_the_vms_region_a_graph_copies_to_goes_to_no_other_process_before_it(
        tmp_path):
    """The VM's device region is shared by its processes, each copying only within the
    rooms it was given. A room given back (REGION_FREE) while a graph still copies into it
    stays out of the others' reach until the last graph goes (fuzzing finding: the next
    REGION_ALLOC of another connection got it, and the graph's replay wrote into it)."""
    path = tmp_path / "hvgpu-vm1"
    path.write_bytes(bytes(4 * MiB))
    executor_regions = regions.ExecutorRegions(8 * MiB, lambda: (os.open(path, os.O_RDWR), 4 * MiB))
    device = FakeDevice()
    one, other = (Guest(executor_regions=executor_regions, device=device),
                  Guest(executor_regions=executor_regions, device=device))
    try:
        region = one.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[1][0]
        room = one.call("REGION_ALLOC", region, 0, 4096)[1][0]
        dptr = one.alloc(MiB)
        one.post("MEMSET", dptr, 4096, 0xAB, 1, 0)
        graph = one.call("GRAPH_CREATE", 0)[1][0]
        assert one.call("GRAPH_ADD_MEMCPY_NODE", graph, 2, region, room, dptr, 4096, b"")[0] == 0
        exec_ = one.call("GRAPH_INSTANTIATE", graph, 0)[1][0]
        assert one.call("REGION_FREE", region, 0, room)[0] == 0
        assert one.call("REGION_FREE", region, 0, room)[0] != 0  # the guest's no more

        theirs = other.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[1][0]
        got = other.call("REGION_ALLOC", theirs, 0, 4096)[1][0]
        assert got != room
        with open(path, "r+b") as f:
            f.seek(got)
            f.write(b"mine" * 1024)
        one.post("GRAPH_LAUNCH", exec_, 0)
        assert one.call("CTX_SYNCHRONIZE")[0] == 0
        with open(path, "rb") as f:
            f.seek(got)
            assert f.read(4096) == b"mine" * 1024
            f.seek(room)
            assert f.read(4096) == b"\xab" * 4096  # the graph wrote the room it names

        assert one.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
        assert one.call("GRAPH_DESTROY", graph)[0] == 0
        assert other.call("REGION_ALLOC", theirs, 0, 4096)[1][0] == room  # free again
    finally:
        one.close()
        other.close()
        executor_regions.close()


def test_events_and_modules_a_graph_may_use_are_released_after_it(guest):
    s = _stream(guest)
    status, (event,) = guest.call("EVENT_CREATE", 0)
    guest.seq += 1
    source = b'extern "C" __global__ void saxpy(float a) {}\0'
    guest.sock.sendall(frame("MODULE_LOAD_DATA", seq=guest.seq, payload=source))
    _, _, _, status, body = read_reply(guest.sock)
    assert status == 0
    (module,) = codec.REPLY[P.OP["MODULE_LOAD_DATA"]].decode(body)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("EVENT_RECORD", event, s)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert guest.call("EVENT_DESTROY", event)[0] == 0
    assert guest.call("MODULE_UNLOAD", module)[0] == 0
    guest.post("EVENT_RECORD", event, s)  # not the guest's any more
    assert guest.call("PING")[0] == 400
    assert guest.device.events_destroyed == 0 and guest.device.modules_unloaded == 0
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert guest.device.events_destroyed == 1 and guest.device.modules_unloaded == 1


def test_a_graph_of_another_kind_or_number_is_refused(guest):
    s = _stream(guest)
    for op, args in (("GRAPH_INSTANTIATE", (99, 0)), ("GRAPH_DESTROY", (99,)),
                     ("GRAPH_EXEC_DESTROY", (99,)), ("STREAM_END_CAPTURE", (s,))):
        status, why = guest.call(op, *args)
        assert status in (400, 401), (op, status, why)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, 7)[0] == 1  # no such mode
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    # neither instantiated nor destroyed while it is being captured
    assert guest.call("GRAPH_INSTANTIATE", graph, 0)[0] == 1
    assert guest.call("GRAPH_DESTROY", graph)[0] == 1
    status, (graph2,) = guest.call("STREAM_END_CAPTURE", s)
    assert graph2 == graph
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", graph, 0)
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 400  # once only
    assert guest.call("GRAPH_LAUNCH", exec_, s)[0] == 400
    assert guest.call("PING")[0] == 0


def test_a_graphs_nodes_are_counted_and_named_within_the_limit(guest):
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    for i in range(5):
        guest.post("MEMSET", dptr + 64 * i, 64, i, 1, s)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert guest.call("GRAPH_GET_NODES", graph, 0) == (0, (5, b""))
    status, (count, nodes) = guest.call("GRAPH_GET_NODES", graph, 3)
    assert count == 5 and len(struct.unpack("<3Q", nodes)) == 3
    status, (count, again) = guest.call("GRAPH_GET_NODES", graph, 100)
    assert again[:24] == nodes  # the same node, the same handle
    assert guest.call("GRAPH_GET_NODES", 99, 0)[0] == 400


def test_graphs_per_connection_are_bounded(guest, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 3)
    s = _stream(guest)
    made = []
    for _ in range(3):
        assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
        made.append(guest.call("STREAM_END_CAPTURE", s)[1][0])
    status, why = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    assert status == 2 and "at most 3" in why
    assert guest.call("GRAPH_INSTANTIATE", made[0], 0)[0] == 2
    assert guest.call("GRAPH_DESTROY", made[0])[0] == 0
    assert guest.call("GRAPH_INSTANTIATE", made[1], 0)[0] == 0


def test_a_capture_query_names_a_joined_stream_and_its_dependencies(guest):
    s, s2 = _stream(guest), _stream(guest)
    status, (event,) = guest.call("EVENT_CREATE", 0)
    assert guest.call("STREAM_CAPTURE_INFO", s, 1) == (0, (0, 0, 0, 0, b""))
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    guest.post("MEMSET", guest.alloc(4096), 64, 1, 1, s)
    guest.post("EVENT_RECORD", event, s)
    guest.post("STREAM_WAIT_EVENT", s2, event, 0)
    status, (st, _, cid2, graph2, nodes) = guest.call("STREAM_CAPTURE_INFO", s2, 1)
    assert status == 0 and (st, cid2, graph2) == (1, cid, graph)
    (node,) = struct.unpack("<Q", nodes)
    assert node >= 16
    assert guest.call("STREAM_END_CAPTURE", s)[0] == 0
    assert guest.call("STREAM_CAPTURE_INFO", s2, 1)[1][0] == 0


def test_a_session_closing_mid_capture_leaves_nothing_behind():
    g = Guest()
    region, view, fd = _region(g)
    s = _stream(g)
    assert g.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    g.post("MEMCPY_DTOH_REGION", region, 0, 0, g.alloc(MiB), 64, s)
    status, (graph,) = g.call("STREAM_END_CAPTURE", s)
    status, (exec_,) = g.call("GRAPH_INSTANTIATE", graph, 0)
    assert g.call("REGION_DETACH", region)[0] == 0
    assert g.call("STREAM_BEGIN_CAPTURE", s, RELAXED)[0] == 0  # a second, left under way
    g.close()
    assert g.device.graphs_alive == 0
    assert not g.device.captures
    assert not g.device.registered and g.executor_regions.budget.used == 0
    view.close()
    os.close(fd)


def _node(g: Guest, op: str, *values) -> int:
    status, got = g.call(op, *values)
    assert status == 0, got
    return got[0]


def test_nodes_built_by_hand_name_only_the_guests_memory_and_their_own_graph(guest):
    region, view, fd = _region(guest)
    dptr = guest.alloc(MiB)
    graph = _node(guest, "GRAPH_CREATE", 0)
    other = _node(guest, "GRAPH_CREATE", 0)
    foreign = _node(guest, "GRAPH_ADD_EMPTY_NODE", other, b"")
    # memsets and copies inside the guest's allocations and region only
    outside = dptr + MiB
    refusals = [
        ("GRAPH_ADD_MEMSET_NODE", (graph, outside, 0, 1, 1, 64, 1, b"")),
        ("GRAPH_ADD_MEMSET_NODE", (graph, dptr, 64, 1, 1, 64, MiB, b"")),  # rows run past
        ("GRAPH_ADD_MEMSET_NODE", (graph, dptr, 16, 1, 1, 64, 2, b"")),  # pitch under a row
        ("GRAPH_ADD_MEMSET_NODE", (graph, dptr, 0, 1, 3, 64, 1, b"")),  # 3-byte elements
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 0, 0, dptr, outside, 64, b"")),
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 1, region, dptr, 4 * MiB - 8, 64, b"")),
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 2, region, 0, dptr, 64, b"")[:4] + (outside, 64, b"")),
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 1, 99, dptr, 0, 64, b"")),  # no such region
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 7, 0, dptr, dptr, 64, b"")),
        ("GRAPH_ADD_MEMCPY_NODE", (graph, 0, 0, dptr, dptr, 0, b"")),
        ("GRAPH_ADD_KERNEL_NODE", (graph, 99, 1, 1, 1, 1, 1, 1, 0, b"", b"")),
        ("GRAPH_ADD_EVENT_NODE", (graph, 0, 0, 99, b"")),
        # a dependency on another graph's node, on no node, on a cut handle
        ("GRAPH_ADD_EMPTY_NODE", (graph, struct.pack("<Q", foreign))),
        ("GRAPH_ADD_EMPTY_NODE", (graph, struct.pack("<Q", 12345))),
        ("GRAPH_ADD_EMPTY_NODE", (graph, b"\x01\x02\x03")),
        ("GRAPH_ADD_EMPTY_NODE", (99, b"")),
    ]
    for op, values in refusals:
        status, why = guest.call(op, *values)
        assert status in (1, 400), (op, values, status, why)
    assert guest.call("GRAPH_GET_NODES", graph, 0) == (0, (0, b""))  # nothing was added
    up = _node(guest, "GRAPH_ADD_MEMCPY_NODE", graph, 1, region, dptr, 0, 64, b"")
    down = _node(guest, "GRAPH_ADD_MEMCPY_NODE", graph, 2, region, 4096, dptr, 64,
                 struct.pack("<Q", up))
    fill = _node(guest, "GRAPH_ADD_MEMSET_NODE", graph, dptr + 128, 0, 7, 1, 64, 1, b"")
    assert guest.call("GRAPH_ADD_DEPENDENCIES", graph, struct.pack("<Q", fill),
                      struct.pack("<Q", down))[0] == 0
    assert guest.call("GRAPH_ADD_DEPENDENCIES", graph, struct.pack("<Q", fill),
                      struct.pack("<Q", foreign))[0] == 1
    assert guest.call("GRAPH_ADD_DEPENDENCIES", graph, struct.pack("<2Q", fill, up),
                      struct.pack("<Q", down))[0] == 1  # as many sources as targets
    exec_ = _node(guest, "GRAPH_INSTANTIATE", graph, 0)
    view[0:64] = bytes(range(64))
    s = _stream(guest)
    guest.post("GRAPH_LAUNCH", exec_, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert view[4096:4160] == bytes(range(64))
    # a node of another graph in this instantiation; a graph of another shape
    status, why = guest.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, foreign, 16,
                             1, 1, 1, 1, 1, 1, 0, b"")
    assert status in (1, 400)
    status, why = guest.call("GRAPH_EXEC_UPDATE", exec_, other)
    assert status == 910, why
    view.close()
    os.close(fd)


def test_a_graph_being_captured_takes_no_nodes_by_hand(guest):
    s = _stream(guest)
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    status, why = guest.call("GRAPH_ADD_EMPTY_NODE", graph, b"")
    assert status == 1 and "being captured" in why
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert guest.call("GRAPH_ADD_EMPTY_NODE", graph, b"")[0] == 0


def test_a_kernel_node_takes_the_kernels_parameter_size(guest):
    source = b'extern "C" __global__ void saxpy(float a, float* x, float* y, int n) {}\0'
    guest.seq += 1
    guest.sock.sendall(frame("MODULE_LOAD_DATA", seq=guest.seq, payload=source))
    _, _, _, status, body = read_reply(guest.sock)
    (module,) = codec.REPLY[P.OP["MODULE_LOAD_DATA"]].decode(body)
    function = _node(guest, "MODULE_GET_FUNCTION", module, "saxpy")
    graph = _node(guest, "GRAPH_CREATE", 0)
    x, y = guest.alloc(4096), guest.alloc(4096)
    params = struct.pack("<f4xQQi", 2.0, x, y, 16)  # the layout the double gives saxpy
    status, why = guest.call("GRAPH_ADD_KERNEL_NODE", graph, function, 1, 1, 1, 32, 1, 1, 0,
                             b"", params[:-4])
    assert status == 1 and "parameter buffer" in why
    node = _node(guest, "GRAPH_ADD_KERNEL_NODE", graph, function, 1, 1, 1, 32, 1, 1, 0, b"",
                 params)
    exec_ = _node(guest, "GRAPH_INSTANTIATE", graph, 0)
    status, why = guest.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, node, function,
                             1, 1, 1, 32, 1, 1, 0, params + b"\0" * 8)
    assert status == 1
    assert guest.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, node, function,
                      1, 1, 1, 32, 1, 1, 0, params)[0] == 0


def test_a_one_way_frame_that_fails_in_a_capture_invalidates_it(guest):
    # The guest hears of the failure only at its next synchronising call: the capture
    # must not end as a graph it believes holds that frame's work.
    region, view, fd = _region(guest)
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    guest.post("MEMCPY_DTOH_REGION", region, 0, 0, dptr, 64, s)
    guest.post("MEMSET", dptr + MiB, 64, 1, 1, s)  # past the allocation: refused
    assert guest.call("REGION_DETACH", region)[0] == 0  # parked: the capture may copy to it
    assert guest.device.registered
    # the end is carried out, whatever is owed: the capture is over, with no graph
    status, why = guest.call("STREAM_END_CAPTURE", s)
    assert status == 901, why
    assert not guest.session.graphs.origins and guest.device.graphs_alive == 0
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    # the earlier frame's error is still reported, once
    status, why = guest.call("PING")
    assert status == 1 and "allocation" in why
    assert guest.call("GRAPH_DESTROY", graph)[0] == 400
    assert guest.call("STREAM_CAPTURE_INFO", s, 1) == (0, (0, 0, 0, 0, b""))
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert status == 0 and guest.call("GRAPH_DESTROY", graph)[0] == 0
    view.close()
    os.close(fd)


def test_an_earlier_error_does_not_keep_a_capture_from_ending(guest):
    s, other = _stream(guest), _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("MEMSET", dptr, 64, 1, 1, s)
    guest.post("MEMSET", dptr + MiB, 64, 1, 1, other)  # fails on a stream not capturing
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert status == 0 and not guest.session.graphs.origins
    assert guest.call("GRAPH_GET_NODES", graph, 0)[0] == 1  # the deferred error, now
    assert guest.call("GRAPH_GET_NODES", graph, 0) == (0, (1, b""))
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0


def test_events_no_graph_can_reach_are_destroyed_at_once_while_graphs_exist(guest):
    # A framework holds its graphs for the life of the process and makes and drops
    # events every step: those must not pile up on the executor.
    kept = _node(guest, "GRAPH_CREATE", 0)
    s = _stream(guest)
    for step in range(3):
        status, (event,) = guest.call("EVENT_CREATE", 0)
        guest.post("EVENT_RECORD", event, s)
        guest.post("STREAM_WAIT_EVENT", s, event, 0)
        assert guest.call("EVENT_DESTROY", event)[0] == 0
        assert guest.device.events_destroyed == step + 1
    assert not guest.session.graphs.parked
    # an event a node names, or that a stream records or waits for during a capture
    # (of any stream), is kept until the last graph goes
    named, recorded, waited = (guest.call("EVENT_CREATE", 0)[1][0] for _ in range(3))
    _node(guest, "GRAPH_ADD_EVENT_NODE", kept, 1, 0, named, b"")
    other = _stream(guest)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("EVENT_RECORD", recorded, other)
    guest.post("STREAM_WAIT_EVENT", other, waited, 0)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    for event in (named, recorded, waited):
        assert guest.call("EVENT_DESTROY", event)[0] == 0
    assert guest.device.events_destroyed == 3
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert guest.device.events_destroyed == 3
    assert guest.call("GRAPH_DESTROY", kept)[0] == 0
    assert guest.device.events_destroyed == 6


def test_regions_no_graph_can_reach_are_unmapped_at_once_while_graphs_exist(guest):
    # With memfd regions each pinned allocation is a region of its own: a program
    # holding a graph for good must not run the budget dry by freeing pinned memory.
    kept = _node(guest, "GRAPH_CREATE", 0)
    s, other = _stream(guest), _stream(guest)
    dptr = guest.alloc(MiB)
    region, view, fd = _region(guest)
    guest.post("MEMCPY_HTOD_REGION", dptr, region, 0, 0, 64, s)
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert guest.call("REGION_DETACH", region)[0] == 0
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    view.close()
    os.close(fd)
    # one a node names, one a copy names while a capture is under way (on any stream)
    (named, v1, f1), (copied, v2, f2) = _region(guest), _region(guest)
    _node(guest, "GRAPH_ADD_MEMCPY_NODE", kept, 1, named, dptr, 0, 64, b"")
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("MEMCPY_DTOH_REGION", copied, 0, 0, dptr, 64, other)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert guest.call("REGION_DETACH", named)[0] == 0
    assert guest.call("REGION_DETACH", copied)[0] == 0
    assert guest.executor_regions.budget.used == 8 * MiB
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert guest.executor_regions.budget.used == 8 * MiB
    assert guest.call("GRAPH_DESTROY", kept)[0] == 0
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    for v, f in ((v1, f1), (v2, f2)):
        v.close()
        os.close(f)


def test_a_failed_frame_on_the_legacy_stream_during_a_capture_keeps_the_session(guest):
    # A capture on a blocking stream makes the driver refuse capture queries on the
    # legacy stream (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): judging which capture a failed
    # frame belonged to must not end the session over it.
    status, (blocking,) = guest.call("STREAM_CREATE", 0)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", blocking, GLOBAL)[0] == 0
    guest.post("MEMSET", dptr + MiB, 64, 1, 1, 1)  # refused, on the legacy stream
    status, why = guest.call("PING")
    assert status == 1 and "allocation" in why
    status, (graph,) = guest.call("STREAM_END_CAPTURE", blocking)
    assert status == 0 and guest.call("GRAPH_DESTROY", graph)[0] == 0


def test_capture_queries_that_ask_no_nodes_give_no_node_handles(guest, monkeypatch):
    # A framework's allocator asks whether the stream captures on every allocation
    # during a capture, with no use for its dependencies: those queries must not use up
    # the connection's node handles (which stay as long as their graph).
    monkeypatch.setattr(graphs, "MAX_NODES", 8)
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    status, (cid, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    for i in range(20):
        guest.post("MEMSET", dptr + 64 * i, 64, i, 1, s)
        assert guest.call("STREAM_CAPTURE_INFO", s, 0) == (0, (1, 0, cid, graph, b""))
    assert not guest.session.graphs.nodes.objects
    status, (st, _, cid2, graph2, nodes) = guest.call("STREAM_CAPTURE_INFO", s, 1)
    assert status == 0 and (st, cid2, graph2) == (1, cid, graph) and len(nodes) == 8
    assert len(guest.session.graphs.nodes.objects) == 1
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0


def test_a_capture_the_driver_did_not_end_stays_tracked(guest, monkeypatch):
    # What a capture may copy to is kept mapped only while the executor knows the
    # capture is under way: an end the driver refuses without ending it (another
    # thread's, say) must not let that go.
    region, view, fd = _region(guest)
    s = _stream(guest)
    dptr = guest.alloc(MiB)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    ends = guest.device.stream_end_capture

    def refused_once(stream):
        monkeypatch.setattr(guest.device, "stream_end_capture", ends)
        raise CudaError(908, "fake cuStreamEndCapture: not the capturing thread")

    monkeypatch.setattr(guest.device, "stream_end_capture", refused_once)
    assert guest.call("STREAM_END_CAPTURE", s)[0] == 908
    assert guest.call("STREAM_CAPTURE_INFO", s, 0)[1][0] == 1  # still capturing
    guest.post("MEMCPY_DTOH_REGION", region, 0, 0, dptr, 64, s)
    assert guest.call("REGION_DETACH", region)[0] == 0
    assert guest.device.registered  # parked
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    assert status == 0
    exec_ = _node(guest, "GRAPH_INSTANTIATE", graph, 0)
    guest.post("GRAPH_LAUNCH", exec_, s)  # writes the region, still mapped
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    view.close()
    os.close(fd)


def test_a_capture_begun_but_not_confirmed_is_ended(guest, monkeypatch):
    s = _stream(guest)
    monkeypatch.setattr(guest.device, "stream_capture_info",
                        lambda stream: (0, 0, None, []))  # the driver says: none
    status, why = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    assert status == 901, why
    assert not guest.device.captures and guest.device.graphs_alive == 0
    assert not guest.session.graphs.graphs.objects


def test_an_instantiated_graph_is_charged_what_it_takes_of_device_memory():
    # A driver whose instantiations take device memory (the H200's took none for a graph
    # this small; larger ones, and other drivers, may): the session charges what it took.
    GRAPH_EXEC_BYTES = 2 << 20

    class Quota:
        def __init__(self, limit):
            self.limit, self.used = limit, 0

        def reserve(self, n):
            if self.used + n > self.limit:
                raise CudaError(2, f"the slice's {self.limit} bytes are in use")
            self.used += n

        def release(self, n):
            self.used -= n

        def usage(self):
            return self.used

    quota = Quota(3 * GRAPH_EXEC_BYTES)
    g = Guest()
    g.device.exec_bytes = GRAPH_EXEC_BYTES
    g.session.quota = quota
    s = _stream(g)
    assert g.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    g.post("MEMSET", g.alloc(4096), 64, 1, 1, s)
    status, (graph,) = g.call("STREAM_END_CAPTURE", s)
    used = quota.used  # the allocation's charge
    execs = []
    while True:
        status, got = g.call("GRAPH_INSTANTIATE", graph, 0)
        if status:
            break
        execs.append(got[0])
    assert status == 2 and "instantiated graph takes" in got
    assert quota.used == used + len(execs) * GRAPH_EXEC_BYTES <= quota.limit
    assert g.device.graph_bytes == len(execs) * GRAPH_EXEC_BYTES  # the refused one is gone
    for e in execs:
        assert g.call("GRAPH_EXEC_DESTROY", e)[0] == 0
    assert quota.used == used
    execs = [g.call("GRAPH_INSTANTIATE", graph, 0)[1][0] for _ in range(2)]
    g.close()
    assert quota.used == 0 and g.device.graph_bytes == 0


def test_captures_hold_a_bounded_number_of_operations(guest, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_CAPTURED_FRAMES", 50)
    s = _stream(guest)
    dptr = guest.alloc(4096)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    for i in range(60):
        guest.post("MEMSET", dptr, 64, i, 1, s)
    status, why = guest.call("PING")  # the 51st memset's refusal, owed
    assert status == 2 and "operations in captures" in why
    assert guest.call("STREAM_END_CAPTURE", s)[0] == 901  # no graph short of its work
    # a new capture starts counting again
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    for i in range(10):
        guest.post("MEMSET", dptr, 64, i, 1, s)
    assert guest.call("STREAM_END_CAPTURE", s)[0] == 0


def test_a_graph_launched_into_a_capture_is_refused(guest):
    s, s2 = _stream(guest), _stream(guest)
    assert guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
    guest.post("MEMSET", guest.alloc(4096), 64, 1, 1, s)
    status, (graph,) = guest.call("STREAM_END_CAPTURE", s)
    exec_ = _node(guest, "GRAPH_INSTANTIATE", graph, 0)
    assert guest.call("STREAM_BEGIN_CAPTURE", s2, GLOBAL)[0] == 0
    guest.post("GRAPH_LAUNCH", exec_, s2)
    status, why = guest.call("PING")
    assert status == 900 and "child graph" in why
    assert guest.call("STREAM_END_CAPTURE", s2)[0] == 901
    guest.post("GRAPH_LAUNCH", exec_, s)  # outside a capture it runs
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0


def test_after_an_update_nodes_of_both_graphs_name_the_instantiations(guest):
    source = b'extern "C" __global__ void saxpy(float a, float* x, float* y, int n) {}\0'
    guest.seq += 1
    guest.sock.sendall(frame("MODULE_LOAD_DATA", seq=guest.seq, payload=source))
    _, _, _, status, body = read_reply(guest.sock)
    (module,) = codec.REPLY[P.OP["MODULE_LOAD_DATA"]].decode(body)
    function = _node(guest, "MODULE_GET_FUNCTION", module, "saxpy")
    x, y = guest.alloc(4096), guest.alloc(4096)
    params = struct.pack("<f4xQQi", 2.0, x, y, 16)
    made = []
    for _ in range(3):
        graph = _node(guest, "GRAPH_CREATE", 0)
        node = _node(guest, "GRAPH_ADD_KERNEL_NODE", graph, function, 1, 1, 1, 32, 1, 1, 0,
                     b"", params)
        made.append((graph, node))
    exec_ = _node(guest, "GRAPH_INSTANTIATE", made[0][0], 0)
    assert guest.call("GRAPH_EXEC_UPDATE", exec_, made[1][0])[0] == 0
    for graph, node in made[:2]:  # the graph it was made from, and the update's
        assert guest.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, node, function,
                          1, 1, 1, 32, 1, 1, 0, params)[0] == 0
    assert guest.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, made[2][1], function,
                      1, 1, 1, 32, 1, 1, 0, params)[0] == 1  # an unrelated graph's


def test_a_flood_of_dependencies_is_refused_whole(guest):
    graph = _node(guest, "GRAPH_CREATE", 0)
    node = _node(guest, "GRAPH_ADD_EMPTY_NODE", graph, b"")
    flood = struct.pack("<Q", node) * (graphs.MAX_QUERY_NODES + 1)
    status, why = guest.call("GRAPH_ADD_EMPTY_NODE", graph, flood)
    assert status == 1 and "dependencies" in why
    status, why = guest.call("GRAPH_ADD_DEPENDENCIES", graph, flood, flood)
    assert status == 1
    assert guest.call("GRAPH_GET_NODES", graph, 0) == (0, (1, b""))  # nothing was added


def _saxpy_function(g: Guest) -> int:
    ptx = b".version 8.0\n.target sm_90\n.visible .entry saxpy()\n{\n ret;\n}\n\0"
    g.seq += 1
    g.sock.sendall(frame("MODULE_LOAD_DATA", seq=g.seq, payload=ptx))
    _, _, _, status, body = read_reply(g.sock)
    assert status == 0
    (module,) = codec.REPLY[P.OP["MODULE_LOAD_DATA"]].decode(body)
    status, (function,) = g.call("MODULE_GET_FUNCTION", module, "saxpy")
    assert status == 0
    return function


def test_memory_a_graph_writes_is_freed_only_when_the_graph_goes(guest):
    s = _stream(guest)
    written, elsewhere = guest.alloc(MiB), guest.alloc(MiB)
    x, y = guest.alloc(4096), guest.alloc(4096)
    function = _saxpy_function(guest)
    status, (_, graph) = guest.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)
    guest.post("MEMSET", written + 64, 8, 0x5A, 1, s)
    # a kernel whose parameters point into x and y (saxpy(a, x, y, n))
    guest.post("LAUNCH_KERNEL", function, 1, 1, 1, 32, 1, 1, 0, s,
               struct.pack("<f4xQQi", 2.0, x, y + 16, 8))
    assert guest.call("STREAM_END_CAPTURE", s) == (0, (graph,))
    status, (exec_,) = guest.call("GRAPH_INSTANTIATE", graph, 0)
    assert status == 0
    device = guest.device
    for ptr in (written, x, y, elsewhere):
        assert guest.call("MEM_FREE", ptr)[0] == 0  # the guest's handle goes at once ...
    # ... memory no graph names is given back now; what the graph writes stays
    assert {written, x, y} <= set(device.mem) and elsewhere not in device.mem
    status, why = guest.call("MEM_FREE", written)
    assert status == P.CUDA_ERROR_INVALID_VALUE  # gone for the guest: freed twice
    guest.post("GRAPH_LAUNCH", exec_, s)  # a replay writes memory still allocated
    assert guest.call("STREAM_SYNCHRONIZE", s)[0] == 0
    assert guest.call("GRAPH_EXEC_DESTROY", exec_)[0] == 0
    assert {written, x, y} <= set(device.mem)  # the graph itself still names them
    assert guest.call("GRAPH_DESTROY", graph)[0] == 0
    assert not {written, x, y} & set(device.mem)
