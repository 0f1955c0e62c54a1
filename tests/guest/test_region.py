"""The guest finds the VM's shared-memory device by its token and maps it
(hvgpu/guest/region.py), against a sysfs tree of regular files (tests/guest/fake_sysfs.py)."""

from __future__ import annotations

import ctypes
import json
import os

import pytest

from hvgpu.guest import region
from hvgpu.guest.region import RegionError, find_device_region
from hvgpu.virtio import region as layout
from hvgpu.virtio import tuning as T
from tests.guest import fake_sysfs
from tests.guest.fake_sysfs import MiB, add_device, region_header

TOKEN = bytes(range(16))
OTHER = bytes(range(16, 32))


def mapped_files() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def test_only_ivshmem_plain_devices_are_listed(tmp_path):
    add_device(tmp_path, "0000:00:01.0", device=0x1000)  # virtio-net: same vendor
    add_device(tmp_path, "0000:00:02.0", vendor=0x8086, device=0x1110)
    add_device(tmp_path, "0000:00:03.0", bars=(0,))  # ivshmem without BAR 2
    add_device(tmp_path, "0000:00:04.0", size=16 * MiB)
    found = region.devices(tmp_path)
    assert [(d.address, d.size) for d in found] == [("0000:00:04.0", 16 * MiB)]
    assert found[0].resource.name == "resource2"
    assert region.devices(tmp_path / "no-such-sysfs") == []


def test_the_device_with_the_token_and_vgpu_is_mapped_and_no_other(tmp_path):
    add_device(tmp_path, "0000:00:03.0", header=region_header(OTHER))  # another region
    add_device(tmp_path, "0000:00:04.0", header=region_header(TOKEN, device=1))  # vGPU 1's
    add_device(tmp_path, "0000:00:05.0")  # no header yet
    want = add_device(tmp_path, "0000:00:06.0", size=2 * MiB, header=region_header(TOKEN))
    with find_device_region(TOKEN, 0, tmp_path) as r:
        assert r.device.address == "0000:00:06.0" and r.size == 2 * MiB
        assert r.header() == (MiB, TOKEN, 0)
        maps = mapped_files()
        assert str(want.resolve()) in maps
        for other in ("0000:00:03.0", "0000:00:04.0", "0000:00:05.0"):
            assert f"/{other}/resource2" not in maps, other  # unmapped on the way
    assert str(want.resolve()) not in mapped_files()
    with find_device_region(TOKEN, 1, tmp_path) as r:
        assert r.device.address == "0000:00:04.0"


def test_writes_through_the_mapping_and_its_address_reach_the_device(tmp_path):
    bar = add_device(tmp_path, "0000:00:03.0", header=region_header(TOKEN))
    r = find_device_region(TOKEN, 0, tmp_path)
    r.mmap[layout.DATA_OFFSET:layout.DATA_OFFSET + 5] = b"mmap!"
    ctypes.memmove(r.address + layout.DATA_OFFSET + 5, b"by address", 10)
    view = (ctypes.c_char * 4).from_address(r.address + 8)  # the header's version
    assert int.from_bytes(view.raw, "little") == layout.VERSION
    del view
    r.close()
    with open(bar, "rb") as f:
        f.seek(layout.DATA_OFFSET)
        assert f.read(15) == b"mmap!by address"


def test_no_device_carrying_the_token_is_none(tmp_path):
    assert find_device_region(TOKEN, 0, tmp_path) is None  # no PCI bus at all
    add_device(tmp_path, "0000:00:03.0", header=region_header(OTHER))
    assert find_device_region(TOKEN, 0, tmp_path) is None
    assert "resource2" not in mapped_files()


def test_the_sysfs_root_comes_from_the_environment(tmp_path, monkeypatch):
    add_device(tmp_path, "0000:00:03.0", header=region_header(TOKEN))
    monkeypatch.setenv(T.ENV_SYSFS_ROOT, str(tmp_path))
    with find_device_region(TOKEN, 0) as r:
        assert r.device.address == "0000:00:03.0"


def test_a_token_of_the_wrong_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="16 bytes"):
        find_device_region(b"short", 0, tmp_path)


def test_a_bar_too_small_for_a_header_is_a_clear_error(tmp_path):
    add_device(tmp_path, "0000:00:03.0", size=1024)
    with pytest.raises(RegionError, match="too small for an hvgpu region"):
        find_device_region(TOKEN, 0, tmp_path)


SETUP = ("import json, sys\n"
         "from hvgpu.guest.region import RegionError, find_device_region\n")
FIND = ("try:\n"
        "    r = find_device_region(bytes.fromhex(sys.argv[1]), 0, sys.argv[2])\n"
        "except RegionError as exc:\n"
        "    print(json.dumps({'code': exc.code, 'error': str(exc)}))\n"
        "else:\n"
        "    print(json.dumps({'found': r and r.device.address}))\n")


def find_as_user(sysfs, groups=(), setup=SETUP):
    done = fake_sysfs.as_user(setup, FIND, [TOKEN.hex(), str(sysfs)], groups=groups)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_device_this_user_may_not_open_says_which_file_and_what_fixes_it():
    with fake_sysfs.shared_dir() as d:
        bar = add_device(fake_sysfs.Path(d), "0000:00:03.0", header=region_header(TOKEN))
        got = find_as_user(d)
    assert got["code"] == "shm-permission", got
    assert str(bar) in got["error"], got  # the file
    assert "hvgpu-guest install" in got["error"] and region.RULE in got["error"], got
    assert "group 'hvgpu'" in got["error"] and "usermod -aG hvgpu" in got["error"], got


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to a group")
def test_a_device_already_given_to_the_group_says_to_join_it():
    with fake_sysfs.shared_dir() as d:
        bar = add_device(fake_sysfs.Path(d), "0000:00:03.0", header=region_header(TOKEN))
        os.chmod(bar, 0o660)  # root's group stands for hvgpu, which nobody is not in
        got = find_as_user(d, setup=SETUP + "import hvgpu.guest.region as r; r.GROUP = 'root'\n")
    assert got["code"] == "shm-permission", got
    assert "the file belongs to group 'root', which this process is not in" in got["error"]
    assert "usermod -aG root USER" in got["error"] and "hvgpu-guest install" not in got["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a user in another group")
def test_a_device_given_to_a_group_maps_for_its_members_and_not_others():
    with fake_sysfs.shared_dir() as d:
        bar = add_device(fake_sysfs.Path(d), "0000:00:03.0", header=region_header(TOKEN))
        os.chown(bar, 0, 4242)
        os.chmod(bar, 0o660)
        assert find_as_user(d, groups=(4242,)) == {"found": "0000:00:03.0"}
        assert find_as_user(d)["code"] == "shm-permission"


def test_an_unopenable_device_does_not_hide_the_one_that_carries_the_token():
    with fake_sysfs.shared_dir() as d:
        add_device(fake_sysfs.Path(d), "0000:00:03.0", header=region_header(OTHER))
        mine = add_device(fake_sysfs.Path(d), "0000:00:04.0", header=region_header(TOKEN))
        os.chmod(mine, 0o666)
        assert find_as_user(d) == {"found": "0000:00:04.0"}
