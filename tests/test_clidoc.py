"""Shell completion and man pages of ``hvgpu`` and ``hvgpu-guest``, generated from their
definitions the same way (both are click groups read by hvgpu.clidoc): every subcommand
is in them, completion works in a real bash, and man renders the pages without a
warning."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import click
import pytest

from hvgpu.guest import cli as guest_cli
from hvgpu.host import cli as host_cli
from tests.conftest import REPO

BASH = shutil.which("bash")
MAN = shutil.which("man")


def _guest_commands() -> list[str]:
    return guest_cli.cli.list_commands(click.Context(guest_cli.cli))


def _host_commands() -> list[str]:
    return host_cli.cli.list_commands(click.Context(host_cli.cli))


def _run(module: str, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


def test_both_commands_have_completion_and_man():
    assert {"completion", "man"} <= set(_guest_commands())
    assert {"completion", "man"} <= set(_host_commands())


def _bash_complete(script: str, words: list[str], function: str, path: str = "") -> list[str]:
    """COMPREPLY of ``function`` for the command line ``words`` (the last is being typed)."""
    program = f"""{script}
COMP_WORDS=({' '.join(f"'{w}'" for w in words)}); COMP_CWORD={len(words) - 1}
COMP_LINE="${{COMP_WORDS[*]}}"; COMP_POINT=${{#COMP_LINE}}
{function} {words[0]} 2>/dev/null
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = dict(os.environ, PATH=path + os.pathsep + os.environ["PATH"] if path else
               os.environ["PATH"])
    out = subprocess.run([BASH, "--norc", "--noprofile", "-c", program], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line]


def _on_path(tmp_path, name: str, module: str) -> str:
    """A directory holding ``name``, which runs this checkout's ``module``: the completion
    scripts call the command back to complete."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\nexport PYTHONPATH={REPO}\n"
                                f"exec {sys.executable} -m {module} \"$@\"\n")
    (bin_dir / name).chmod(0o755)
    return str(bin_dir)


@pytest.mark.skipif(BASH is None, reason="no bash here")
def test_guest_bash_completion_completes_every_subcommand_and_their_options(tmp_path):
    proc = _run("hvgpu.guest.cli", "completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    subprocess.run([BASH, "-n"], input=script, text=True, check=True)
    assert "complete -o nosort -F _hvgpu_guest_completion hvgpu-guest" in script
    bin_dir = _on_path(tmp_path, "hvgpu-guest", "hvgpu.guest.cli")

    def complete(*words):
        return _bash_complete(script, ["hvgpu-guest", *words], "_hvgpu_guest_completion",
                              bin_dir)

    assert set(_guest_commands()) <= set(complete(""))
    assert complete("--agent", "x", "cov") == ["coverage"]
    assert complete("coverage", "--mi") == ["--missing"]
    assert complete("smi", "--query") == ["--query-gpu"]
    assert complete("completion", "z") == ["zsh"]


def _click_complete(bin_dir: str, *words: str) -> list[tuple[str, str]]:
    """(type, value) of what hvgpu-guest answers bash's completion script for ``words``
    (the last is being typed): "file" and "dir" leave it to bash's own completion."""
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"],
               COMP_WORDS=" ".join(["hvgpu-guest", *words]), COMP_CWORD=str(len(words)),
               _HVGPU_GUEST_COMPLETE="bash_complete")
    out = subprocess.run([f"{bin_dir}/hvgpu-guest"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split(",", 1)) for line in out.stdout.splitlines()]


def test_guest_completion_of_run_is_a_program_on_path_then_its_files(tmp_path):
    bin_dir = _on_path(tmp_path, "hvgpu-guest", "hvgpu.guest.cli")
    (tmp_path / "bin" / "hvgpu-guest-tool").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "hvgpu-guest-tool").chmod(0o755)
    (tmp_path / "bin" / "hvgpu-guest-data").write_text("not a program\n")
    for words in (["run", "hvgpu-gue"], ["run", "--", "hvgpu-gue"]):
        assert _click_complete(bin_dir, *words) == [("plain", "hvgpu-guest"),
                                                     ("plain", "hvgpu-guest-tool")], words
    # the program's own arguments, options too after --: files, as bash completes them
    assert _click_complete(bin_dir, "run", "--", "python3", "tr") == [("file", "tr")]
    assert _click_complete(bin_dir, "run", "--", "python3", "--he") == [("file", "--he")]
    assert _click_complete(bin_dir, "install", "--root", "/t") == [("dir", "/t")]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_guest_zsh_and_fish_completion_call_back_into_hvgpu_guest(shell):
    proc = _run("hvgpu.guest.cli", "completion", shell)
    assert proc.returncode == 0, proc.stderr
    assert "_HVGPU_GUEST_COMPLETE" in proc.stdout and "hvgpu-guest" in proc.stdout


