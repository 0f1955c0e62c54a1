"""The C headers generated from the Python tables match the Python side: the protocol
table, every constant and layout C shares with Python, the launch loop's interface."""

import ctypes
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from hvgpu.host.executor import launch_burst as B
from hvgpu.host.executor import ops
from hvgpu.host.executor.ops import fields as F
from hvgpu.virtio import cgen, codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from hvgpu.virtio import tuning as T
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


# -- every constant and layout C shares with Python ------------------------------------

INCLUDE = {"wire": cgen.HEADER.name, "burst": cgen.BURST_HEADER.name}
_PRINTF = {"str": ("%s", str), "f64": ("%.17g", lambda v: "%.17g" % v),
           "i32": ("%lld", str), "u32": ("%lld", str), "u64": ("%llu", str)}


def _run_c(tmp_path, body: list[str], *, headers=("wire",), prelude=()) -> list[str]:
    """Compiles and runs a C program including the headers cgen renders now; its lines."""
    for name in headers:
        (tmp_path / INCLUDE[name]).write_text(
            cgen.render_header() if name == "wire" else cgen.render_burst_header())
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <string.h>",
             *(f'#include "{INCLUDE[name]}"' for name in headers), *prelude,
             "int main(void) {", *body, "return 0;", "}"]
    (tmp_path / "check.c").write_text("\n".join(lines))
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "check"),
                    str(tmp_path / "check.c")], check=True, cwd=tmp_path)
    return subprocess.run([str(tmp_path / "check")], check=True, capture_output=True,
                          text=True).stdout.split("\n")[:-1]


def _shared_constants():
    """(C name, C type, Python value) of every constant the wire header carries from a
    Python module's C_CONSTANTS."""
    for module, prefix in ((P, "HVGPU_"), (R, "HVGPU_REGION_"), (T, "HVGPU_")):
        for name, ctype in module.C_CONSTANTS:
            yield prefix + name, ctype, getattr(module, name)


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_every_shared_constant_in_c_is_pythons(tmp_path):
    body, expected = [], []
    for cname, ctype, value in _shared_constants():
        fmt, show = _PRINTF[ctype]
        cast = "" if ctype == "str" else "(double)" if ctype == "f64" else \
            "(unsigned long long)" if ctype == "u64" else "(long long)"
        body.append(f'printf("{cname} {fmt}\\n", {cast}{cname});')
        expected.append(f"{cname} {show(value.decode() if isinstance(value, bytes) else value)}")
    assert len(expected) > 30
    assert _run_c(tmp_path, body) == expected


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_region_header_in_c_is_the_one_python_packs(tmp_path):
    """Every field where region.HEADER packs it: C reads back what Python wrote."""
    token = bytes(range(200, 216))
    packed = R.pack_header(0x123456789A, token, 3)
    body = [f"static const unsigned char packed[] = {{{', '.join(map(str, packed))}}};",
            "hvgpu_region_header_t h;",
            "memcpy(&h, packed, sizeof h);",
            'printf("%zu %d\\n", sizeof h, memcmp(h.magic, HVGPU_REGION_MAGIC, sizeof h.magic));',
            'printf("%u %u %llx %u\\n", h.version, h.data_offset, '
            "(unsigned long long)h.size, h.device);",
            'for (size_t i = 0; i < sizeof h.token; i++) printf("%02x", h.token[i]);',
            'printf("\\n");']
    at = 0
    expected = [f"{len(packed)} 0", f"{R.VERSION} {R.DATA_OFFSET} 123456789a 3", token.hex()]
    for name, typ, count in R.HEADER_FIELDS:
        body.append(f'printf("{name} %zu\\n", offsetof(hvgpu_region_header_t, {name}));')
        expected.append(f"{name} {at}")
        at += struct.calcsize("<" + P.SCALARS[typ]) * count
    assert at == R.HEADER.size == len(packed)
    assert _run_c(tmp_path, body) == expected


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_launch_loop_interface_in_c_is_launch_burst_py(tmp_path):
    """The entry points' and served ops' order, the op -> served index map and the
    result's layout, as launch_burst.py hands them to the C loop through ctypes."""
    body = ['printf("%d %d %d\\n", N_ENTRIES, N_SERVED, MAX_SEGMENTS);']
    expected = [f"{len(B.ENTRIES)} {len(B.SERVED)} {B.MAX_SEGMENTS}"]
    for index, symbol in enumerate(B.ENTRIES):
        body.append(f'printf("{symbol} %d\\n", E_{symbol});')
        expected.append(f"{symbol} {index}")
    for index, name in enumerate(B.SERVED_OPS):
        body.append(f'printf("{name} %d %d\\n", S_{name}, served_index(HVGPU_OP_{name}));')
        expected.append(f"{name} {index} {index}")
    served = set(B.SERVED)
    for op in P.OPS:
        if op.code not in served:
            body.append(f'printf("%d\\n", served_index(HVGPU_OP_{op.name}));')
            expected.append("-1")
    body.append('printf("%zu %zu\\n", sizeof(struct hv_burst_result), '
                "_Alignof(struct hv_burst_result));")
    expected.append(f"{ctypes.sizeof(B.Result)} {ctypes.alignment(B.Result)}")
    for name, _, count in B.RESULT_FIELDS:
        body.append(f'printf("{name} %zu %zu\\n", offsetof(struct hv_burst_result, {name}), '
                    f"sizeof(((struct hv_burst_result *)0)->{name}));")
        expected.append(f"{name} {getattr(B.Result, name).offset} {getattr(B.Result, name).size}")
    assert _run_c(tmp_path, body, headers=("wire", "burst")) == expected


