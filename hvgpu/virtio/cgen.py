"""Render the protocol table as a C header for hvgpu's C parts.

    python -m hvgpu.virtio.cgen [OUTPUT]   (default: the shipped header, HEADER; "-": stdout)

The header lives in ``hvgpu/virtio/include/`` so that the guest's shim and the
host executor's launch loop both include it from one place and neither holds a
copy of the layout. It gives each op's fixed part as a packed struct (fields
found with ``offsetof``, sizes checked at compile time against the table), the
magic, flags, header size, op numbers and every named status.

A build-time tool: it reads ``protocol`` and the jinja2 template in
``templates/wire/``; it must not add anything to the wire that the table does
not say.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from hvgpu.templates_dir import templates_dir
from hvgpu.virtio import protocol as P

INCLUDE_DIR = Path(__file__).parent / "include"
HEADER = INCLUDE_DIR / "hvgpu_wire.h"


def _fixed_size(fields) -> int:
    return struct.calcsize("<" + "".join(P.SCALARS.get(t, "I") for _, t in fields))


def render_header() -> str:
    import jinja2

    template_dir = templates_dir() / "wire"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)  # C source, not markup
    return env.get_template("hvgpu_wire.h.j2").render(
        version=P.VERSION, min_version=P.MIN_VERSION, magic=P.MAGIC,
        default_port=P.DEFAULT_PORT, host_cid=P.HOST_CID, max_body=P.MAX_BODY,
        max_payload=P.MAX_PAYLOAD, max_processes=P.MAX_PROCESSES,
        max_process_name=P.MAX_PROCESS_NAME, header_size=P.HEADER.size, status_base=P.HV_STATUS_BASE, fixed_size=_fixed_size,
        flags=sorted(((name, getattr(P, name)) for name in dir(P) if name.startswith("FLAG_")),
                     key=lambda item: item[1]),
        caps=[(name, getattr(P, name)) for name in dir(P) if name.startswith("CAP_")],
        header=[(name, P.C_TYPES[t]) for name, t in P.HEADER_FIELDS],
        ops=P.OPS, ctypes=P.C_TYPES, variable=P.VARIABLE, error=P.ERROR_FIELDS,
        statuses=[(code, name, text) for code, (name, text) in sorted(P.STATUSES.items())])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_header()
    target = argv[0] if argv else str(HEADER)
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
