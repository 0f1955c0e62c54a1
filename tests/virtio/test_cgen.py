"""The C header generated from the protocol table matches the Python side."""

import shutil
import subprocess

import pytest

from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.cgen import render_header

CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_c_header_compiles_and_agrees_with_python(tmp_path):
    (tmp_path / "hvgpu_wire.h").write_text(render_header())
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "hvgpu_wire.h"',
             "int main(void) {",
             'printf("header %zu %zu %zu\\n", sizeof(hvgpu_header_t), '
             "offsetof(hvgpu_header_t, seq), offsetof(hvgpu_header_t, payload_len));"]
    expected = [f"header 32 8 24"]
    for op in P.OPS:
        lines.append(f'printf("op {op.name} %d %d %s\\n", HVGPU_OP_{op.name}, '
                     f"hvgpu_op_is_oneway(HVGPU_OP_{op.name}), "
                     f"hvgpu_op_name(HVGPU_OP_{op.name}));")
        expected.append(f"op {op.name} {op.code} {int(op.kind == P.ONEWAY)} {op.name}")
        for part, fields, table in (("req", op.request, codec.REQUEST),
                                    ("rep", op.reply, codec.REPLY)):
            if fields:
                lines.append(f'printf("{op.name} {part} %zu\\n", '
                             f"sizeof(hvgpu_{op.name.lower()}_{part}_t));")
                expected.append(f"{op.name} {part} {table[op.code].fixed.size}")
    lines.append('printf("no name %d\\n", hvgpu_op_name(0xFFFF) == 0);')
    expected.append("no name 1")
    lines.append('printf("oom %d\\n", HVGPU_STATUS_CUDA_ERROR_OUT_OF_MEMORY);')
    expected.append("oom 2")
    lines += ["return 0;", "}"]
    (tmp_path / "check.c").write_text("\n".join(lines))
    subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-o", str(tmp_path / "check"),
                    str(tmp_path / "check.c")], check=True, cwd=tmp_path)
    out = subprocess.run([str(tmp_path / "check")], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    assert out[:-1] == expected


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_every_field_offset_in_c_is_the_tables(tmp_path):
    """C reads fields with offsetof (launch_burst.c does): each one where the table
    packs it, and the CUDA names the shim asks for agree with the table."""
    import struct

    (tmp_path / "hvgpu_wire.h").write_text(render_header())
    lines = ['#include <stdio.h>', '#include <stddef.h>', "#define HVGPU_WIRE_CUDA_NAMES",
             '#include "hvgpu_wire.h"', "int main(void) {",
             'printf("%u %d\\n", HVGPU_HEADER_SIZE, HVGPU_STATUS_OWN_BASE);']
    expected = [f"{P.HEADER.size} {P.HV_STATUS_BASE}"]
    for op in P.OPS:
        for part, fields in (("req", op.request), ("rep", op.reply)):
            fmt = "<"
            for name, typ in fields:
                member = name + ("_len" if typ in P.VARIABLE else "")
                lines.append(f'printf("%zu\\n", offsetof(hvgpu_{op.name.lower()}_{part}_t, '
                             f"{member}));")
                expected.append(str(struct.calcsize(fmt)))
                fmt += P.SCALARS.get(typ, "I")
    for code, (name, _) in P.STATUSES.items():
        if name.startswith("CUDA_"):
            lines.append(f'printf("%d\\n", {name});')
            expected.append(str(code))
    lines += ["return 0;", "}"]
    (tmp_path / "offsets.c").write_text("\n".join(lines))
    subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-o", str(tmp_path / "offsets"),
                    str(tmp_path / "offsets.c")], check=True, cwd=tmp_path)
    out = subprocess.run([str(tmp_path / "offsets")], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    assert out[:-1] == expected