def test_the_ops_the_loop_serves_are_those_the_op_table_declares_it_serves():
    """An op is served by the C loop when, and only when, its declaration names the
    driver entry points it is served with (burst=); the checked-in header says the
    same, and every entry point the loop is given is one of theirs or its ring's."""
    declared = {op.name for op in ops.TABLE.values() if op.burst}
    assert declared == set(B.SERVED_OPS) and len(declared) == len(B.SERVED_OPS) >= 7
    text = cgen.BURST_HEADER.read_text()
    assert re.findall(r"^    S_(\w+),$", text, re.M) == list(B.SERVED_OPS)
    assert re.findall(r"case HVGPU_OP_(\w+): return S_\1;", text) == list(B.SERVED_OPS)
    assert re.findall(r"^    \[S_(\w+)\] = \{", text, re.M) == list(B.SERVED_OPS)
    entries = [e for name in B.SERVED_OPS for e in ops.TABLE[P.OP[name]].burst]
    assert set(B.ENTRIES) == set(entries) | set(B.RING_ENTRIES)
    for op in ops.TABLE.values():
        if op.burst:
            assert P.OPS_BY_CODE[op.code].kind == P.ONEWAY and op.fields, op.name
            assert op.check.fields == op.fields, op.name  # the Python check is derived


def _packed(op_name) -> dict[str, tuple[int, int]]:
    """member -> (offset, width) in the op's packed request, as the codec packs it."""
    at, out = 0, {}
    for name, typ in P.OPS_BY_NAME[op_name].request:
        width = struct.calcsize("<" + P.SCALARS.get(typ, "I"))
        out[name + ("_len" if typ in P.VARIABLE else "")] = (at, width)
        at += width
    return out


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_each_served_ops_field_checks_in_c_are_its_declaration(tmp_path):
    """The loop's table of checks (hv_served) holds, for each served op, the checks
    its declaration lists, in its order, each reading the field the codec packs there."""
    kinds = list(F.KINDS)
    body, expected = [], []
    for index, name in enumerate(B.SERVED_OPS):
        op, packed = ops.TABLE[P.OP[name]], _packed(name)
        request = P.OPS_BY_NAME[name].request
        variable = [f for f, typ in request if typ in P.VARIABLE]
        body.append(f"{{ const struct hv_served_op *op = &hv_served[{index}];")
        body.append('printf("%u %u %u %u", op->fixed, op->payload, op->n_vars, op->n_checks);')
        body.append('for (int k = 0; k < op->n_vars; k++) printf(" v%u", op->var_len[k]);')
        body.append('printf("\\n");')
        body.append("for (int i = 0; i < op->n_checks; i++) { const struct hv_check *c = "
                    "&op->checks[i]; printf(\"%u %u %u %u %u %u %u %u %llu\\n\", c->kind, "
                    "c->at, c->width, c->size_at, c->size_width, c->times_at, c->times_width, "
                    "c->var, (unsigned long long)c->allowed); } }")
        expected.append(f"{codec.REQUEST[op.code].fixed.size} "
                        f"{int(P.OPS_BY_NAME[name].request_payload)} {len(variable)} "
                        f"{len(op.fields)}" + "".join(f" v{packed[v + '_len'][0]}"
                                                      for v in variable))
        for check in op.fields:
            var = variable.index(check.field) if check.field in variable else None
            at, width = packed[check.field + ("_len" if var is not None else "")]
            size = (0, 0) if check.size in (None, F.PAYLOAD) else packed[check.size]
            times = (0, 0) if check.times is None else packed[check.times]
            expected.append(f"{kinds.index(check.kind)} {at} {width} {size[0]} {size[1]} "
                            f"{times[0]} {times[1]} {var or 0} "
                            f"{sum(1 << v for v in check.values)}")
    assert _run_c(tmp_path, body, headers=("wire", "burst")) == expected


