"""``hvgpu-guest install``: the udev rule that gives group hvgpu the VM's
region device, installed into a temporary root, and what it does to the
devices already there (a fake sysfs tree, tests/guest/fake_sysfs.py)."""

from __future__ import annotations

import grp
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from hvgpu.guest import install as guest_install
from hvgpu.guest.cli import main
from hvgpu.guest.install import GROUP, RULE
from hvgpu.virtio import region as layout
from hvgpu.virtio.tuning import ENV_SYSFS_ROOT
from tests.guest.fake_sysfs import MiB, add_device, as_user

PACKAGED = Path(guest_install.__file__).parent / "data" / "70-hvgpu-region.rules"


def rule_line() -> str:
    lines = [ln for ln in guest_install.rule_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_rule_matches_ivshmem_plain_when_it_appears():
    keys = dict(re.findall(r'(\w+(?:\{\w+\})?)=="([^"]*)"', rule_line()))
    assert keys == {"ACTION": "add", "SUBSYSTEM": "pci",
                    "ATTR{vendor}": f"{layout.PCI_VENDOR:#06x}",
                    "ATTR{device}": f"{layout.PCI_DEVICE:#06x}"}
    assert "$" not in rule_line()  # udev would substitute it
    assert guest_install.RULE_SOURCE == PACKAGED and PACKAGED.name == Path(RULE).name


def test_the_rules_command_gives_the_group_read_and_write_on_resource2(tmp_path):
    bar = add_device(tmp_path, "0000:00:03.0")
    run = re.search(r'RUN\+="([^"]*)"', rule_line()).group(1)
    assert run.startswith("/bin/sh -c '") and run.endswith("'")
    script = run[len("/bin/sh -c '"):-1]
    assert f"chgrp {GROUP} /sys%p/resource2" in script
    # As udev runs it for this device (%p: its path under /sys), to a group that exists here.
    other = next(g for g in grp.getgrall() if g.gr_gid != os.stat(bar).st_gid)
    script = script.replace("/sys%p", str(bar.parent)).replace(f"chgrp {GROUP}",
                                                               f"chgrp {other.gr_name}")
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=60)
    st = os.stat(bar)
    assert st.st_gid == other.gr_gid and stat.S_IMODE(st.st_mode) == 0o660


def test_install_into_another_root_writes_the_rule_and_nothing_else(tmp_path, capsys):
    before = os.path.exists(RULE)
    assert main(["install", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    written = tmp_path / RULE.lstrip("/")
    assert written.read_text() == PACKAGED.read_text()
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert f"wrote {written}" in out and "left as they are" in out, out
    assert [p.name for p in written.parent.iterdir()] == [written.name]  # no temporary left
    assert os.path.exists(RULE) == before


def test_install_replaces_the_rule_an_earlier_version_installed(tmp_path, capsys):
    # earlier versions installed the same rule as 70-hvgpu-shm.rules: one rule is left
    earlier = tmp_path / guest_install.EARLIER_RULE.lstrip("/")
    earlier.parent.mkdir(parents=True)
    earlier.write_text("# the rule as an earlier version installed it\n")
    assert main(["install", "--root", str(tmp_path)]) == 0
    assert f"removed {earlier}" in capsys.readouterr().out
    assert [p.name for p in earlier.parent.iterdir()] == [Path(RULE).name]


def test_grant_gives_the_group_every_ivshmem_device_and_no_other(tmp_path):
    ours = [add_device(tmp_path, f"0000:00:0{i}.0") for i in (3, 4)]
    theirs = add_device(tmp_path, "0000:00:05.0", device=0x1000)
    found = guest_install.grant(4242, tmp_path)
    assert [d.address for d in found] == ["0000:00:03.0", "0000:00:04.0"]
    for bar in ours:
        assert os.stat(bar).st_gid == 4242 and stat.S_IMODE(os.stat(bar).st_mode) == 0o660
    assert stat.S_IMODE(os.stat(theirs).st_mode) == 0o600


def test_install_on_the_running_system_says_what_it_did(tmp_path, monkeypatch):
    sysfs = tmp_path / "sys"
    bar = add_device(sysfs, "0000:00:03.0", size=16 * MiB)
    monkeypatch.setenv(ENV_SYSFS_ROOT, str(sysfs))
    write_rule = guest_install.write_rule
    monkeypatch.setattr(guest_install, "write_rule", lambda root: write_rule(tmp_path / "root"))
    monkeypatch.setattr(guest_install, "ensure_group", lambda: (4242, True))
    monkeypatch.setenv("PATH", str(tmp_path))  # no udevadm
    said = "\n".join(guest_install.install("/"))
    assert (tmp_path / "root" / RULE.lstrip("/")).exists()
    assert f"created group {GROUP} (gid 4242)" in said, said
    assert f"gave group {GROUP} read and write on {bar} (device 0000:00:03.0, 16 MiB)" in said
    assert "no udevadm here" in said and f"usermod -aG {GROUP} USER" in said, said
    assert os.stat(bar).st_gid == 4242


def test_install_by_an_ordinary_user_says_it_needs_root():
    done = as_user("import hvgpu.guest.install\nfrom hvgpu.guest.cli import main\n",
                   "raise SystemExit(main(['install']))", [])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "permission denied (run it as root)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_group_that_cannot_be_created_is_said_with_the_tools_words(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(guest_install.InstallError, match="neither groupadd nor addgroup"):
        guest_install.ensure_group("hvgpu-test-no-such-group")
    fake = tmp_path / "groupadd"
    fake.write_text("#!/bin/sh\necho \"groupadd: cannot lock /etc/group\" >&2\nexit 10\n")
    fake.chmod(0o755)
    with pytest.raises(guest_install.InstallError,
                       match="groupadd --system hvgpu-test-no-such-group failed: groupadd: "
                             "cannot lock /etc/group"):
        guest_install.ensure_group("hvgpu-test-no-such-group")
    assert guest_install.ensure_group("root") == (0, False)  # an existing group is kept


def test_only_ivshmem_plain_devices_are_listed(tmp_path):
    add_device(tmp_path, "0000:00:01.0", device=0x1000)  # virtio-net: same vendor
    add_device(tmp_path, "0000:00:02.0", vendor=0x8086, device=0x1110)
    add_device(tmp_path, "0000:00:03.0", bars=(0,))  # ivshmem without BAR 2
    add_device(tmp_path, "0000:00:04.0", size=16 * MiB)
    found = guest_install.devices(tmp_path)
    assert [(d.address, d.size) for d in found] == [("0000:00:04.0", 16 * MiB)]
    assert found[0].resource.name == "resource2"
    assert guest_install.devices(tmp_path / "no-such-sysfs") == []


def test_the_sysfs_root_comes_from_the_environment(tmp_path, monkeypatch):
    add_device(tmp_path, "0000:00:03.0")
    monkeypatch.setenv(ENV_SYSFS_ROOT, str(tmp_path))
    assert [d.address for d in guest_install.devices()] == ["0000:00:03.0"]
