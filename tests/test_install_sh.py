"""install.sh says how far its downloads are where pip cannot draw its progress bar
(no terminal: CI, a log, | tee)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

BASH = shutil.which("bash")

PIP_SAYS = """\
Collecting cupy-cuda12x>=13.0 (from hvgpu==0.1.0)
  Downloading cupy_cuda12x-13.6.0-cp311-cp311-manylinux2014_x86_64.whl (112.9 MB)
Requirement already satisfied: numpy<2.6,>=1.22 in ./.venv/lib/python3.11/site-packages
Collecting fastrlock>=0.5 (from cupy-cuda12x>=13.0->hvgpu==0.1.0)
  Downloading https://files.example/fastrlock-0.8.3-cp311-cp311-manylinux_2_28_x86_64.whl (53 kB)
  Downloading cuda_bindings-12.9.0-cp311-cp311-manylinux_2_28_x86_64.whl (1.2 GB)
Successfully installed cupy-cuda12x-13.6.0 fastrlock-0.8.3
"""


def _downloads_filter() -> str:
    text = (REPO / "install.sh").read_text()
    found = re.search(r"^downloads\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert found, "install.sh has no downloads() filter"
    return found.group(0)


@pytest.mark.skipif(BASH is None, reason="no bash here")
def test_each_download_is_said_numbered_with_the_total_so_far():
    out = subprocess.run([BASH, "-c", _downloads_filter() + "downloads"], input=PIP_SAYS,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.splitlines() == [
        "Collecting cupy-cuda12x>=13.0 (from hvgpu==0.1.0)",
        "install.sh: download 1: cupy_cuda12x-13.6.0-cp311-cp311-manylinux2014_x86_64.whl "
        "(112.9 MB), 112.9 MB so far",
        "Collecting fastrlock>=0.5 (from cupy-cuda12x>=13.0->hvgpu==0.1.0)",
        "install.sh: download 2: fastrlock-0.8.3-cp311-cp311-manylinux_2_28_x86_64.whl (53 kB), "
        "113.0 MB so far",
        "install.sh: download 3: cuda_bindings-12.9.0-cp311-cp311-manylinux_2_28_x86_64.whl "
        "(1.2 GB), 1313.0 MB so far",
        "Successfully installed cupy-cuda12x-13.6.0 fastrlock-0.8.3"]


def test_pip_is_not_quiet_and_draws_its_bar_on_a_terminal():
    text = (REPO / "install.sh").read_text()
    install = [line for line in text.splitlines() if "pip install" in line or "pip=(" in line]
    assert install and not [line for line in install if " -q" in line], install
    assert '[ -t 1 ]' in text and "--progress-bar on" in text


def test_what_install_sh_installs_builds_the_guest_wheel():
    """The README's `.venv/bin/python -m build guest-dist/hvgpu-guest` works in the venv
    install.sh makes, whichever host extra it installs."""
    tomllib = pytest.importorskip("tomllib")
    text = (REPO / "install.sh").read_text()
    default = re.search(r"^extra=\$\{HVGPU_EXTRA:-([\w-]+)\}$", text, re.M)
    assert default, "install.sh no longer says its default extra"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in {default.group(1), "host", "host-cuda13"}:
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in extras[extra]}
        assert "build" in names, f"the {extra} extra cannot build the guest's wheel"
