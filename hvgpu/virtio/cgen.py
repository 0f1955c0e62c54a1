"""Render the protocol table as a C header for the guest's C client.

    python -m hvgpu.virtio.cgen [OUTPUT]      (default: standard output)

A build-time tool: it reads ``protocol`` and the jinja2 template in
``templates/wire/``; it must not add anything to the wire that the table does
not say.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hvgpu.templates_dir import templates_dir
from hvgpu.virtio import protocol as P


def render_header() -> str:
    import jinja2

    template_dir = templates_dir() / "wire"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)  # C source, not markup
    return env.get_template("hvgpu_wire.h.j2").render(
        version=P.VERSION, min_version=P.MIN_VERSION, magic=P.MAGIC,
        default_port=P.DEFAULT_PORT, host_cid=P.HOST_CID, max_body=P.MAX_BODY,
        max_payload=P.MAX_PAYLOAD,
        flags=sorted(((name, getattr(P, name)) for name in dir(P) if name.startswith("FLAG_")),
                     key=lambda item: item[1]),
        caps=[(name, getattr(P, name)) for name in dir(P) if name.startswith("CAP_")],
        header=[(name, P.C_TYPES[t]) for name, t in P.HEADER_FIELDS],
        ops=P.OPS, ctypes=P.C_TYPES, variable=P.VARIABLE, error=P.ERROR_FIELDS,
        statuses=[(code, name, text) for code, (name, text) in sorted(P.STATUSES.items())])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_header()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
