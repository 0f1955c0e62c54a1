import math

import pytest

from hvgpu.errors import ProtocolError
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P

SAMPLES = {"u8": 7, "u16": 65535, "u32": 2 ** 32 - 1, "i32": -5, "u64": 2 ** 64 - 1,
           "i64": -(2 ** 63), "f32": 1.5, "f64": math.pi, "str": "añb", "bytes": b"\0\1\2"}


@pytest.mark.parametrize("op", P.OPS, ids=lambda op: op.name)
def test_every_request_and_reply_round_trips(op):
    for fields, table in ((op.request, codec.REQUEST), (op.reply, codec.REPLY)):
        values = tuple(SAMPLES[t] for _, t in fields)
        assert table[op.code].decode(table[op.code].encode(values)) == values


def test_op_codes_and_names_are_unique_and_stable():
    assert P.OPS_BY_NAME["HELLO"].code == 0x01
    assert P.OPS_BY_NAME["LAUNCH_KERNEL"].code == 0x35
    assert P.OPS_BY_NAME["LAUNCH_KERNEL"].kind == P.ONEWAY
    assert P.OPS_BY_NAME["MEMCPY_DTOH"].kind == P.SYNC


def test_cuda_statuses_keep_their_numbers():
    assert P.STATUS_BY_NAME["CUDA_ERROR_OUT_OF_MEMORY"] == 2
    assert P.STATUS_BY_NAME["CUDA_ERROR_ILLEGAL_ADDRESS"] == 700
    assert P.status_name(12345) == "CUDA_ERROR_12345"
    assert all(code >= 10000 for code, (name, _) in P.STATUSES.items() if name.startswith("HVGPU"))


def test_short_body_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="shorter"):
        codec.REQUEST[0x22].decode(b"\0\0\0")


def test_trailing_bytes_are_a_protocol_error():
    with pytest.raises(ProtocolError, match="trailing"):
        codec.REQUEST[0x22].decode(b"\0" * 9)


def test_variable_field_past_the_end_is_a_protocol_error():
    body = codec.REQUEST[0x33].encode((1, "kernel"))[:-2]
    with pytest.raises(ProtocolError, match="past the end"):
        codec.REQUEST[0x33].decode(body)


def test_invalid_utf8_is_a_protocol_error():
    body = codec.REQUEST[0x33].fixed.pack(1, 2) + b"\xff\xfe"
    with pytest.raises(ProtocolError, match="UTF-8"):
        codec.REQUEST[0x33].decode(body)


def test_error_messages_are_capped():
    body = codec.encode_error(0x22, 9, "x" * (P.MAX_MESSAGE * 2))
    op, _, seq, message = codec.ERROR.decode(body)
    assert (op, seq, len(message)) == (0x22, 9, P.MAX_MESSAGE)
