"""One VM's compile cache is its own: no VM name maps to another VM's directory.

Before: a name that was not plain became 'vm-' and 16 hex digits of its hash,
which a plain name could be too: VMs 'tenant b' and 'vm-ecf32d4270d32a24' shared
one cache, so each could read what the other compiled from a hit, and fill its
cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hvgpu.host.spawn import Launcher
from hvgpu.host.names import MAX_NAME_BYTES, check_vm_name


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("caches")
    launcher = Launcher(None, str(tmp / "run"), str(tmp / "cache"))
    launcher.prepare()
    yield launcher
    launcher.close()


def test_the_reported_pair_gets_two_caches(launcher):
    assert launcher.cache_for("tenant b") != launcher.cache_for("vm-ecf32d4270d32a24")


@pytest.mark.parametrize("vm", ["tenant b", ".", "..", "Ünïcode", "a b c"])  # not plain names
def test_a_vm_named_as_another_vms_cache_directory_gets_its_own(launcher, vm):
    theirs = Path(launcher.cache_for(vm))
    mine = Path(launcher.cache_for(theirs.name))  # a VM named like their directory
    assert mine != theirs
    assert mine.parent == theirs.parent == launcher.cache_dir / "vms"


vm_names = st.text(st.characters(blacklist_categories=("Cc", "Cs"),
                                 blacklist_characters="#/"), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(a=vm_names, b=vm_names)
def test_distinct_vm_names_never_share_a_cache_directory(launcher, a, b):
    check_vm_name(a), check_vm_name(b)
    da, db = Path(launcher.cache_for(a)), Path(launcher.cache_for(b))
    assert (da == db) == (a == b)
    for d in (da, db):
        assert d.parent == launcher.cache_dir / "vms" and not d.name.startswith(".")
        assert len(d.name.encode()) <= MAX_NAME_BYTES
