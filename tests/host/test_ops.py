"""The executor's ops table (hvgpu/host/executor/ops): every protocol op is declared
once, with a check, a charge and an action, and the session serves frames through it."""

from __future__ import annotations

import pytest

from hvgpu.host.executor import ops, session
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.ops import table
from hvgpu.virtio import protocol as P


def test_every_protocol_op_is_declared_once_with_a_check_a_charge_and_an_action():
    declared = [op for family in ops.FAMILIES for op in family.ops]
    names = [op.name for op in declared]
    assert len(names) == len(set(names)), "an op declared twice"
    # The session had one op_* handler for each op of protocol.OPS: the table has them all.
    assert {op.code for op in declared} == set(ops.TABLE) == set(P.OPS_BY_CODE)
    for op in declared:
        assert ops.TABLE[op.code] is op
        assert callable(op.check) and callable(op.act) and callable(op.serve), op.name
        assert op.charge.kind in table.KINDS and op.charge.doc, op.name
        assert (op.charge.size is not None) == (op.charge.kind == "ahead"), op.name


def test_the_session_serves_every_op_through_the_table():
    assert set(session._SERVING) == set(P.OPS_BY_CODE)
    for code, op in ops.TABLE.items():
        assert session._SERVING[code] is op.serve


def test_what_takes_device_memory_says_how_it_is_charged():
    kinds = {op.name: op.charge.kind for op in ops.TABLE.values()}
    assert kinds["MEM_ALLOC"] == "ahead"
    assert {kinds[n] for n in ("MODULE_LOAD_DATA", "MODULE_COMPILE", "MODULE_COMPILE_HEADERS",
                               "GRAPH_INSTANTIATE", "ARRAY_CREATE",
                               "MIPMAPPED_ARRAY_CREATE")} == {"measured"}
    assert kinds["MEM_CREATE"] == kinds["MEM_ALLOC_ASYNC"] == "books"
    assert {kinds[n] for n in ("MEM_FREE", "MODULE_UNLOAD", "GRAPH_EXEC_DESTROY",
                               "MEM_RELEASE", "MEM_POOL_DESTROY", "REGION_DETACH", "ARRAY_DESTROY",
                               "MIPMAPPED_ARRAY_DESTROY")} == {"releases"}


def test_only_the_ops_that_take_a_payload_whole_declare_its_limit():
    limited = {op.name for op in ops.TABLE.values() if op.payload}
    assert limited == {"MODULE_LOAD_DATA", "MODULE_COMPILE", "MODULE_COMPILE_HEADERS",
                       "MEMCPY_3D_TO", "LINK"}
    assert all(P.OPS_BY_NAME[name].request_payload for name in limited)


def test_an_op_declared_by_two_families_is_refused():
    a, b = table.Family("a"), table.Family("b")
    a.declare("PING")(lambda s, hdr: ())
    b.declare("PING")(lambda s, hdr: ())
    with pytest.raises(ValueError, match="PING is declared by a and b"):
        table.build(a, b)


def test_an_op_the_protocol_does_not_have_cannot_be_declared():
    with pytest.raises(KeyError):
        table.Family("a").declare("NO_SUCH_OP")


def test_an_op_served_by_the_c_loop_declares_its_checks_as_fields():
    with pytest.raises(ValueError, match="only ops whose checks are fields"):
        table.Family("a").declare("MEMSET", burst=("cuMemsetD8Async",))
    with pytest.raises(ValueError, match="one-way ops only"):
        table.Family("a").declare("STREAM_SYNCHRONIZE", fields=(F.stream("stream"),),
                                  burst=("cuStreamSynchronize",))
    with pytest.raises(ValueError, match="not both"):
        table.Family("a").declare("MEMSET", check=table.as_sent, fields=(F.stream("stream"),))


@pytest.mark.parametrize("name, fields, why", [
    ("MEMSET", (F.stream("stream_id"),), "no request field 'stream_id'"),
    ("MEMSET", (F.device_range("dst", "size", what="x"),), "no size field 'size'"),
    ("MEMSET", (F.device_range("dst", F.PAYLOAD, what="x"),),
     "a range of the payload, but it takes none"),
    ("LAUNCH_KERNEL", (F.params("params"),), "params checked before the function"),
    ("LAUNCH_KERNEL", (F.stream("params"),), "params is bytes, not u64"),
    ("EVENT_RECORD", (F.event("event"), F.event("event")), "two event checks"),
    ("MODULE_COMPILE", (F.one_of("name", (1,)),), "name is str, not a number"),
])
def test_field_checks_the_request_does_not_bear_out_are_refused(name, fields, why):
    with pytest.raises(ValueError, match=why):
        table.Family("a").declare(name, fields=fields)


def test_a_derived_check_keeps_the_messages_of_the_hand_written_ones():
    """The memset width message, from the one_of check's values."""
    from hvgpu.errors import CudaError

    check = ops.TABLE[P.OP["MEMSET"]].check
    with pytest.raises(CudaError, match="memset width 3 is not 1, 2 or 4"):
        check(None, None, 0x1000, 4, 0, 3, 0)
