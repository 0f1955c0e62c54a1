"""The shim's own lookup of the VM's region device (hvgpu/guest/shim/region.c)
finds, in headers that hvgpu/virtio/region.py packs (the Python API uses the same code):
the C layout and the Python one are the same."""

from __future__ import annotations

import ctypes
import errno
import json
import os

import pytest

from hvgpu.guest.shim import library
from hvgpu.virtio import region as layout
from tests.guest import fake_sysfs
from tests.guest.fake_sysfs import MiB, add_device, region_header

TOKEN = bytes(range(100, 116))
OTHER = bytes(16)


@pytest.fixture(scope="module")
def lib():
    lib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)
    lib.hvgpu_region_find.argtypes = [ctypes.c_char_p, ctypes.c_uint32,
                                      ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_uint64)]
    lib.hvgpu_region_error.restype = ctypes.c_char_p
    return lib


def find(lib, token, device):
    base, size = ctypes.c_void_p(), ctypes.c_uint64()
    rc = lib.hvgpu_region_find(token, device, ctypes.byref(base), ctypes.byref(size))
    return rc, base.value, size.value, lib.hvgpu_region_error().decode()


def test_the_shim_maps_the_device_that_carries_the_token(lib, tmp_path, monkeypatch):
    add_device(tmp_path, "0000:00:02.0", device=0x1000, header=region_header(TOKEN))  # not ivshmem
    add_device(tmp_path, "0000:00:03.0", header=region_header(OTHER))
    add_device(tmp_path, "0000:00:04.0", header=region_header(TOKEN, device=1))
    bar = add_device(tmp_path, "0000:00:05.0", size=4 * MiB, header=region_header(TOKEN))
    monkeypatch.setenv("HVGPU_SYSFS_ROOT", str(tmp_path))
    rc, base, size, _ = find(lib, TOKEN, 0)
    assert rc == 0 and size == 4 * MiB
    maps = open("/proc/self/maps").read()
    assert str(bar.resolve()) in maps
    assert "/0000:00:03.0/" not in maps and "/0000:00:04.0/" not in maps
    ctypes.memmove(base + layout.DATA_OFFSET, b"from C's mapping", 16)
    assert layout.unpack_header(ctypes.string_at(base, layout.HEADER.size)) == (MiB, TOKEN, 0)
    ctypes.CDLL(None).munmap(ctypes.c_void_p(base), ctypes.c_size_t(size))
    with open(bar, "rb") as f:
        f.seek(layout.DATA_OFFSET)
        assert f.read(16) == b"from C's mapping"
    rc, base, _, _ = find(lib, TOKEN, 1)
    assert rc == 0
    assert "/0000:00:04.0/" in open("/proc/self/maps").read()
    ctypes.CDLL(None).munmap(ctypes.c_void_p(base), ctypes.c_size_t(MiB))


def test_no_device_with_the_token_is_enoent_saying_so(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("HVGPU_SYSFS_ROOT", str(tmp_path))
    rc, _, _, why = find(lib, TOKEN, 0)
    assert rc == -errno.ENOENT and "no PCI devices" in why
    add_device(tmp_path, "0000:00:03.0", header=region_header(OTHER))
    add_device(tmp_path, "0000:00:04.0", size=1024)  # too small to be a region
    rc, _, _, why = find(lib, TOKEN, 0)
    assert rc == -errno.EINVAL and "too small" in why  # the first failure
    (tmp_path / "bus/pci/devices/0000:00:04.0").unlink()
    rc, _, _, why = find(lib, TOKEN, 0)
    assert rc == -errno.ENOENT and "carries this region's token" in why
    assert "resource2" not in open("/proc/self/maps").read()


SETUP = ("import ctypes, json, sys\n"
         f"lib = ctypes.CDLL({str(library())!r})\n"
         "lib.hvgpu_region_error.restype = ctypes.c_char_p\n")
FIND = ("base, size = ctypes.c_void_p(), ctypes.c_uint64()\n"
        "rc = lib.hvgpu_region_find(bytes.fromhex(sys.argv[1]), 0, ctypes.byref(base),\n"
        "                           ctypes.byref(size))\n"
        "print(json.dumps({'rc': rc, 'error': lib.hvgpu_region_error().decode()}))\n")


def find_as_user(sysfs, groups=()):
    os.environ["HVGPU_SYSFS_ROOT"] = str(sysfs)
    try:
        done = fake_sysfs.as_user(SETUP, FIND, [TOKEN.hex()], groups=groups)
    finally:
        del os.environ["HVGPU_SYSFS_ROOT"]
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_device_this_user_may_not_open_is_eacces_naming_the_file_and_the_fix():
    with fake_sysfs.shared_dir() as d:
        bar = add_device(fake_sysfs.Path(d), "0000:00:03.0", header=region_header(TOKEN))
        got = find_as_user(d)
        assert got["rc"] == -errno.EACCES, got
        assert str(bar) in got["error"] and "hvgpu-guest install" in got["error"], got
        if os.geteuid() == 0:
            os.chown(bar, 0, 4242)
            os.chmod(bar, 0o660)
            assert find_as_user(d, groups=(4242,)) == {"rc": 0, "error": ""}
