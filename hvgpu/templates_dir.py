"""Where the jinja2 templates are: the ``templates/`` folder of the source tree this
package was imported from, when there is one, else ``hvgpu.templates`` (installed).

The source tree comes first so that a checkout run in place renders its own
templates, not those of another install of hvgpu on the same interpreter."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_SOURCE = Path(__file__).resolve().parents[1] / "templates"


def templates_dir() -> Path:
    if (_SOURCE / "wire" / "hvgpu_wire.h.j2").is_file():
        return _SOURCE
    return Path(str(resources.files("hvgpu.templates")))
