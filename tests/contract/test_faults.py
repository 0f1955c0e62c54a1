"""Faults the session counts on the driver to report: a kernel's illegal address is
sticky (the executor is replaced after one, protocol.STICKY_STATUSES), and a copy
that runs into addresses nothing is mapped at fails. Each runs on a device of its
own: on the driver, in a process of its own, as the fault poisons the context."""

from __future__ import annotations

from hvgpu.virtio import protocol as P
from tests.contract import ptx
from tests.contract.backends import status

ONE = (1, 1, 1)
_READWRITE = 3


def _after_a_fault(dev) -> dict:
    module = dev.module_load(ptx.module(ptx.NOOP, ptx.FAULT))
    fault, noop = dev.module_function(module, "fault"), dev.module_function(module, "noop")
    s = dev.stream(0)
    seen = {"launch": status(dev.launch, fault, ONE, ONE, 0, s, b""),
            "synchronize": status(dev.synchronize)}
    seen.update({"again": status(dev.synchronize),
                 "stream_query": status(dev.stream_query, s),
                 "mem_alloc": status(dev.mem_alloc, 4096),
                 "module_function": status(dev.module_function, module, "noop"),
                 "launch_after": status(dev.launch, noop, ONE, ONE, 0, s, b"")})
    return seen


def test_a_kernel_that_touches_an_illegal_address_poisons_every_later_call(isolated):
    seen = isolated(_after_a_fault)
    assert seen["launch"] in (0, P.CUDA_ERROR_ILLEGAL_ADDRESS), seen  # found at once, or later
    assert {k: v for k, v in seen.items() if k != "launch"} == {
        "synchronize": P.CUDA_ERROR_ILLEGAL_ADDRESS, "again": P.CUDA_ERROR_ILLEGAL_ADDRESS,
        "stream_query": P.CUDA_ERROR_ILLEGAL_ADDRESS, "mem_alloc": P.CUDA_ERROR_ILLEGAL_ADDRESS,
        "module_function": P.CUDA_ERROR_ILLEGAL_ADDRESS,
        "launch_after": P.CUDA_ERROR_ILLEGAL_ADDRESS}, seen


def _copy_past_a_mapping(dev) -> tuple[int, int]:
    """A device-to-host copy whose second half lies in reserved addresses nothing is
    mapped at: (the copy's status, the synchronisation's after it)."""
    g = dev.mem_granularity(0)
    va = dev.address_reserve(2 * g, 0, 0)
    handle = dev.mem_create(g)
    dev.mem_map(va, g, 0, handle)
    dev.mem_set_access(va, g, _READWRITE)
    addr, _ = dev.host_alloc(2 * g)
    s = dev.stream(0)
    return status(dev.memcpy_dtoh_async, addr, va, 2 * g, s), status(dev.stream_synchronize, s)


def test_a_copy_into_addresses_nothing_is_mapped_at_is_refused_at_the_call(isolated):
    # As the H200's driver answers it: the range is checked when the copy is asked for,
    # and nothing is left to fail later.
    copy, synchronize = isolated(_copy_past_a_mapping)
    assert (copy, synchronize) == (P.CUDA_ERROR_INVALID_VALUE, 0)
