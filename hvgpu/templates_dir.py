"""Where the jinja2 templates are: ``hvgpu.templates`` once installed, else the
``templates/`` folder of a source tree run without installing (PYTHONPATH)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def templates_dir() -> Path:
    try:
        return Path(str(resources.files("hvgpu.templates")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[1] / "templates"
