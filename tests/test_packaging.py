"""Both distributions build (sdist, then the wheel from that sdist) and install alone.

``hvgpu-guest`` (guest-dist/hvgpu-guest) is the guest runtime alone: no host code, click
its one dependency, its shim built at install, one wheel for every CPython 3. ``hvgpu``
(the top-level project) is the host and holds the guest's files too, byte for byte: the
two are alternatives, one per environment. Each wheel is installed into an empty venv
with no index, from the wheel and click's (tests/wheels.py), and its command is run
there, outside this checkout.

Slow (two C builds, two venvs: about a minute): ``-m "not packaging"`` leaves it out;
``bash .ci/run`` runs it (and installs ``build``, which it needs).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from hvgpu import __version__
from tests.conftest import REPO
from tests.wheels import GUEST_DEPENDENCIES, CannotMake, guest_dependency_wheels

pytestmark = pytest.mark.packaging

GUEST_PROJECT = REPO / "guest-dist" / "hvgpu-guest"
HOST_ONLY_DEPENDENCIES = {"libvirt-python", "cupy-cuda12x", "cupy-cuda13x", "nvidia-ml-py",
                          "pynvml", "grpcio", "cuda-bindings", "jinja2", "numpy"}
# A command run from an installed venv must not see this checkout.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _build(project: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "build", "-o", str(out), str(project)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """{"hvgpu": {"sdist": ..., "wheel": ...}, "hvgpu-guest": {...}}, built from this tree."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs the `build` package (pip install build; .ci/run installs it)")
    out = tmp_path_factory.mktemp("dist")
    projects = {"hvgpu": REPO, "hvgpu-guest": GUEST_PROJECT}
    # Both at once: each is mostly one compiler run
    running = {name: _build(p, out / name) for name, p in projects.items()}
    said = {name: proc.communicate(timeout=600)[0] for name, proc in running.items()}
    for name, proc in running.items():
        if proc.returncode != 0:
            # Offline (no index for the isolated build's setuptools): this interpreter's own
            retry = subprocess.run([sys.executable, "-m", "build", "--no-isolation",
                                    "--skip-dependency-check", "-o", str(out / name),
                                    str(projects[name])], capture_output=True, text=True,
                                   timeout=600)
            assert retry.returncode == 0, (f"{name} did not build:\n{said[name][-3000:]}\n"
                                           f"without isolation:\n{retry.stdout[-3000:]}"
                                           f"{retry.stderr[-3000:]}")
    found = {}
    for name in projects:
        stem = name.replace("-", "_")
        sdist, = (out / name).glob(f"{stem}-*.tar.gz")
        wheel, = (out / name).glob(f"{stem}-*.whl")
        found[name] = {"sdist": sdist, "wheel": wheel}
    return found


@pytest.fixture(scope="module")
def links(tmp_path_factory) -> str:
    """A directory of the guest's dependencies' wheels, for pip's --find-links."""
    out = tmp_path_factory.mktemp("links")
    try:
        guest_dependency_wheels(out)
    except CannotMake as exc:
        pytest.skip(f"no wheel of the guest's dependencies: {exc}")
    return str(out)


def _venv(path: Path) -> Path:
    venv.create(path, with_pip=True)
    return path / "bin"


def _pip_install(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *args], capture_output=True,
                          text=True, env=CLEAN_ENV, timeout=600)


def _installed(bin_dir: Path) -> set[str]:
    listed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "list", "--format=json",
                             "--disable-pip-version-check"], check=True, capture_output=True,
                            text=True, env=CLEAN_ENV).stdout
    return {p["name"].lower() for p in json.loads(listed)}


def _run(bin_dir: Path, command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / command), *args], capture_output=True, text=True,
                          env=CLEAN_ENV, cwd=cwd, timeout=300)


@pytest.mark.parametrize("name", ["hvgpu-guest", "hvgpu"])
def test_each_wheel_serves_every_cpython3_of_its_platform(dists, name):
    wheel = dists[name]["wheel"]
    assert re.fullmatch(rf"{name.replace('-', '_')}-{re.escape(__version__)}"
                        r"-py3-none-linux_\w+\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"{name.replace('-', '_')}-{__version__}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in meta  # machine code inside: not a pure wheel
    assert re.search(r"^Tag: py3-none-linux_\w+$", meta, re.M), meta


@pytest.mark.parametrize("name", ["hvgpu-guest", "hvgpu"])
def test_each_wheel_names_its_licence_by_an_spdx_expression(dists, name):
    """PEP 639's License-Expression; setuptools deprecates the licence as a table."""
    stem = name.replace("-", "_")
    with zipfile.ZipFile(dists[name]["wheel"]) as z:
        meta = z.read(f"{stem}-{__version__}.dist-info/METADATA").decode()
    assert re.search(r"^License-Expression: Apache-2\.0$", meta, re.M), meta[:2000]


def test_the_host_project_has_the_version_of_the_package():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(__version__)}"$', text, re.M), \
        "pyproject.toml's version and hvgpu.__version__ differ (hvgpu-guest takes the latter)"


