"""One connection's stream captures, CUDA graphs and instantiated graphs.

The guest's streams are the executor's real streams, so a capture is the driver's
own: the one-way frames that follow a STREAM_BEGIN_CAPTURE are served as ever and
land in the graph. This module keeps the handles (graphs, instantiations, the
nodes a capture query names) and what a graph could still reach after the guest
let go of it:

- a graph may copy to or from the connection's regions and record
  its events, and its kernels are its modules' code; so while the connection holds
  any graph, instantiation or capture, giving those back is *parked* (the guest's
  handle goes at once, the host object when the last graph has gone), so a replay
  never reaches memory the executor has unmapped or code it has unloaded. Events,
  regions, allocations (cuMemFree) and rooms of the VM's device region (REGION_FREE,
  which would go to the VM's other processes) are parked only where a graph may
  reach them (``events``, ``regions``, ``allocations``, ``rooms``: a kernel's
  parameters are read as pointers for it, every aligned 8 bytes that falls in an
  allocation): a framework holds its graphs for good and makes and drops events
  every step, and with memfd regions each pinned allocation is a region;
- a copy whose bytes the executor stages (payload copies on the socket) must not be
  captured: the graph would replay from a staging buffer that has been reused since.
  ``capturing(stream)`` says when to refuse one;
- a one-way frame meant for a capture that fails (its error waits for a later call)
  invalidates that capture (``invalidate``), so it never ends as a graph the guest
  believes holds that frame's work.

A clone counts its nodes as its graph does, and remembers that graph: only nodes of it
are found in the clone. A conditional node's body graphs are the driver's, owned by the
node: they get handles as graphs do (nodes are added to them), are counted with the
graph their node is in when it is instantiated or cloned, go with it, and are never
destroyed, instantiated or cloned on their own; a conditional handle is the driver's
value, and a conditional node may name only one made for its graph or a graph it is a
body of (so a guest never hands the driver a value it did not make).

The serving thread's capture mode is relaxed (``CudaDevice.bind_thread``): several
guest threads, and the executor's own calls, share that one thread, so the driver's
per-thread rules cannot be applied here and are not.

Must not import CUDA; every driver call goes through the ``GpuDevice``.
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor import admission
from hvgpu.host.executor.tables import Handles
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

MAX_GRAPHS = 4096  # graphs and instantiations a connection may hold at once
MAX_NODES = P.MAX_GRAPH_NODES  # node handles a connection may have been given
MAX_QUERY_NODES = P.MAX_QUERY_NODES  # dependencies one capture query answers
MAX_BODIES = P.MAX_CONDITIONAL_BODIES  # body graphs of one conditional node
MAX_CONDITIONAL_HANDLES = 65536  # conditional handles a connection may make
COND_ASSIGN_DEFAULT = 1  # CU_GRAPH_COND_ASSIGN_DEFAULT, cuGraphConditionalHandleCreate's flag
COND_IF, COND_WHILE, COND_SWITCH = 0, 1, 2  # CUgraphConditionalNodeType
# One-way frames a connection may send while its captures are under way: each becomes a
# node the driver keeps in the executor's memory (a training step's graph has thousands).
MAX_CAPTURED_FRAMES = 1 << 20
CAPTURE_MODES = (0, 1, 2)  # global, thread-local, relaxed
STATUS_NONE, STATUS_ACTIVE, STATUS_INVALIDATED = 0, 1, 2


class Graphs:
    def __init__(self, device, budget: admission.NodeBudget | None = None):
        self.device = device
        # Nodes this connection holds, counted against it and against the executor's
        # budget: ("graph", handle) or ("exec", handle) -> its nodes, and the frames of
        # captures under way (their graphs are counted whole when they end).
        self.budget = budget or admission.PROCESS_GRAPH_NODES
        self.held: dict[tuple[str, int], int] = {}
        self.in_capture = 0
        self.graphs = Handles("graph")
        self.execs = Handles("graph exec")
        self.nodes = Handles("graph node")
        self._graph_of_value: dict[int, int] = {}  # the driver's CUgraph -> handle
        self._node_of_value: dict[int, int] = {}
        self._graph_nodes: dict[int, set[int]] = {}  # graph handle -> its node handles
        self.origins: dict[int, int] = {}  # stream handle capturing -> its graph's handle
        self.captured_frames = 0  # one-way frames since no capture was under way
        # instantiation -> the graph it was made from, and those it was updated from: a
        # node of any names one of its nodes (the driver judges which it accepts)
        self._exec_graph: dict[int, set[int]] = {}
        self._clone_of: dict[int, int] = {}  # a clone's handle -> the graph it copies
        # Conditional nodes' body graphs: the driver's, owned by the node's graph (they go
        # with it, and are neither destroyed nor instantiated on their own).
        self._bodies: dict[int, list[int]] = {}  # graph -> body graphs of its nodes
        self._body_parent: dict[int, int] = {}  # body graph -> the graph its node is in
        self._cond_handles: dict[int, set[int]] = {}  # graph -> conditional handles made
        self.cond_handles_made = 0
        self.parked: list[tuple[str, Callable[[], None]]] = []
        # Event handles a graph may record or wait for: named by a node, or recorded or
        # waited for while a capture is under way (the C loop serves neither then).
        self.events: set[int] = set()
        # Region ids a graph may copy to or from: named by a node, or by a copy while a
        # capture is under way (the C loop serves none).
        self.regions: set[int] = set()
        # Allocations (their starts) a graph may write or read: named by a copy or memset
        # node, by a kernel node's parameters, or by such work while a capture is under
        # way. Freeing one is parked: a replay must not reach memory given back.
        self.allocations: set[int] = set()
        # Rooms of the VM's device region ((region, room start)) a graph may copy to or
        # from, named as regions are. Giving one back is parked: the region's other
        # connections (the VM's other processes) would be given it while a replay writes it.
        self.rooms: set[tuple[int, int]] = set()
        # The connection's graph memory (graph_memory.GraphMemory), told of each graph and
        # instantiation that goes, so that it knows which allocation nodes are left.
        self.memory = None

    # -- state the session asks about ------------------------------------------

    @property
    def holding(self) -> bool:
        """A graph, an instantiation or a capture exists: releases are parked."""
        return bool(self.graphs.objects or self.execs.objects or self.origins)

    def capturing(self, stream: Any) -> bool:
        """Whether the driver is capturing ``stream`` (only a stream of a connection with
        a capture under way can be: events join streams into captures)."""
        if not self.origins:
            return False
        return self.device.stream_capture_info(stream)[0] != STATUS_NONE

    def count_frame(self) -> None:
        """A one-way frame while a capture is under way; refused past the bound, which
        invalidates the capture its stream is in (the session's rule for failed frames)."""
        self.captured_frames += 1
        if self.captured_frames > MAX_CAPTURED_FRAMES:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"more than {MAX_CAPTURED_FRAMES} "
                            "operations in captures under way at once")
        self._take(1, "an operation captured into a graph")
        self.in_capture += 1

    def refuse_if_capturing(self, stream: Any, what: str) -> None:
        if self.capturing(stream):
            raise CudaError(P.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                            f"{what} on a capturing stream: a graph cannot replay it "
                            "(copy from or to pinned memory, cudaMallocHost, instead)")

    def invalidate(self, stream: Any) -> None:
        """Fail the capture ``stream`` is in, if any: a synchronisation of a capturing
        stream is refused and invalidates its capture, whose end then fails
        (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) and makes no graph."""
        try:
            if self.capturing(stream):
                self.device.stream_synchronize(stream)
        except CudaError:
            # Refused, as meant; or the query was (the legacy stream while a blocking
            # stream captures: it is in no capture then).
            pass

    def event_used(self, event: int) -> None:
        """A stream records or waits for ``event``: a capture under way may take it in."""
        if self.origins:
            self.events.add(event)

    def region_used(self, region: int) -> None:
        """A copy names ``region``: a capture under way may take it in."""
        if self.origins:
            self.regions.add(region)

    def park(self, what: str, release: Callable[[], None]) -> bool:
        """Run ``release`` now (False) or once no graph can reach what it gives back
        (True)."""
        if not self.holding:
            return False
        self.parked.append((what, release))
        return True

    # -- capture -----------------------------------------------------------------

    def begin(self, handle: int, stream: Any, mode: int) -> tuple[int, int]:
        if mode not in CAPTURE_MODES:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"capture mode {mode}")
        self._room()
        if not self.origins:
            self.captured_frames = 0
        self.device.stream_begin_capture(stream, mode)
        try:
            status, cid, graph, _ = self.device.stream_capture_info(stream)
            if status != STATUS_ACTIVE or graph is None:  # the driver would not say why
                raise CudaError(P.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                                "cuStreamBeginCapture: the capture did not start")
        except CudaError:
            # Not left under way untracked: what it captured could reach memory the
            # executor lets go of meanwhile (and the C loop would serve its stream).
            try:
                _quietly(self.device.graph_destroy, self.device.stream_end_capture(stream))
            except CudaError:
                pass
            raise
        gh = self._add_graph(graph)
        self.origins[handle] = gh
        log.debug("capture %d begun on stream %d (mode %d) as graph %d", cid, handle, mode, gh)
        return cid, gh

    def end(self, handle: int, stream: Any) -> int:
        gh = self.origins.pop(handle, None)
        try:
            graph = self.device.stream_end_capture(stream)
        except CudaError:
            if gh is not None and self._still_capturing(stream):
                self.origins[handle] = gh  # not ended: still tracked as under way
            elif gh is not None:  # the driver destroyed what it had captured
                self._forget_graph(gh)
                self._unpark()
            self._captures_over()
            raise
        if gh is None:  # not begun here; the driver ended it all the same
            gh = self._add_graph(graph)
        else:
            old = self.graphs.objects[gh]
            if self.device.handle_value(graph) != self.device.handle_value(old):
                self._graph_of_value.pop(self.device.handle_value(old), None)
                self.graphs.objects[gh] = graph
                self._graph_of_value[self.device.handle_value(graph)] = gh
        # The graph exists, with the nodes its frames made: counted whole now (its frames
        # were, one by one, while it was under way).
        self._count(("graph", gh), self.device.graph_node_count(graph))
        self._captures_over()
        return gh

    def _captures_over(self) -> None:
        if not self.in_capture:
            return
        # A capture ended (its graph, if any, now counted whole): what is still under way
        # holds the nodes the driver has in its graphs, not every frame since the first
        # capture began (which never went back while captures overlapped).
        under_way = 0
        for gh in self.origins.values():
            graph = self.graphs.objects.get(gh)
            try:
                under_way += self.device.graph_node_count(graph) if graph is not None else 0
            except CudaError:
                return  # not known: the frames stay counted until the captures end
        if under_way < self.in_capture:
            self.budget.give(self.in_capture - under_way)
            self.in_capture = under_way

    def _still_capturing(self, stream: Any) -> bool:
        try:
            return self.device.stream_capture_info(stream)[0] != STATUS_NONE
        except CudaError:
            return False

    def info(self, stream: Any, nodes: bool = True) -> tuple[int, int, int, int, bytes]:
        """The capture ``stream`` is in; its dependency nodes (each given a handle, which
        lasts as long as its graph) only where ``nodes``: a framework's allocator asks on
        every allocation during a capture, with no use for them."""
        status, cid, graph, deps = self.device.stream_capture_info(stream)
        if status != STATUS_ACTIVE:
            return status, 0, cid, 0, b""
        gh = self._graph_of_value.get(self.device.handle_value(graph))
        if gh is None:  # a capture this connection did not begin cannot be on its stream
            raise CudaError(P.CUDA_ERROR_INVALID_HANDLE, "the stream captures into a graph "
                            "this connection does not hold")
        if not nodes:
            return status, 0, cid, gh, b""
        if len(deps) > MAX_QUERY_NODES:
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, f"{len(deps)} dependencies in one "
                            f"capture query (the agent answers up to {MAX_QUERY_NODES})")
        handles = [self._node_handle(gh, n) for n in deps]
        return status, 0, cid, gh, struct.pack(f"<{len(handles)}Q", *handles)

    # -- graphs --------------------------------------------------------------------

    def instantiate(self, graph: int, flags: int) -> int:
        g = self.graphs.get(graph)
        if graph in self.origins.values():
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph {graph} is still being "
                            "captured")
        self._not_a_body(graph, "instantiated")
        self._room()
        nodes = self._total(graph)
        self._take(nodes, f"instantiating a graph of {nodes} nodes")
        try:
            handle = self.execs.add(self.device.graph_instantiate(g, flags))
        except BaseException:
            self.budget.give(nodes)
            raise
        self.held[("exec", handle)] = nodes
        self._exec_graph[handle] = {graph}
        return handle

    def list_nodes(self, graph: int, most: int) -> tuple[int, bytes]:
        nodes = self.device.graph_nodes(self.graphs.get(graph))
        handles = [self._node_handle(graph, n) for n in nodes[:most]]
        return len(nodes), struct.pack(f"<{len(handles)}Q", *handles)

    # -- graphs built node by node -----------------------------------------------------

    def create(self) -> int:
        """cuGraphCreate (the GRAPH_CREATE op refused flags)."""
        self._room()
        return self._add_graph(self.device.graph_create())

    def _editable(self, graph: int) -> Any:
        g = self.graphs.get(graph)
        if graph in self.origins.values():
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph {graph} is being captured: "
                            "nodes are added by its stream")
        return g

    def _deps(self, graph: int, raw: bytes) -> list:
        """The node objects raw names (u64 handles), each a node of this graph."""
        if len(raw) % 8 or len(raw) // 8 > MAX_QUERY_NODES:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{len(raw)} bytes of dependencies")
        mine = self._graph_nodes.get(graph, set())
        out = []
        for (nh,) in struct.iter_unpack("<Q", raw):
            if nh not in mine:
                raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"node {nh} is not a node of "
                                f"graph {graph}")
            out.append(self.nodes.objects[nh])
        return out

    def add_node(self, graph: int, deps: bytes, add: Callable[[Any, list], Any]) -> int:
        """A node made by add(graph, dependency nodes), given a handle of this graph."""
        g = self._editable(graph)
        nodes = self._deps(graph, deps)
        if len(self.nodes.objects) >= MAX_NODES:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection is given at most "
                            f"{MAX_NODES} graph node handles")
        self._take(1, "a graph node")
        try:
            node = add(g, nodes)
        except BaseException:
            self.budget.give(1)
            raise
        key = ("graph", graph)
        self.held[key] = self.held.get(key, 0) + 1
        return self._node_handle(graph, node)

    def add_dependencies(self, graph: int, sources: bytes, targets: bytes) -> None:
        g = self._editable(graph)
        a, b = self._deps(graph, sources), self._deps(graph, targets)
        if len(a) != len(b):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "as many sources as targets")
        if a:
            self.device.graph_add_dependencies(g, a, b)

    def clone(self, graph: int) -> int:
        """cuGraphClone: a graph of this connection, counted as many nodes as graph."""
        g = self.graphs.get(graph)
        if graph in self.origins.values():
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph {graph} is still being "
                            "captured")
        self._not_a_body(graph, "cloned")
        self._room()
        nodes = self._total(graph)
        self._take(nodes, f"cloning a graph of {nodes} nodes")
        try:
            gh = self._add_graph(self.device.graph_clone(g))
        except BaseException:
            self.budget.give(nodes)
            raise
        self.held[("graph", gh)] = nodes
        self._clone_of[gh] = graph
        return gh

    def find_in_clone(self, clone: int, node: int) -> int:
        """cuGraphNodeFindInClone: clone's copy of node, a node of the graph it copies
        (while that graph lives: its nodes' handles go with it)."""
        c = self.graphs.get(clone)
        origin = self._clone_of.get(clone)
        if origin is None or node not in self._graph_nodes.get(origin, ()):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"node {node} is not a node of the "
                            f"graph {clone} was cloned from")
        return self._node_handle(clone, self.device.graph_node_find_in_clone(
            self.nodes.objects[node], c))

    def conditional_handle(self, graph: int, default: int, flags: int) -> int:
        """cuGraphConditionalHandleCreate: the driver's handle value, which this graph's
        conditional nodes (and those of its nodes' bodies) may name."""
        g = self._editable(graph)
        if flags not in (0, COND_ASSIGN_DEFAULT):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"conditional handle flags {flags:#x}")
        if self.cond_handles_made >= MAX_CONDITIONAL_HANDLES:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection makes at most "
                            f"{MAX_CONDITIONAL_HANDLES} conditional handles")
        value = int(self.device.graph_conditional_handle_create(g, default, flags))
        self.cond_handles_made += 1
        self._cond_handles.setdefault(graph, set()).add(value)
        return value

    def add_conditional(self, graph: int, deps: bytes, handle: int, kind: int,
                        size: int) -> tuple[int, bytes]:
        """A conditional node: its handle and the handles of its body graphs."""
        if kind not in (COND_IF, COND_WHILE, COND_SWITCH):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"conditional node type {kind}")
        if not 1 <= size <= MAX_BODIES:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"a conditional node of {size} bodies "
                            f"(1 to {MAX_BODIES})")
        g, owner = graph, None
        while g is not None and owner is None:  # made for this graph or one it is in
            if handle in self._cond_handles.get(g, ()):
                owner = g
            g = self._body_parent.get(g)
        if owner is None:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"conditional handle {handle:#x} was "
                            f"not made for graph {graph} or a graph it is a body of")
        if len(self.graphs.objects) + len(self.execs.objects) + size > MAX_GRAPHS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection holds at most "
                            f"{MAX_GRAPHS} graphs and instantiated graphs")
        bodies: list = []

        def add(g, d):
            node, made = self.device.graph_add_conditional(g, d, handle, kind, size)
            bodies.extend(made)
            return node
        nh = self.add_node(graph, deps, add)
        handles = []
        for body in bodies:
            bh = self._add_graph(body)
            self._body_parent[bh] = graph
            self._bodies.setdefault(graph, []).append(bh)
            handles.append(bh)
        return nh, struct.pack(f"<{len(handles)}Q", *handles)

    def _family(self, graph: int) -> list[int]:
        """graph and the body graphs of its conditional nodes, theirs, and so on."""
        out, todo = [], [graph]
        while todo:
            g = todo.pop()
            out.append(g)
            todo.extend(self._bodies.get(g, ()))
        return out

    def _total(self, graph: int) -> int:
        return sum(self.held.get(("graph", g), 0) for g in self._family(graph))

    def _not_a_body(self, graph: int, what: str) -> None:
        if graph in self._body_parent:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph {graph} is a conditional "
                            f"node's body: it is {what} with the graph its node is in")

    def exec_node(self, exec_: int, node: int) -> tuple[Any, Any]:
        """An instantiation and a node of the graph it was made from."""
        ex = self.execs.get(exec_)
        if not any(node in self._graph_nodes.get(b, ()) for g in self._exec_graph.get(exec_, ())
                   for b in self._family(g)):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"node {node} is not a node of the "
                            "graph this instantiation was made from")
        return ex, self.nodes.objects[node]

    def update(self, exec_: int, graph: int) -> tuple[int, int, int]:
        ex, g = self.execs.get(exec_), self._editable(graph)
        result, node = self.device.graph_exec_update(ex, g)
        nh = 0
        if node is not None:
            nh = self._node_of_value.get(self.device.handle_value(node), 0)
        if result:
            raise CudaError(P.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                            f"cuGraphExecUpdate: result {result} (node {nh})")
        self._exec_graph.setdefault(exec_, set()).add(graph)
        return result, 0, nh

    def launch(self, exec_: int, stream: Any) -> None:
        self.device.graph_launch(self.execs.get(exec_), stream)

    def upload(self, exec_: int, stream: Any) -> None:
        self.device.graph_upload(self.execs.get(exec_), stream)

    def destroy(self, graph: int) -> None:
        g = self.graphs.get(graph)
        self._not_a_body(graph, "destroyed")
        if graph in self.origins.values():
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"graph {graph} is still being "
                            "captured; end the capture first")
        self.device.graph_destroy(g)
        self._forget_graph(graph)
        self._unpark()

    def destroy_exec(self, exec_: int) -> None:
        self.device.graph_exec_destroy(self.execs.get(exec_))
        self.execs.pop(exec_)
        if self.memory is not None:
            self.memory.forget(("exec", exec_))
        self.budget.give(self.held.pop(("exec", exec_), 0))
        self._exec_graph.pop(exec_, None)
        self._unpark()

    def release_all(self, stream_of: Callable[[int], Any]) -> None:
        """The connection is closing: captures end, instantiations and graphs go, then
        what was parked."""
        for handle in list(self.origins):
            try:
                self.end(handle, stream_of(handle))
            except CudaError:
                pass
        # Any left, the driver would not end: such a capture never becomes a graph, so
        # nothing can replay what it took in.
        self.origins.clear()
        self._captures_over()
        self.budget.give(sum(self.held.values()))
        self.held.clear()
        for table, destroy in ((self.execs, self.device.graph_exec_destroy),
                               (self.graphs, self.device.graph_destroy)):
            for handle, obj in table.objects.items():
                if table is self.execs or handle not in self._body_parent:  # bodies go
                    _quietly(destroy, obj)                                 # with their node
            table.objects.clear()
        self._graph_of_value.clear()
        self._node_of_value.clear()
        self._graph_nodes.clear()
        self._exec_graph.clear()
        self._clone_of.clear()
        self._bodies.clear()
        self._body_parent.clear()
        self._cond_handles.clear()
        self.nodes.objects.clear()
        self.events.clear()
        self.regions.clear()
        self.allocations.clear()
        self.rooms.clear()
        self._unpark()

    # -- helpers ---------------------------------------------------------------------

    def _room(self) -> None:
        if len(self.graphs.objects) + len(self.execs.objects) >= MAX_GRAPHS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection holds at most "
                            f"{MAX_GRAPHS} graphs and instantiated graphs")

    def _add_graph(self, graph: Any) -> int:
        gh = self.graphs.add(graph)
        self._graph_of_value[self.device.handle_value(graph)] = gh
        self._graph_nodes[gh] = set()
        return gh

    def _take(self, n: int, what: str) -> None:
        """Count ``n`` more nodes against this connection and the executor, or refuse."""
        mine = sum(self.held.values()) + self.in_capture
        if mine + n > admission.GRAPH_NODES_PER_CONNECTION:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"{what}: this connection's graphs hold {mine} nodes, and may "
                            f"hold {admission.GRAPH_NODES_PER_CONNECTION} at once; destroy "
                            "graphs it no longer uses")
        self.budget.take(n, what)

    def _count(self, key: tuple[str, int], n: int) -> None:
        """Nodes that exist already, whatever the bounds: counted, never refused."""
        self.budget.give(self.held.get(key, 0))
        self.budget.count(n)
        self.held[key] = n

    def graph_handle(self, graph: Any) -> int | None:
        """This connection's handle of the driver's graph ``graph`` (a capture's), or None."""
        return self._graph_of_value.get(self.device.handle_value(graph))

    def _forget_graph(self, gh: int) -> None:
        if self.memory is not None:
            self.memory.forget(("graph", gh))
        for body in self._bodies.pop(gh, ()):  # the driver destroyed them with their node's
            self._forget_graph(body)
        self._body_parent.pop(gh, None)
        self._cond_handles.pop(gh, None)
        self.budget.give(self.held.pop(("graph", gh), 0))
        self._clone_of.pop(gh, None)
        graph = self.graphs.objects.pop(gh, None)
        if graph is not None:
            self._graph_of_value.pop(self.device.handle_value(graph), None)
        for nh in self._graph_nodes.pop(gh, ()):
            node = self.nodes.objects.pop(nh, None)
            if node is not None:
                self._node_of_value.pop(self.device.handle_value(node), None)

    def _node_handle(self, gh: int, node: Any) -> int:
        value = self.device.handle_value(node)
        nh = self._node_of_value.get(value)
        if nh is None:
            if len(self.nodes.objects) >= MAX_NODES:
                raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection is given at most "
                                f"{MAX_NODES} graph node handles")
            nh = self.nodes.add(node)
            self._node_of_value[value] = nh
            self._graph_nodes[gh].add(nh)
        return nh

    def _unpark(self) -> None:
        if self.holding:
            return
        self.events.clear()  # no graph is left to reach them
        self.regions.clear()
        self.allocations.clear()
        self.rooms.clear()
        if not self.parked:
            return
        parked, self.parked = self.parked, []
        log.debug("the last graph is gone: releasing %d parked objects", len(parked))
        for what, release in parked:
            _quietly(release, what=what)


def _quietly(fn, *args, what: str = "") -> None:
    try:
        fn(*args)
    except CudaError as exc:
        log.debug("releasing %s: %s", what or getattr(fn, "__name__", "an object"), exc)
