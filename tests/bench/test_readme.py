"""bench/readme.py: the benchmarks' tables go onto docs/performance.md, and the README's
headline table is made from their rows, cell for cell."""

from __future__ import annotations

import pytest

from bench import readme

PAGE = """# Performance

<!-- bench-table -->
| figure | native | hvgpu | hvgpu / native (median of 3 pairs, range) | target |
| --- | --- | --- | --- | --- |
| **Python API** (native: CuPy, cuda.core) | native | hvgpu | | |
| pipelined launches (launch()) | 100 launch/s | 150 launch/s | **1.50** (1.40–1.60) | ≥ 0.50 |
| D2H 64 MiB (pinned) | 50.00 GB/s | 45.00 GB/s | **0.90** (0.89–0.91) | ≥ 0.80 (met) |

footer
<!-- /bench-table -->

<!-- multi-tenant-table -->
| scenario | tenant shares | each tenant vs alone (points from share) | aggregate vs native | aggregate copy GB/s |
| --- | --- | --- | --- | --- |
| 4x25 | 25/25/25/25 | 25% (-0), 25% (-0), 25% (-0), 24% (-1) | 0.99 | 16.0 |
<!-- /multi-tenant-table -->
"""
README = "# x\n\n<!-- headline-table -->\nold\n<!-- /headline-table -->\n\nafter\n"


def _checkout(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    page.write_text(PAGE)
    (tmp_path / "README.md").write_text(README)
    return page


def test_publishing_a_table_writes_the_page_and_the_readme_headline(tmp_path):
    page = _checkout(tmp_path)
    new = ("| figure | native | hvgpu | hvgpu / native (median of 3 pairs, range) | target |\n"
           "| --- | --- | --- | --- | --- |\n"
           "| sgemm 4096 (same kernel) | 28.0 TFLOP/s | 27.6 TFLOP/s | **0.99** (0.98–0.99) | x |\n")
    readme.publish(page, "bench-table", new)
    assert "| sgemm 4096 (same kernel) | 28.0 TFLOP/s" in page.read_text()
    assert "pipelined launches (launch())" not in page.read_text()
    head = (tmp_path / "README.md").read_text()
    assert head.startswith("# x\n") and head.endswith("\nafter\n") and "old" not in head
    assert ("| Python API: sgemm 4096 (same kernel) | 28.0 TFLOP/s | 27.6 TFLOP/s | "
            "**0.99** (0.98–0.99) |") in head
    # rows the page no longer has are left out, not made up
    assert "pipelined kernel launches" not in head
    assert "| four VMs on 25% slices" in head and "| 0.99 |" in head


def test_the_headline_copies_the_page_cells_unchanged():
    table = readme.headline(PAGE)
    assert table.splitlines()[0] == "| figure | native | hvgpu | hvgpu / native |"
    assert ("| Python API: pipelined kernel launches | 100 launch/s | 150 launch/s | "
            "**1.50** (1.40–1.60) |") in table
    assert "| Python API: D2H copy, 64 MiB pinned | 50.00 GB/s | 45.00 GB/s |" in table


def test_a_page_without_markers_is_refused_with_the_reason(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text("# nothing here\n")
    with pytest.raises(SystemExit, match="no <!-- bench-table --> .* markers"):
        readme.publish(page, "bench-table", "| a |\n")
    assert page.read_text() == "# nothing here\n"


def test_the_repository_readme_headline_agrees_with_the_performance_page():
    """Fails when docs/performance.md was rendered and the README was not:
    `python3 -m bench.readme` makes it again."""
    text = readme.README.read_text()
    start, end = f"<!-- {readme.HEADLINE} -->\n", f"<!-- /{readme.HEADLINE} -->"
    shown = text.split(start, 1)[1].split(end, 1)[0]
    assert shown == readme.headline(readme.PAGE.read_text())
    assert len(shown.splitlines()) == 2 + len(readme.ROWS) + 1  # every headline row found