def test_guest_wheel_holds_the_guest_alone_and_needs_click_alone(dists):
    with zipfile.ZipFile(dists["hvgpu-guest"]["wheel"]) as z:
        names = z.namelist()
        meta = z.read(f"hvgpu_guest-{__version__}.dist-info/METADATA").decode()
        scripts = z.read(f"hvgpu_guest-{__version__}.dist-info/entry_points.txt").decode()
    assert "hvgpu/guest/shim/libcuda.so.1" in names  # built at install
    assert "hvgpu/virtio/include/hvgpu_wire.h" in names
    assert not [n for n in names if n.startswith(("hvgpu/host/", "hvgpu/templates"))]
    assert "hvgpu/virtio/cgen.py" not in names  # the header's generator needs the host's files
    assert re.findall(r"^Requires-Dist: ([\w.-]+)", meta, re.M) == list(GUEST_DEPENDENCIES)
    assert "hvgpu-guest = hvgpu.guest.cli:main" in scripts and "hvgpu =" not in scripts


def test_guest_sdist_carries_every_source_of_its_c_libraries(dists):
    with tarfile.open(dists["hvgpu-guest"]["sdist"]) as t:
        members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if "/" in m.name}
    assert not [n for n, m in members.items() if m.issym() or m.islnk()]  # files, not links
    tree = ast.parse((REPO / "build_c.py").read_text())
    shim = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", "") == "SOURCES" for t in n.targets))
    needed = ["build_c.py", "setup.py", "pyproject.toml", "hvgpu/virtio/include/hvgpu_wire.h",
              *(f"hvgpu/guest/shim/{s}" for s in shim)]
    assert not [n for n in needed if n not in members]


def test_the_host_wheel_holds_the_guest_files_byte_for_byte(dists):
    """One source tree: installing either gives the guest the same files."""
    with zipfile.ZipFile(dists["hvgpu-guest"]["wheel"]) as g, \
            zipfile.ZipFile(dists["hvgpu"]["wheel"]) as h:
        host = set(h.namelist())
        for n in g.namelist():
            if ".dist-info/" in n:
                continue
            assert n in host, f"{n} is in hvgpu-guest but not in hvgpu"
            if not n.endswith(".so.1"):  # built twice; the same sources
                assert g.read(n) == h.read(n), n


def test_guest_wheel_installs_alone_into_an_empty_venv_and_runs(dists, links, tmp_path):
    bin_dir = _venv(tmp_path / "vm")
    done = _pip_install(bin_dir, "--no-index", "--find-links", links,
                        str(dists["hvgpu-guest"]["wheel"]))
    assert done.returncode == 0, done.stderr
    assert {"hvgpu-guest", *GUEST_DEPENDENCIES} <= _installed(bin_dir)
    assert not _installed(bin_dir) & HOST_ONLY_DEPENDENCIES
    help_ = _run(bin_dir, "hvgpu-guest", "--help", cwd=tmp_path)
    assert help_.returncode == 0 and "coverage" in help_.stdout, help_.stderr
    cov = _run(bin_dir, "hvgpu-guest", "coverage", cwd=tmp_path)
    assert cov.returncode == 0, cov.stderr  # the wheel carries the built libcuda.so.1
    assert "yes  cuLaunchKernel" in cov.stdout
    assert _run(bin_dir, "hvgpu-guest", "man", cwd=tmp_path).stdout.startswith('.TH "HVGPU\\-GUEST"')
    assert not (bin_dir / "hvgpu").exists()
    # Every module it installed imports with nothing else there, and none is the host's
    walk = subprocess.run([str(bin_dir / "python"), "-c", """
import importlib, pkgutil, sys, hvgpu
assert hvgpu.__file__.startswith(sys.prefix), hvgpu.__file__
names = [m.name for m in pkgutil.walk_packages(hvgpu.__path__, "hvgpu.")]
for name in names:
    importlib.import_module(name)
print("\\n".join(names))
"""], capture_output=True, text=True, env=CLEAN_ENV, cwd=tmp_path, timeout=300)
    assert walk.returncode == 0, walk.stderr
    modules = walk.stdout.split()
    assert {"hvgpu.guest.cli", "hvgpu.guest.client", "hvgpu.virtio.transport"} <= set(modules)
    assert not [m for m in modules if m.startswith("hvgpu.host")]


def test_host_wheel_installs_into_an_empty_venv_and_runs(dists, links, tmp_path):
    bin_dir = _venv(tmp_path / "host")
    done = _pip_install(bin_dir, "--no-index", "--find-links", links,
                        str(dists["hvgpu"]["wheel"]))
    assert done.returncode == 0, done.stderr
    assert not _installed(bin_dir) & HOST_ONLY_DEPENDENCIES  # plain: the guest's install
    # Without the host extra, a host command says what to install instead of a traceback
    bare = _run(bin_dir, "hvgpu", "list", cwd=tmp_path)
    assert bare.returncode == 1 and "pip install 'hvgpu[host]'" in bare.stderr, bare.stderr
    burst = subprocess.run([str(bin_dir / "python"), "-c",
                            "from hvgpu.host.executor import launch_burst; "
                            "print(launch_burst.unavailable_reason() or 'built')"],
                           capture_output=True, text=True, env=CLEAN_ENV, cwd=tmp_path)
    assert burst.stdout.strip() == "built", burst.stderr  # the executor's C launch loop
    # `hvgpu --help` needs click alone (the host extra's others are GPU/libvirt stacks)
    help_ = _run(bin_dir, "hvgpu", "--help", cwd=tmp_path)
    assert help_.returncode == 0, help_.stderr
    assert "attach" in help_.stdout and "completion" in help_.stdout
    assert _run(bin_dir, "hvgpu", "man", cwd=tmp_path).stdout.startswith('.TH "HVGPU"')
    assert _run(bin_dir, "hvgpu-guest", "--help", cwd=tmp_path).returncode == 0