@pytest.mark.skipif(BASH is None, reason="no bash here")
def test_host_bash_completion_completes_every_subcommand_and_their_options(tmp_path):
    proc = _run("hvgpu.host.cli", "completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert "complete -o nosort -F _hvgpu_completion hvgpu" in proc.stdout
    bin_dir = _on_path(tmp_path, "hvgpu", "hvgpu.host.cli")
    got = _bash_complete(proc.stdout, ["hvgpu", ""], "_hvgpu_completion", bin_dir)
    assert set(_host_commands()) <= set(got)
    assert _bash_complete(proc.stdout, ["hvgpu", "attach", "vm1", "--pla"], "_hvgpu_completion",
                          bin_dir) == ["--placement"]
    assert _bash_complete(proc.stdout, ["hvgpu", "completion", "f"], "_hvgpu_completion",
                          bin_dir) == ["fish"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_host_zsh_and_fish_completion_call_back_into_hvgpu(shell):
    proc = _run("hvgpu.host.cli", "completion", shell)
    assert proc.returncode == 0, proc.stderr
    assert "_HVGPU_COMPLETE" in proc.stdout and "hvgpu" in proc.stdout


def test_an_unknown_shell_is_refused_with_the_choices():
    guest = _run("hvgpu.guest.cli", "completion", "tcsh")
    assert guest.returncode == 2 and "bash" in guest.stderr
    host = _run("hvgpu.host.cli", "completion", "tcsh")
    assert host.returncode == 2 and "bash" in host.stderr


@pytest.mark.parametrize("module,name,commands", [
    ("hvgpu.guest.cli", "hvgpu-guest", _guest_commands),
    ("hvgpu.host.cli", "hvgpu", _host_commands)])
def test_man_page_has_the_sections_and_every_subcommand(module, name, commands):
    proc = _run(module, "man")
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    roff_name = name.replace("-", "\\-")
    assert page.startswith(f'.TH "{roff_name.upper()}" 1 ')
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS"):
        assert f"\n.SH {section}\n" in page, section
    assert f"\n.SH NAME\n{roff_name} \\- " in page
    for sub in commands():
        sub = sub.replace("-", "\\-")
        assert f'\n.SS "{roff_name} {sub}"\n' in page, sub
        assert f"\n.B {roff_name} {sub}\n" in page, sub  # in the synopsis too
    # -h is --help's other name in every subcommand too, and the page says so (in either
    # order: click 8.1 keeps them in a set)
    helps = re.findall(r"^\\fB\\-(?:h\\fR, \\fB\\-\\-help|\\-help\\fR, \\fB\\-h)\\fR$", page, re.M)
    assert len(helps) == len(commands()) + 1


@pytest.mark.skipif(MAN is None, reason="man is not installed")
@pytest.mark.parametrize("module", ["hvgpu.guest.cli", "hvgpu.host.cli"])
def test_man_renders_the_page_without_a_warning(module, tmp_path):
    page = tmp_path / "page.1"
    page.write_text(_run(module, "man").stdout)
    out = subprocess.run([MAN, "--warnings", "-l", str(page)], capture_output=True, text=True,
                         env=dict(os.environ, MANWIDTH="80", MANPAGER="cat", PAGER="cat"),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    assert "SYNOPSIS" in out.stdout and "COMMANDS" in out.stdout
