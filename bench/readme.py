"""Where the benchmarks' tables are published, and how.

Each benchmark's whole table goes into docs/performance.md between its markers
(``<!-- bench-table -->`` ... ``<!-- /bench-table -->``); README.md's headline
table is then made from a few of those rows, copied cell for cell, so the two
never disagree. ``python3 -m bench.readme`` makes the headline again from the page
as it stands.

Must not measure anything or read a results file: the benchmarks' own ``--render``
turns a results file into a table and hands it here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
HEADLINE = "headline-table"

# The headline's rows: (what the README calls it, the page's table, the row's first cell).
ROWS = [
    ("Python API: pipelined kernel launches", "bench-table", "pipelined launches (launch())"),
    ("Python API: synchronous round trip (idle GPU)", "bench-table", "sync round trip (idle GPU)"),
    ("Python API: H2D copy, 64 MiB pinned", "bench-table", "H2D 64 MiB (pinned)"),
    ("Python API: D2H copy, 64 MiB pinned", "bench-table", "D2H 64 MiB (pinned)"),
    ("Python API: sgemm 4096 (same kernel)", "bench-table", "sgemm 4096 (same kernel)"),
    ("unmodified CUDA program: `<<<>>>` launches", "bench-table", "pipelined launches (<<<>>>)"),
    ("unmodified CUDA program: cuBLAS sgemm 4096", "bench-table", "cuBLAS sgemm 4096"),
    ("PyTorch ResNet-20 training step (cuDNN)", "frameworks-table",
     "ResNet-20 CIFAR, fp32, SGD, batch 128 (cuDNN)"),
    ("PyTorch GPT training step (bf16, SDPA, fused AdamW)", "frameworks-table",
     "GPT 4x384, bf16 autocast, SDPA, fused AdamW, 16x256 tokens"),
    ("torch.compile CNN training step", "frameworks-table",
     "torch.compile (Inductor, Triton) CNN, batch 128"),
    ("CUDA graph replay (`torch.cuda.CUDAGraph`)", "frameworks-table",
     "CUDA graph replay (torch.cuda.CUDAGraph) of a launch-bound MLP step, Adam"),
    ("JAX training step, XLA's autotuner off", "frameworks-table",
     "JAX as above, XLA's autotuner off on both sides"),
]
# Four tenants on 25% slices: each one's work against a tenant alone, and all together.
TENANTS = ("four VMs on 25% slices of one GPU (MPS): each VM, and all four against "
           "native", "multi-tenant-table", "4x25")


def replace_table(path: Path, name: str, table: str) -> None:
    """Put ``table`` between ``name``'s markers in ``path``; the rest stays as it is."""
    start, end = f"<!-- {name} -->\n", f"<!-- /{name} -->"
    text = path.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start.strip()} ... {end} markers for the table")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + start + table + end + tail)


def _rows(text: str, name: str) -> dict[str, list[str]]:
    """The rows of the table between ``name``'s markers, by their first cell."""
    start, end = f"<!-- {name} -->\n", f"<!-- /{name} -->"
    if start not in text:
        return {}
    body = text.split(start, 1)[1].split(end, 1)[0]
    rows = {}
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.setdefault(cells[0], cells)
    return rows


def headline(page_text: str) -> str:
    """README's headline table from the page's tables (rows missing there are left out)."""
    tables = {name: _rows(page_text, name)
              for name in {t for _, t, _ in ROWS} | {TENANTS[1]}}
    lines = ["| figure | native | hvgpu | hvgpu / native |", "| --- | --- | --- | --- |"]
    for label, table, first in ROWS:
        cells = tables[table].get(first)
        if cells and len(cells) >= 4:
            lines.append(f"| {label} | {cells[1]} | {cells[2]} | {cells[3]} |")
    label, table, first = TENANTS
    cells = tables[table].get(first)
    if cells and len(cells) >= 4:
        lines.append(f"| {label} | | {cells[2]} of a VM alone | {cells[3]} |")
    return "\n".join(lines) + "\n"


def readme_beside(page: Path) -> Path | None:
    """The README.md at the top of the checkout whose docs/ holds ``page``, if any."""
    page = page.resolve()
    readme = page.parent.parent / "README.md"
    if page.parent.name == "docs" and readme.is_file() \
            and f"<!-- {HEADLINE} -->" in readme.read_text():
        return readme
    return None


def publish(page: Path, name: str, table: str) -> None:
    """Write a benchmark's table into ``page`` (docs/performance.md), then the headline
    table of the README beside it."""
    replace_table(page, name, table)
    readme = readme_beside(page)
    if readme is not None:
        replace_table(readme, HEADLINE, headline(page.read_text()))


def main(argv: list[str]) -> int:
    page = Path(argv[0]) if argv else PAGE
    readme = readme_beside(page)
    if readme is None:
        print(f"no README.md with a headline table beside {page}", file=sys.stderr)
        return 1
    replace_table(readme, HEADLINE, headline(page.read_text()))
    print(f"{readme}: headline table made from {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
