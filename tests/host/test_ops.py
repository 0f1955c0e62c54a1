"""The executor's ops table (hvgpu/host/executor/ops): every protocol op is declared
once, with a check, a charge and an action, and the session serves frames through it."""

from __future__ import annotations

import pytest

from hvgpu.host.executor import ops, session
from hvgpu.host.executor.ops import table
from hvgpu.virtio import protocol as P


def test_each_declared_op_has_a_check_a_charge_and_an_action_and_is_declared_once():
    declared = [op for family in ops.FAMILIES for op in family.ops]
    names = [op.name for op in declared]
    assert len(names) == len(set(names)), "an op declared twice"
    assert {op.code for op in declared} == set(ops.TABLE)
    for op in declared:
        assert ops.TABLE[op.code] is op
        assert callable(op.check) and callable(op.act) and callable(op.serve), op.name
        assert op.charge.kind in table.KINDS and op.charge.doc, op.name
        assert (op.charge.size is not None) == (op.charge.kind == "ahead"), op.name
        assert op.code in P.OPS_BY_CODE


def test_the_session_serves_every_protocol_op_as_the_old_handlers_did():
    # The old session had one op_* method for each op in protocol.OPS.
    assert set(session._SERVING) == set(P.OPS_BY_CODE)
    for code, op in ops.TABLE.items():
        assert session._SERVING[code] is op.serve


def test_an_op_declared_by_two_families_is_refused():
    a, b = table.Family("a"), table.Family("b")
    a.declare("PING")(lambda s, hdr: ())
    b.declare("PING")(lambda s, hdr: ())
    with pytest.raises(ValueError, match="PING is declared by a and b"):
        table.build(a, b)


def test_an_op_the_protocol_does_not_have_cannot_be_declared():
    with pytest.raises(KeyError):
        table.Family("a").declare("NO_SUCH_OP")
