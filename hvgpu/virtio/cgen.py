"""Render what hvgpu's C shares with its Python as C headers, from the Python tables.

    python -m hvgpu.virtio.cgen            (re)write every header in HEADERS
    python -m hvgpu.virtio.cgen --check    exit 1, naming them, where one is stale
    python -m hvgpu.virtio.cgen OUTPUT     the wire header into OUTPUT ("-": stdout)

The wire header (``hvgpu/virtio/include/hvgpu_wire.h``) is included by the guest's
shim, its NVML library and the host executor's launch loop from one place, so that
none of them holds a copy of a layout or a number. It gives each op's fixed part as
a packed struct (sizes checked at compile time against the table), a decoder for
each reply with variable-length fields, the magic, flags, header size, op numbers,
every named status, and the constants ``protocol``, ``region`` and ``tuning`` list
in their ``C_CONSTANTS``, with the region's header as a struct whose every offset is
checked at compile time.

The launch loop's header (``hvgpu/host/executor/launch_burst.h``) gives the loop's
interface with ``launch_burst.py`` and the executor's op table: the order of its
entry points and served ops (those the table declares ``burst=``), each served op's
field checks (its ``fields=``) as a table of the wire structs' members, which the
loop applies with one routine, and its result struct, offsets checked against
ctypes' layout of it. It serves the
host alone, so it sits beside the loop, not in the wire's include folder.

A build-time tool, not shipped to guests: it reads the Python tables and the
jinja2 templates in ``templates/wire/``; it must not add anything to the wire that
the tables do not say.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

from hvgpu.templates_dir import templates_dir
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from hvgpu.virtio import tuning as T

INCLUDE_DIR = Path(__file__).parent / "include"
HEADER = INCLUDE_DIR / "hvgpu_wire.h"
BURST_HEADER = Path(__file__).parents[1] / "host" / "executor" / "launch_burst.h"

_SUFFIX = {"u32": "u", "u64": "ull", "i32": "", "u8": "u", "u16": "u"}


def c_literal(value, ctype: str) -> str:
    """``value`` as a C literal of ``ctype`` ("str": a string, "f64": a double)."""
    if ctype == "str":
        text = value.decode("ascii") if isinstance(value, bytes) else value
        assert text.isprintable() and '"' not in text and "\\" not in text, text
        return f'"{text}"'
    if ctype == "f64":
        return repr(float(value))
    assert isinstance(value, int) and not isinstance(value, bool), value
    if ctype == "i32":
        assert -(1 << 31) <= value < 1 << 31, value
    else:
        assert 0 <= value < 1 << (64 if ctype == "u64" else 32), value
    return f"{value}{_SUFFIX[ctype]}"


def constants(module, prefix: str) -> list[tuple[str, str]]:
    """(C name, literal) for each name in ``module.C_CONSTANTS``."""
    return [(prefix + name, c_literal(getattr(module, name), ctype))
            for name, ctype in module.C_CONSTANTS]


def _fixed_size(fields) -> int:
    return struct.calcsize("<" + "".join(P.SCALARS.get(t, "I") for _, t in fields))


def _members(fields) -> list[tuple[str, str, int, str]]:
    """(C type, name, count, array suffix) of (name, type, count) fields."""
    return [(P.C_TYPES[typ], name, count, f"[{count}]" if count > 1 else "")
            for name, typ, count in fields]


def _packed_offsets(fields) -> list[tuple[str, int]]:
    at, offsets = 0, []
    for name, typ, count in fields:
        offsets.append((name, at))
        at += struct.calcsize("<" + P.SCALARS[typ]) * count
    return offsets


def _decoders():
    """(struct name, variable field names) of each reply with variable-length fields,
    and of the error reply."""
    found = []
    for op in P.OPS:
        names = [name for name, typ in op.reply if typ in P.VARIABLE]
        if names:
            found.append((f"hvgpu_{op.name.lower()}_rep", names))
    found.append(("hvgpu_error_rep", [name for name, typ in P.ERROR_FIELDS
                                      if typ in P.VARIABLE]))
    return found


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir() / "wire")),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)  # C source, not markup


def render_header() -> str:
    """The wire header, hvgpu_wire.h."""
    return _environment().get_template("hvgpu_wire.h.j2").render(
        version=P.VERSION, min_version=P.MIN_VERSION, magic=P.MAGIC,
        default_port=P.DEFAULT_PORT, host_cid=P.HOST_CID, max_body=P.MAX_BODY,
        max_payload=P.MAX_PAYLOAD, max_processes=P.MAX_PROCESSES,
        max_process_name=P.MAX_PROCESS_NAME, header_size=P.HEADER.size, status_base=P.HV_STATUS_BASE, fixed_size=_fixed_size,
        flags=sorted(((name, getattr(P, name)) for name in dir(P) if name.startswith("FLAG_")),
                     key=lambda item: item[1]),
        caps=[(name, getattr(P, name)) for name in dir(P) if name.startswith("CAP_")],
        header=[(name, P.C_TYPES[t]) for name, t in P.HEADER_FIELDS],
        ops=P.OPS, ctypes=P.C_TYPES, variable=P.VARIABLE, error=P.ERROR_FIELDS,
        statuses=[(code, name, text) for code, (name, text) in sorted(P.STATUSES.items())],
        protocol_constants=constants(P, "HVGPU_"), tuning_constants=constants(T, "HVGPU_"),
        region_constants=constants(R, "HVGPU_REGION_"),
        region_members=_members(R.HEADER_FIELDS),
        region_offsets=_packed_offsets(R.HEADER_FIELDS), region_size=R.HEADER.size,
        decoders=_decoders())


def _served_op(op) -> dict:
    """What launch_burst.h says of a served op: its request's struct, its variable
    fields' length members and its field checks, each by the struct's member names
    (the C compiler gives their offsets and widths from hvgpu_wire.h)."""
    from hvgpu.host.executor.ops import fields as F

    request = P.OPS_BY_CODE[op.code].request
    variable = [name for name, typ in request if typ in P.VARIABLE]
    checks = []
    for check in op.fields:
        var = variable.index(check.field) if check.field in variable else None
        checks.append({
            "kind": check.kind, "member": check.field + ("_len" if var is not None else ""),
            "size": None if check.size in (None, F.PAYLOAD) else check.size,
            "times": check.times, "var": var,
            "values": check.values,
            "note": "its size: the payload" if check.size == F.PAYLOAD else ""})
    return {"name": op.name, "struct": f"hvgpu_{op.name.lower()}_req_t",
            "payload": int(P.OPS_BY_CODE[op.code].request_payload),
            "vars": [name + "_len" for name in variable], "checks": checks,
            "entries": op.burst}


def render_burst_header() -> str:
    """The launch loop's header, launch_burst.h."""
    # The host's modules, read only here: this tool is not shipped to guests.
    from hvgpu.host.executor import launch_burst as B
    from hvgpu.host.executor.ops import TABLE
    from hvgpu.host.executor.ops import fields as F

    result = B.Result
    served = [_served_op(TABLE[code]) for code in B.SERVED]
    return _environment().get_template("launch_burst.h.j2").render(
        entries=B.ENTRIES, served=served, kinds=list(F.KINDS.items()),
        max_vars=max(1, *(len(op["vars"]) for op in served)),
        max_checks=max(len(op["checks"]) for op in served),
        max_segments=B.MAX_SEGMENTS, members=_members(B.RESULT_FIELDS),
        offsets=[(name, getattr(result, name).offset) for name, _, _ in B.RESULT_FIELDS],
        size=ctypes.sizeof(result), alignment=ctypes.alignment(result))


HEADERS = {HEADER: render_header, BURST_HEADER: render_burst_header}


def stale() -> list[Path]:
    """The headers whose text is not what their tables give now."""
    return [path for path, render in HEADERS.items()
            if not path.is_file() or path.read_text() != render()]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        old = stale()
        for path in old:
            sys.stderr.write(f"{path} is stale: run python -m hvgpu.virtio.cgen\n")
        return 1 if old else 0
    if len(argv) > 1 or argv and argv[0].startswith("--"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    if argv:
        text = render_header()
        if argv[0] == "-":
            sys.stdout.write(text)
        else:
            Path(argv[0]).write_text(text)
        return 0
    for path, render in HEADERS.items():
        text = render()
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
