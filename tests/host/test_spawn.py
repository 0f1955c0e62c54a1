"""Starting executors: when the executor user cannot reach Python or hvgpu, the agent
names the directory that stops it and how to open it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvgpu.host import spawn
from hvgpu.host.spawn import ExecutorUser, ExecutorUserError, Launcher

# Someone who is neither root, nor the owner of these files, nor in their group.
STRANGER = ExecutorUser("hvgpu", os.getuid() + 4242, os.getgid() + 4242, switch=True)


@pytest.fixture
def python_under_a_home(tmp_path):
    """A venv whose bin/python is a symbolic link to an interpreter in a 0700 home (as
    pyenv's, under /root), the venv itself where anyone may read it."""
    for d in (tmp_path, *tmp_path.parents):  # pytest's own directories are 0700
        if d == Path(d.anchor):
            break
        os.chmod(d, os.stat(d).st_mode | 0o001)
    real = tmp_path / "root" / ".pyenv" / "versions" / "3.12" / "bin"
    real.mkdir(parents=True)
    (real / "python3.12").write_text("")
    os.chmod(real / "python3.12", 0o755)
    os.chmod(tmp_path / "root", 0o700)
    venv = tmp_path / "opt" / "hvgpu" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(real / "python3.12")
    return tmp_path, str(venv / "python")


def test_the_first_directory_the_user_cannot_pass_is_named_with_the_fix(python_under_a_home):
    tmp, python = python_under_a_home
    said = spawn.first_blocked(STRANGER, [("the Python interpreter", python, 0o1)])
    assert said is not None
    assert f"{python}, really {tmp}/root/.pyenv/versions/3.12/bin/python3.12" in said
    assert f"may not pass through the directory {tmp}/root on its way (mode 0700" in said
    assert f"`chmod o+x {tmp}/root`" in said
    assert "venv --copies` is not enough" in said and "--executor-user root" in said


def test_a_user_the_modes_let_through_is_not_blamed(python_under_a_home):
    tmp, python = python_under_a_home
    os.chmod(tmp / "root", 0o711)
    assert spawn.first_blocked(STRANGER, [("the Python interpreter", python, 0o1)]) is None
    os.chmod(tmp / "root", 0o710)  # its group may pass, others may not
    said = spawn.first_blocked(STRANGER, [("the Python interpreter", python, 0o1)])
    assert f"`chmod o+x {tmp}/root`" in said
    os.chmod(tmp / "root", 0o711)
    real = tmp / "root" / ".pyenv" / "versions" / "3.12" / "bin" / "python3.12"
    os.chmod(real, 0o700)  # there, but not executable by others
    said = spawn.first_blocked(STRANGER, [("the Python interpreter", python, 0o1)])
    assert f"may not use the file {real} (mode 0700" in said
    assert f"`chmod o+x {real}`" in said


def test_the_agent_refuses_to_start_naming_that_directory(python_under_a_home, tmp_path,
                                                           monkeypatch):
    tmp, python = python_under_a_home
    monkeypatch.setattr(spawn.sys, "executable", python)
    monkeypatch.setattr(spawn, "needed_paths",
                        lambda: [("the Python interpreter", python, 0o1)])
    monkeypatch.setattr(spawn.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 126, "", f"[Errno 13] Permission denied: '{python}'"))
    launcher = Launcher(None, str(tmp_path / "run"), None)
    launcher.user = STRANGER
    try:
        with pytest.raises(ExecutorUserError) as info:
            launcher._check_reachable({})
    finally:
        launcher.close()
    said = str(info.value)
    assert f"user 'hvgpu' cannot start an executor with {python}" in said
    assert f"may not pass through the directory {tmp}/root" in said
    assert f"chmod o+x {tmp}/root" in said


def test_what_an_executor_needs_includes_the_interpreter_and_hvgpu():
    needed = {what: path for what, path, _ in spawn.needed_paths()}
    assert needed["the Python interpreter"] == sys.executable
    assert needed["the hvgpu package"].endswith("hvgpu")
