"""One connection's graph memory: allocation and free nodes, and what their memory costs.

An allocation node (cuGraphAddMemAllocNode, or cuMemAllocAsync on a capturing stream)
has an address the driver fixes for its graph's life; a launch of an instantiation
makes each of its allocations *live* (the driver maps memory there) until a free node,
cuMemFree or cuMemFreeAsync frees it, or the next launch frees it first
(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH). The book keeps, per connection:

- every address its allocation nodes returned, as a range copies, memsets and nodes
  may name (``ranges``, mirrored to the C loop) for as long as a graph or
  instantiation of this connection has its node, or it is live: another connection's
  graph may be given the same addresses after that, so they are never named again;
- what each graph and instantiation allocates and frees, to follow which
  allocations are live (a launch's, freed by another graph's launch or by a free
  call), so that when the connection goes its live allocations are freed, and an
  address not live is never handed to cuMemFree (it may be another's by then).

Quota: graph memory is device memory of the slice. A connection is charged
``max(allocations, pool)``, where *allocations* is what its instantiations allocate
(each allocation rounded up to whole granules, as the driver maps it) and what is
live of instantiations already destroyed, and *pool* the driver's
CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT where this is the only connection of the executor
holding graph memory (the driver's pool is the process's, and keeps memory until a
cuDeviceGraphMemTrim: a destroyed instantiation's memory stays charged until then).
The charge is taken at instantiation, refused there past the quota
(CUDA_ERROR_OUT_OF_MEMORY, nothing instantiated), and settled again at trims, at
instantiation destroys and at frees.

Must not import CUDA (the device does every call) and must not touch other
connections' memory.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.host.executor.tables import Allocations
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

GRANULE = 2 << 20  # the driver maps graph memory in whole granules (2 MiB on current GPUs)
MAX_GRAPH_ALLOCATIONS = 1 << 16  # allocation nodes a connection's graphs hold at once
MAX_SIZE = 1 << 48  # bytes one allocation node may ask (more than any GPU has)
AUTO_FREE_ON_LAUNCH = 1  # CUgraphInstantiate_flags
USED_CURRENT, USED_HIGH, RESERVED_CURRENT, RESERVED_HIGH = 0, 1, 2, 3  # CUgraphMem_attribute
NODE_MEM_ALLOC, NODE_MEM_FREE = 10, 11  # CUgraphNodeType

# The books of every connection of this executor that holds graph memory: the driver's
# pool figure is the process's, so it is one connection's only when no other has any.
_HOLDERS: "weakref.WeakSet[GraphMemory]" = weakref.WeakSet()
_HOLDERS_LOCK = threading.Lock()


def rounded(size: int) -> int:
    return -(-size // GRANULE) * GRANULE


class _Alloc:
    __slots__ = ("size", "refs", "live")

    def __init__(self, size: int):
        self.size, self.refs, self.live = size, 0, False


class GraphMemory:
    """The graph memory of one connection (module docstring)."""

    def __init__(self, device, charge: Callable[[int], None],
                 uncharge: Callable[[int], None],
                 accounted: Callable[[], bool] = lambda: True):
        self.device, self._charge, self._uncharge = device, charge, uncharge
        self.accounted = accounted
        self.allocs: dict[int, _Alloc] = {}  # address -> its allocation
        self.ranges = Allocations()  # their ranges, for copies' checks (and the C loop)
        # graph or instantiation ("graph", h) / ("exec", h) -> (its allocations, its frees)
        self.held: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        self.auto_free: set[int] = set()  # instantiations made with AUTO_FREE_ON_LAUNCH
        self.charged = 0

    # -- nodes ---------------------------------------------------------------------

    def has_nodes(self, graph: int) -> bool:
        allocs, frees = self.held.get(("graph", graph), ((), ()))
        return bool(allocs or frees)

    def check_size(self, size: int) -> None:
        if not size or size > MAX_SIZE:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE if not size else
                            P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"a graph allocation of {size} bytes")
        if len(self.allocs) >= MAX_GRAPH_ALLOCATIONS:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"a connection's graphs hold at most "
                            f"{MAX_GRAPH_ALLOCATIONS} allocations at once")

    def check_free(self, dptr: int, graph: int | None = None) -> None:
        """An address an allocation node of this connection returned, freed once per
        graph (CUDA_ERROR_INVALID_VALUE otherwise, as the driver answers)."""
        if dptr not in self.allocs:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"0x{dptr:x} is not an address an "
                            "allocation node of this process's graphs returned")
        if graph is not None and dptr in self.held.get(("graph", graph), ((), ()))[1]:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"0x{dptr:x} is freed twice in "
                            "one graph")

    def allocated(self, graph: int, dptr: int, size: int) -> None:
        """An allocation node of ``graph`` returned ``dptr``."""
        a = self.allocs.get(dptr)
        if a is None:
            a = self.allocs[dptr] = _Alloc(size)
            self.ranges.add(dptr, size)
        elif size > a.size:  # the driver gave the address again, to a larger one
            a.size = size
            self.ranges.remove(dptr)
            self.ranges.add(dptr, size)
        a.refs += 1
        self.held.setdefault(("graph", graph), ([], []))[0].append(dptr)
        with _HOLDERS_LOCK:
            _HOLDERS.add(self)

    def freed_in(self, graph: int, dptr: int) -> None:
        self.held.setdefault(("graph", graph), ([], []))[1].append(dptr)

    # -- instantiations and launches -------------------------------------------------

    def instantiated(self, graph: int, exec_: int, flags: int) -> None:
        """``exec_`` was made of ``graph``: it holds its allocations; charged (or, past
        the quota, refused: the caller destroys it)."""
        allocs, frees = self.held.get(("graph", graph), ([], []))
        self.held[("exec", exec_)] = (list(allocs), list(frees))
        for dptr in allocs:
            self.allocs[dptr].refs += 1
        if flags & AUTO_FREE_ON_LAUNCH:
            self.auto_free.add(exec_)
        try:
            self.settle(grow=True)
        except CudaError:
            self.forget(("exec", exec_))
            raise

    def holds_memory(self, exec_: int) -> bool:
        allocs, frees = self.held.get(("exec", exec_), ((), ()))
        return bool(allocs or frees)

    def launched(self, exec_: int) -> None:
        """A launch of ``exec_`` went to the driver: what it frees is no longer live,
        what it allocates and does not free is."""
        entry = self.held.get(("exec", exec_))
        if entry is None:
            return
        allocs, frees = entry
        for dptr in frees:
            a = self.allocs.get(dptr)
            if a is not None:
                a.live = False
        for dptr in allocs:
            if dptr not in frees:
                self.allocs[dptr].live = True

    def freed(self, dptr: int) -> None:
        """cuMemFree or cuMemFreeAsync of a live allocation went to the driver."""
        a = self.allocs.get(dptr)
        if a is not None:
            a.live = False
            self._drop_if_unused(dptr)

    def is_allocation(self, dptr: int) -> bool:
        return dptr in self.allocs

    # -- the graphs and instantiations going -------------------------------------------

    def forget(self, key: tuple[str, int]) -> None:
        """A graph or instantiation is gone (destroyed by the guest or the driver)."""
        allocs, _ = self.held.pop(key, ([], []))
        if key[0] == "exec":
            self.auto_free.discard(key[1])
        for dptr in allocs:
            a = self.allocs.get(dptr)
            if a is not None:
                a.refs -= 1
                self._drop_if_unused(dptr)

    def _drop_if_unused(self, dptr: int) -> None:
        a = self.allocs[dptr]
        if a.refs <= 0 and not a.live:
            del self.allocs[dptr]
            self.ranges.remove(dptr)

    # -- the charge ---------------------------------------------------------------------

    def structural(self) -> int:
        """What this connection's instantiations allocate, and what is live beyond them."""
        counted: set[int] = set()
        total = 0
        for (kind, _), (allocs, _) in self.held.items():
            if kind == "exec":
                for dptr in allocs:
                    total += rounded(self.allocs[dptr].size)
                    counted.add(dptr)
        for dptr, a in self.allocs.items():
            if a.live and dptr not in counted:
                total += rounded(a.size)
        return total

    def settle(self, grow: bool = False) -> None:
        """Give back what is no longer held (the module docstring says what is); where
        ``grow``, charge what more is: CUDA_ERROR_OUT_OF_MEMORY past the quota (nothing
        changed then). Only an instantiation grows the charge: a trim, a destroy or a
        free never fails for the quota."""
        if not self.accounted():
            return
        want = self.structural()
        with _HOLDERS_LOCK:
            alone = all(h is self or not h.allocs for h in _HOLDERS)
        if alone and (self.allocs or self.charged):
            try:
                want = max(want, self.device.graph_mem_attribute(USED_CURRENT))
            except CudaError as exc:
                log.debug("graph memory figure: %s", exc)
        if want > self.charged and not grow:
            return
        if want > self.charged:
            self._charge(want - self.charged)
        elif want < self.charged:
            self._uncharge(self.charged - want)
        self.charged = want

    # -- the end -------------------------------------------------------------------------

    def release_all(self) -> None:
        """The connection is gone (its graphs and instantiations destroyed before): live
        allocations are freed, the pool trimmed, the charge given back."""
        for dptr, a in list(self.allocs.items()):
            if a.live:
                try:
                    self.device.mem_free(dptr)
                except CudaError as exc:
                    log.debug("freeing graph allocation 0x%x: %s", dptr, exc)
        self.allocs.clear()
        self.ranges.clear()
        self.held.clear()
        self.auto_free.clear()
        try:
            self.device.graph_mem_trim()
        except CudaError as exc:
            log.debug("trimming graph memory: %s", exc)
        if self.charged:
            self._uncharge(self.charged)
        self.charged = 0
        with _HOLDERS_LOCK:
            _HOLDERS.discard(self)


def node_params(device, node: Any) -> tuple[int, int, int]:
    """(CUgraphNodeType, address, size) of a node: address and size for an allocation
    node, the address for a free node, zeros otherwise."""
    kind = device.graph_node_type(node)
    if kind == NODE_MEM_ALLOC:
        return (kind, *device.graph_mem_alloc_params(node))
    if kind == NODE_MEM_FREE:
        return kind, device.graph_mem_free_params(node), 0
    return kind, 0, 0
