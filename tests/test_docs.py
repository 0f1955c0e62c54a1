"""The documentation: the site under docs/ builds with no broken link or anchor
(``mkdocs build --strict``), and every link of the README lands on a page and a
heading that exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(text: str) -> list[str]:
    """The Markdown headings of a page, code blocks left out."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def _slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) and GitHub give a heading."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _readme_links() -> list[str]:
    return [m.group(1) for m in LINK.finditer(README.read_text())
            if "://" not in m.group(1)]


def test_the_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_page_of_docs_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if f": {p.name}" not in nav]
    assert not missing, f"pages left out of mkdocs.yml's nav: {missing}"


def test_readme_links_into_docs_name_pages_and_headings_that_exist():
    links = [link for link in _readme_links() if link.startswith("docs/")]
    assert len(links) >= 10  # the README sends readers to the pages for everything else
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        page = REPO / path
        if not page.is_file():
            broken.append(f"{link}: no such page")
        elif anchor and anchor not in {_slug(h) for h in _headings(page.read_text())}:
            broken.append(f"{link}: no heading with that anchor on the page")
    assert not broken, "\n".join(broken)


def test_readme_links_to_its_own_sections_resolve():
    anchors = {_slug(h) for h in _headings(README.read_text())}
    own = [link for link in _readme_links() if link.startswith("#")]
    assert own, "the README's table of contents links to its sections"
    broken = [link for link in own if link[1:] not in anchors]
    assert not broken, f"README links to sections it does not have: {broken}"


def test_no_readme_link_points_at_a_missing_file():
    missing = [link for link in _readme_links()
               if not link.startswith("#") and not (REPO / link.partition("#")[0]).exists()]
    assert not missing, missing
