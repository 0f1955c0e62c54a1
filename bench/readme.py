"""Put a benchmark's table into README.md between its markers."""

from __future__ import annotations

from pathlib import Path


def replace_table(readme: Path, name: str, table: str) -> None:
    start, end = f"<!-- {name} -->\n", f"<!-- /{name} -->"
    text = readme.read_text()
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(head + start + table + end + tail)
