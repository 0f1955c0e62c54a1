"""Encode and decode frame bodies from the field lists in ``protocol``.

One :class:`FieldCodec` is compiled per field list at import time, so the hot
path is a single ``struct`` call. Must not do I/O.
"""

from __future__ import annotations

import struct

from hvgpu.errors import ProtocolError
from hvgpu.virtio import protocol as P


class FieldCodec:
    """Packs a tuple of values in field order; unpacks a body into one."""

    __slots__ = ("fields", "fixed", "var_index", "var_is_str", "names")

    def __init__(self, fields: tuple):
        self.fields = fields
        self.names = tuple(name for name, _ in fields)
        self.fixed = struct.Struct("<" + "".join(P.SCALARS.get(t, "I") for _, t in fields))
        self.var_index = tuple(i for i, (_, t) in enumerate(fields) if t in P.VARIABLE)
        self.var_is_str = tuple(fields[i][1] == "str" for i in self.var_index)

    def encode(self, values) -> bytes:
        if not self.var_index:
            return self.fixed.pack(*values)
        values = list(values)
        tails = []
        for i, is_str in zip(self.var_index, self.var_is_str):
            data = values[i]
            if is_str:
                data = data.encode("utf-8")
            elif not isinstance(data, bytes):
                data = bytes(data)
            values[i] = len(data)
            tails.append(data)
        return self.fixed.pack(*values) + b"".join(tails)

    def decode(self, body) -> tuple:
        size = self.fixed.size
        if len(body) < size:
            raise ProtocolError(f"body of {len(body)} bytes is shorter than the "
                                f"{size} its fields need", code="bad-frame")
        values = self.fixed.unpack_from(body)
        if not self.var_index:
            if len(body) != size:
                raise ProtocolError(f"body has {len(body) - size} trailing bytes",
                                    code="bad-frame")
            return values
        values = list(values)
        pos = size
        for i, is_str in zip(self.var_index, self.var_is_str):
            n = values[i]
            if pos + n > len(body):
                raise ProtocolError(f"field {self.names[i]!r} claims {n} bytes past "
                                    "the end of the body", code="bad-frame")
            chunk = bytes(body[pos:pos + n])
            pos += n
            if is_str:
                try:
                    chunk = chunk.decode("utf-8")
                except UnicodeDecodeError:
                    raise ProtocolError(f"field {self.names[i]!r} is not UTF-8",
                                        code="bad-frame") from None
            values[i] = chunk
        if pos != len(body):
            raise ProtocolError(f"body has {len(body) - pos} trailing bytes", code="bad-frame")
        return tuple(values)


REQUEST = {op.code: FieldCodec(op.request) for op in P.OPS}
REPLY = {op.code: FieldCodec(op.reply) for op in P.OPS}
ERROR = FieldCodec(P.ERROR_FIELDS)


def encode_error(op: int, seq: int, message: str) -> bytes:
    message = message.encode("utf-8")[:P.MAX_MESSAGE].decode("utf-8", "ignore")
    return ERROR.encode((op & 0xFFFF, 0, seq, message))
