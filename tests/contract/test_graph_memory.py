"""Graph memory nodes as graph_memory.py and the graph ops drive them.

The executor's books lean on these of the driver: an allocation node's address is
known when the node is made and stays the graph's; a launch makes it live (copies reach
it) until a free node, cuMemFree or cuMemFreeAsync; a relaunch with it unfreed fails
at the launch (CUDA_ERROR_INVALID_VALUE) unless instantiated with
CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH; the pool's figures grow at the
launch, not at instantiation, and a free gives nothing back until a trim; a free node
takes only an allocation node's address; a stream capture makes cuMemAllocAsync and
cuMemFreeAsync such nodes."""

from __future__ import annotations

import numpy as np
import pytest

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P
from tests.contract.backends import status

MiB = 1 << 20
SIZE = 4 * MiB
USED, USED_HIGH, RESERVED, RESERVED_HIGH = 0, 1, 2, 3
MEM_ALLOC, MEM_FREE = 10, 11
AUTO_FREE = 1
_RELAXED = 2


@pytest.fixture
def stream(dev):
    s = dev.stream_create(1)
    yield s
    dev.stream_synchronize(s)
    dev.stream_destroy(s)


@pytest.fixture
def host(dev):
    addr, view = dev.host_alloc(SIZE)
    yield addr, np.frombuffer(view, dtype=np.uint8)
    dev.host_free(addr)


def _clean(dev):
    dev.synchronize()
    dev.graph_mem_trim()


def test_an_allocation_node_is_live_after_a_launch_until_freed(dev, stream, host):
    _clean(dev)
    before = dev.graph_mem_attribute(USED)
    graph = dev.graph_create()
    node, dptr = dev.graph_add_mem_alloc(graph, [], SIZE)
    assert dptr and dev.graph_node_type(node) == MEM_ALLOC
    assert dev.graph_mem_alloc_params(node) == (dptr, SIZE)
    dev.graph_add_memset(graph, [node], dptr, SIZE, 0x11, 1, SIZE, 1)
    exec_ = dev.graph_instantiate(graph, 0)
    try:
        assert dev.graph_mem_attribute(USED) == before  # nothing mapped at instantiation
        dev.graph_launch(exec_, stream)
        dev.stream_synchronize(stream)
        assert dev.graph_mem_attribute(USED) >= before + SIZE
        assert dev.graph_mem_attribute(USED_HIGH) >= dev.graph_mem_attribute(USED)
        addr, view = host
        dev.memcpy_dtoh_async(addr, dptr, SIZE, stream)  # live: copies reach it
        dev.stream_synchronize(stream)
        assert (view == 0x11).all()
        # relaunched with it unfreed: refused at the launch
        assert status(dev.graph_launch, exec_, stream) == P.CUDA_ERROR_INVALID_VALUE
        dev.mem_free(dptr)
        assert dev.graph_mem_attribute(USED) >= before + SIZE  # kept until a trim
        dev.graph_launch(exec_, stream)  # freed: it may run again
        dev.stream_synchronize(stream)
        dev.pool_free(dptr, stream)  # cuMemFreeAsync frees it too
        dev.stream_synchronize(stream)
    finally:
        dev.graph_exec_destroy(exec_)
        dev.graph_destroy(graph)
    dev.graph_mem_trim()
    assert dev.graph_mem_attribute(USED) == before


def test_auto_free_on_launch_frees_what_the_last_launch_left(dev, stream):
    _clean(dev)
    graph = dev.graph_create()
    _, dptr = dev.graph_add_mem_alloc(graph, [], SIZE)
    exec_ = dev.graph_instantiate(graph, AUTO_FREE)
    try:
        for _ in range(3):
            dev.graph_launch(exec_, stream)
            dev.stream_synchronize(stream)
        dev.mem_free(dptr)
    finally:
        dev.graph_exec_destroy(exec_)
        dev.graph_destroy(graph)
    dev.graph_mem_trim()


def test_a_free_node_takes_only_an_allocation_nodes_address_once(dev):
    graph = dev.graph_create()
    node, dptr = dev.graph_add_mem_alloc(graph, [], SIZE)
    plain = dev.mem_alloc(SIZE)
    try:
        assert status(dev.graph_add_mem_free, graph, [node], plain) == \
            P.CUDA_ERROR_INVALID_VALUE
        free = dev.graph_add_mem_free(graph, [node], dptr)
        assert dev.graph_node_type(free) == MEM_FREE
        assert dev.graph_mem_free_params(free) == dptr
        assert status(dev.graph_add_mem_free, graph, [free], dptr) == \
            P.CUDA_ERROR_INVALID_VALUE
        # one instantiation at a time, and no clone
        exec_ = dev.graph_instantiate(graph, 0)
        with pytest.raises(CudaError):
            dev.graph_instantiate(graph, 0)
        with pytest.raises(CudaError):
            dev.graph_clone(graph)
        dev.graph_exec_destroy(exec_)
    finally:
        dev.mem_free(plain)
        dev.graph_destroy(graph)


def test_capture_makes_stream_ordered_allocation_nodes(dev, stream, host):
    pool = dev.pool_create(0)
    dev.stream_begin_capture(stream, _RELAXED)
    try:
        dptr = dev.pool_alloc(SIZE, pool, stream)
        dev.memset_async(dptr, 0x22, 1, SIZE, stream)
        addr, view = host
        dev.memcpy_dtoh_async(addr, dptr, SIZE, stream)
        dev.pool_free(dptr, stream)
    finally:
        graph = dev.stream_end_capture(stream)
    kinds = [dev.graph_node_type(n) for n in dev.graph_nodes(graph)]
    assert kinds[0] == MEM_ALLOC and kinds[-1] == MEM_FREE
    assert dev.graph_mem_alloc_params(dev.graph_nodes(graph)[0]) == (dptr, SIZE)
    exec_ = dev.graph_instantiate(graph, 0)
    try:
        for _ in range(2):  # freed in the graph: launched again and again
            view[:] = 0
            dev.graph_launch(exec_, stream)
            dev.stream_synchronize(stream)
            assert (view == 0x22).all()
    finally:
        dev.graph_exec_destroy(exec_)
        dev.graph_destroy(graph)
        dev.pool_destroy(pool)
        dev.graph_mem_trim()


def test_graph_memory_attributes_reset_only_high_marks_to_zero(dev):
    for attr in (USED_HIGH, RESERVED_HIGH):
        dev.graph_mem_set_attribute(attr, 0)
        assert dev.graph_mem_attribute(attr) >= dev.graph_mem_attribute(attr - 1)
    for attr, value in ((USED, 0), (RESERVED, 0), (USED_HIGH, 1)):
        assert status(dev.graph_mem_set_attribute, attr, value) == P.CUDA_ERROR_INVALID_VALUE
