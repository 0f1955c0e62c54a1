"""The JIT linker (LINK, LINK_IMAGE) takes only what jit_policy allows: scalar options
within bounds (never those whose values are host pointers, never the output options,
which are the guest's own memory), 1 to MAX_LINK_INPUTS inputs of known types whose
sizes are the payload's, and a linked image is fetched once, by the connection that
linked it."""

from __future__ import annotations

import struct

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection
from hvgpu.virtio import protocol as P

PTX = (b".version 7.0\n.target sm_52\n.address_size 64\n"
       b".visible .entry noop() { ret; }\n\0")


def _opts(*pairs) -> bytes:
    return b"".join(struct.pack("<IIQ", o, 0, v) for o, v in pairs)


def _inputs(*pairs) -> bytes:
    return b"".join(struct.pack("<IIQ", t, 0, n) for t, n in pairs)


def _refused(status, conn, *args, payload=PTX):
    with pytest.raises(CudaError) as info:
        conn.call("LINK", *args, payload=payload)
    assert info.value.status == status, info.value


def test_a_link_of_ptx_is_fetched_once_by_its_own_connection(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    control.call("attach", vm="vm2", mem="16M")
    with Connection(agent.vm_address("vm1")) as a, Connection(agent.vm_address("vm2")) as b:
        status, _, image, size, _, _ = a.call("LINK", _opts((12, 1)), _inputs((1, len(PTX))),
                                              "noop.ptx", payload=PTX)
        assert status == 0 and size > 0
        with pytest.raises(CudaError) as info:
            b.call("LINK_IMAGE", image, reply_into=bytearray(size))
        assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE
        out = bytearray(size)
        a.call("LINK_IMAGE", image, reply_into=out)
        assert out[:4] == b"\x7fELF"
        with pytest.raises(CudaError) as info:  # given once
            a.call("LINK_IMAGE", image, reply_into=bytearray(size))
        assert info.value.status == P.CUDA_ERROR_INVALID_HANDLE


@pytest.mark.parametrize("option, status", [
    (17, P.CUDA_ERROR_NOT_SUPPORTED), (18, P.CUDA_ERROR_NOT_SUPPORTED),  # symbol tables
    (25, P.CUDA_ERROR_NOT_SUPPORTED), (27, P.CUDA_ERROR_NOT_SUPPORTED),  # name tables
    (3, P.CUDA_ERROR_INVALID_VALUE), (5, P.CUDA_ERROR_INVALID_VALUE),  # log buffers: the guest's
    (2, P.CUDA_ERROR_INVALID_VALUE), (99, P.CUDA_ERROR_INVALID_VALUE)])
def test_options_that_name_host_memory_or_outputs_are_refused(agent, control, option, status):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        _refused(status, a, _opts((option, 0x7F0000001000)), _inputs((1, len(PTX))), "x")
        a.call("PING")


def test_bounds_of_options_inputs_and_values(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        one = _inputs((1, len(PTX)))
        bad = P.CUDA_ERROR_INVALID_VALUE
        _refused(bad, a, _opts((7, 5)), one, "x")  # optimisation level past 4
        _refused(bad, a, _opts((0, 1 << 40)), one, "x")
        _refused(bad, a, _opts(*[(7, 1)] * (P.MAX_LINK_OPTIONS + 1)), one, "x")
        _refused(bad, a, b"\0" * 15, one, "x")  # not whole options
        _refused(bad, a, b"", b"", "")  # no input
        _refused(bad, a, b"", _inputs((9, len(PTX))), "x")  # no such input type
        _refused(bad, a, b"", _inputs((1, len(PTX) + 1)), "x")  # sizes past the payload
        _refused(bad, a, b"", _inputs((1, len(PTX) - 1)), "x")  # and short of it
        _refused(bad, a, b"", _inputs((1, 0), (1, len(PTX))), "x\0y")  # an empty input
        _refused(bad, a, b"", _inputs((1, len(PTX))), "x\0y")  # names and inputs disagree
        many = _inputs(*[(1, 1)] * (P.MAX_LINK_INPUTS + 1))
        _refused(bad, a, b"", many, "\0".join("x" * (P.MAX_LINK_INPUTS + 1)),
                 payload=b"." * (P.MAX_LINK_INPUTS + 1))
        status = a.call("LINK", b"", one, "x", payload=PTX)[0]
        assert status == 0  # the connection still serves


def test_a_failed_link_replies_its_status_and_error_log(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        junk = b"not ptx at all\0"
        status, _, image, size, _, error = a.call("LINK", b"", _inputs((1, len(junk))), "j",
                                                  payload=junk)
        assert status == P.CUDA_ERROR_INVALID_PTX and image == 0 and size == 0
        assert error and len(error) < P.MAX_LINK_LOG


def test_unfetched_images_are_bounded(agent, control):
    control.call("attach", vm="vm1", mem="16M")
    with Connection(agent.vm_address("vm1")) as a:
        for _ in range(16):
            assert a.call("LINK", b"", _inputs((1, len(PTX))), "x", payload=PTX)[0] == 0
        _refused(P.CUDA_ERROR_OUT_OF_MEMORY, a, b"", _inputs((1, len(PTX))), "x")
