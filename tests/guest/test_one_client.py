"""The guest has one client of the data lane: the C library (hvgpu/guest/shim/wire.c,
region_lane.c, region.c, pcopy.c) that the libcuda shim and the Python API both run
(docs/design/guest-client.md). No module of the Python package frames, sends or maps
anything itself, so a second implementation cannot grow back beside it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hvgpu.guest
from hvgpu.guest import client
from hvgpu.guest.shim import CLIENT_LIBRARY, LIBRARY

GUEST = Path(hvgpu.guest.__file__).parent
# What framing, sockets or the lane's own memory would need.
FORBIDDEN_MODULES = {"socket", "mmap", "selectors", "hvgpu.virtio.framing",
                     "hvgpu.virtio.transport"}
FORBIDDEN_NAMES = {"pack_header", "send_frame", "send_all", "FrameReader", "memfd_create",
                   "send_with_fds", "sendmsg", "recv_into"}


def _modules():
    return sorted(p for p in GUEST.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(GUEST)))
def test_no_guest_module_frames_sends_or_maps_by_itself(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
            assert not {a.name for a in node.names} & FORBIDDEN_NAMES, (path, node.lineno)
        elif isinstance(node, ast.Attribute):
            assert node.attr not in FORBIDDEN_NAMES, (path, node.lineno, node.attr)
            continue
        else:
            continue
        assert not names & FORBIDDEN_MODULES, (path, node.lineno, names)


def test_the_lane_modules_of_the_python_client_are_gone():
    for name in ("shm.py", "region.py", "parallel_copy.py"):
        assert not (GUEST / name).exists(), name


def test_the_python_api_runs_its_own_library_not_the_shim():
    """A library named libcuda.so.1 loaded into Python would answer every later
    dlopen("libcuda.so.1") of that process (CuPy, PyTorch): the API's is another."""
    lib = client.library()
    assert Path(lib._name) == CLIENT_LIBRARY != LIBRARY
    # In a fresh process: this one may have loaded the shim for a test of its own.
    check = ("from hvgpu.guest import client; client.library(); "
             "print(open('/proc/self/maps').read())")
    maps = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert str(CLIENT_LIBRARY) in maps and str(LIBRARY) not in maps


def test_a_missing_library_says_what_is_missing_and_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(client, "_lib", None)
    monkeypatch.setattr(client, "CLIENT_LIBRARY", tmp_path / "libhvgpu-client.so.1")
    with pytest.raises(client.ClientMissing) as info:
        client.Connection("unix:///nowhere")
    assert info.value.code == "client-missing"
    assert "libhvgpu-client.so.1 is missing" in str(info.value)
    assert "install a C compiler" in str(info.value)