def _sample_reply(fields) -> tuple[list, list[bytes]]:
    """Values for a reply's fields (a distinct run of bytes per variable field) and the
    bytes of its variable fields, in order."""
    values, tails = [], []
    for i, (name, typ) in enumerate(fields):
        if typ in P.VARIABLE:
            data = (name * (i + 2)).encode()
            tails.append(data)
            values.append(data.decode() if typ == "str" else data)
        else:
            values.append(i + 1)
    return values, tails


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_each_variable_reply_decodes_in_c_as_in_python(tmp_path):
    """The generated decoders find each variable field where the codec put it, cut the
    ones a short read cuts (and count them), and refuse a body without its fixed part."""
    body, expected = [], []
    decoders = [(f"hvgpu_{op.name.lower()}_rep", op.reply) for op in P.OPS
                if any(t in P.VARIABLE for _, t in op.reply)]
    decoders.append(("hvgpu_error_rep", P.ERROR_FIELDS))
    assert [name for name, _ in decoders] == [name for name, _ in cgen._decoders()]
    for k, (name, fields) in enumerate(decoders):
        values, tails = _sample_reply(fields)
        encoded = codec.FieldCodec(fields).encode(values)
        fixed = codec.FieldCodec(fields).fixed.size
        body.append(f"static const unsigned char b{k}[] = {{{', '.join(map(str, encoded))}}};")
        spans = [n for n, t in fields if t in P.VARIABLE]
        for n in (len(encoded), len(encoded) - 3, fixed, fixed - 1):
            body += [f"{{ {name}_view_t v; int rc = {name}_decode(b{k}, {n}, &v);",
                     f'printf("{name} {n} %d", rc);']
            for span in spans:
                body += [f'printf(" %u:%d:", v.{span}.len, v.{span}.data != NULL);',
                         f"for (uint32_t i = 0; i < v.{span}.len; i++) "
                         f'printf("%c", v.{span}.data[i]);']
            body.append('printf("\\n"); }')
            line, at, cut = f"{name} {n}", fixed, 0
            for data in tails:
                got = data[:max(0, n - at)] if n >= fixed else b""
                cut += len(got) < len(data)
                at += len(got)
                line += f" {len(got)}:1:{got.decode()}"
            expected.append(line.replace(f"{name} {n}", f"{name} {n} {cut if n >= fixed else -1}",
                                         1))
    assert _run_c(tmp_path, body) == expected


def test_every_generated_header_is_checked_in_as_cgen_renders_it():
    assert cgen.stale() == [], "regenerate: python -m hvgpu.virtio.cgen"
    assert cgen.main(["--check"]) == 0


def test_the_c_sources_define_none_of_the_shared_names_themselves():
    """A shared number lives in its Python module alone: a C source that gives it a
    value again (under the Python name, with or without HVGPU_, or a name C had for it
    before it was generated) holds a copy that can drift."""
    names = {name for module in (P, R, T) for name, _ in module.C_CONSTANTS}
    names |= {"REGION_" + name for name, _ in R.C_CONSTANTS}
    names |= {"MAX_SEGMENTS", "MAX_NODES", "BATCH_CAP", "ATTR_SIZE", "MAX_ATTRS", "MAX_DESCS",
              "FUNC_ATTRS", "PCOPY_MIN", "PCOPY_ALIGN", "PCOPY_MAX_THREADS",
              "PCOPY_DEFAULT_THREADS", "HV_MAX_PARAMS", "HV_MAX_LAUNCH_ATTRS", "IVSHMEM_VENDOR",
              "IVSHMEM_DEVICE"}
    root = Path(cgen.__file__).parents[1]
    sources = [*(root / "guest" / "shim").glob("*.[ch]"), *(root / "guest" / "nvml").glob("*.[ch]"),
               root / "host" / "executor" / "launch_burst.c"]
    # "#define NAME <number or string>" or "NAME = <number>" (an enum's); a name defined
    # as the generated one (#define FUNC_ATTRS HVGPU_MAX_FUNC_ATTRIBUTES) is no copy
    defined = re.compile(r'^\s*#\s*define\s+(?:HVGPU_)?(\w+)\s+\(?\s*(?:-?\d|")'
                         r"|\b(?:HVGPU_)?(\w+)\s*=\s*-?\d", re.M)
    copies = sorted(f"{path.name}: {m.group(1) or m.group(2)}" for path in sources
                    for m in defined.finditer(path.read_text())
                    if (m.group(1) or m.group(2)) in names)
    assert copies == []


def test_the_python_modules_define_none_of_the_shared_names_but_their_owner():
    """The Python side imports the shared numbers from the module that defines them (and
    the header is generated from): another module that assigns one a value again holds a
    copy that can drift from the C."""
    owners = {Path(m.__file__).resolve() for m in (P, R, T, B)}
    names = {name for module in (P, R, T) for name, _ in module.C_CONSTANTS}
    names |= {"MAX_SEGMENTS", "ENTRIES", "SERVED", "MAX_NODES", "EVENT_ATTRS", "SHARED_MIN",
              "PARALLEL_MIN", "DEFAULT_THREADS", "ENV_SYSFS", "ENV_ADDRESS"}
    assigned = re.compile(r"^\s*_?(\w+)\s*=\s*(?:-?\d|[({\"']|b[\"'])", re.M)
    root = Path(cgen.__file__).parents[1]
    copies = sorted(f"{path.relative_to(root)}: {m.group(1)}" for path in root.rglob("*.py")
                    if path.resolve() not in owners
                    for m in assigned.finditer(path.read_text()) if m.group(1) in names)
    assert copies == []
