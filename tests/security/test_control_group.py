"""Who may use the control socket: never a group the executor user is in.

Before: `--control-group video` was accepted, and install.sh puts the executor
user `hvgpu` in `video` (for hosts that give it the GPU's device nodes), so a
process running as that user (a compromised executor) could resize and detach
other VMs' slices. The agent must refuse such a group before it starts anything.
"""

from __future__ import annotations

import grp
import os
import pwd

import pytest
from click.testing import CliRunner

from hvgpu.host import spawn
from hvgpu.host.cli import cli


@pytest.fixture
def started(monkeypatch):
    """Whether `hvgpu agent` got as far as making its Agent (it stops right there)."""
    seen = []

    class Stop(Exception):
        pass

    def fake_agent(config, gpus=None):
        seen.append(config)
        raise Stop

    monkeypatch.setattr("hvgpu.host.agent.Agent", fake_agent)
    return seen


def some_group() -> grp.struct_group:
    return grp.getgrgid(os.getgid())


def agent(*args) -> object:
    return CliRunner().invoke(cli, ["agent", "--no-vsock", *args])


@pytest.mark.parametrize("as_primary", [True, False], ids=["primary", "supplementary"])
def test_a_control_group_the_executor_user_is_in_is_refused_before_anything_starts(
        monkeypatch, started, as_primary):
    group = some_group()
    other = group.gr_gid + 1
    user = spawn.ExecutorUser("hvgpu", 999, group.gr_gid if as_primary else other,
                               () if as_primary else (other + 1, group.gr_gid), switch=True)
    monkeypatch.setattr(spawn, "resolve_user", lambda name: user)
    result = agent("--control-group", group.gr_name)
    assert started == []
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"--control-group {group.gr_name} contains the executor user hvgpu (uid 999)" in said
    # a group it is not in is taken: the agent goes on to start
    elsewhere = spawn.ExecutorUser("hvgpu", 999, other + 2, (other + 3,), switch=True)
    monkeypatch.setattr(spawn, "resolve_user", lambda name: elsewhere)
    agent("--control-group", group.gr_name)
    assert len(started) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="executors switch user only under a root agent")
def test_the_installed_executor_users_own_group_is_refused(started):
    try:
        user = pwd.getpwnam(spawn.DEFAULT_USER)
    except KeyError:
        pytest.skip("no hvgpu user here (install.sh makes it)")
    group = grp.getgrgid(user.pw_gid).gr_name
    result = agent("--control-group", group, "--executor-user", spawn.DEFAULT_USER)
    assert started == [] and result.exit_code == 1
    assert f"contains the executor user {spawn.DEFAULT_USER}" in result.output
