"""/etc/hvgpu/agent.toml: every option of `hvgpu agent` can be set in it, the command
line overrides it, and a bad key, type or value is refused naming the file and key."""

from __future__ import annotations

import os
import tomllib

import click
import pytest
from click.testing import CliRunner

from hvgpu.host import agent_config
from hvgpu.host.cli import agent as agent_command, cli


def agent_context() -> click.Context:
    parent = click.Context(cli, info_name="hvgpu")
    parent.params = {}
    return click.Context(agent_command, parent=parent, info_name="agent")


def example_uncommented() -> str:
    """--print-config's example with every key set (its defaults, uncommented)."""
    text = CliRunner().invoke(cli, ["agent", "--print-config"]).output
    return "\n".join(line[2:] if " = " in line and line.startswith("# ") else line
                     for line in text.splitlines())


@pytest.fixture
def captured(monkeypatch):
    """What `hvgpu agent` would run with: its AgentConfig and control socket path."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_agent(config, gpus=None):
        seen["config"] = config
        raise Stop

    monkeypatch.setattr("hvgpu.host.agent.Agent", fake_agent)

    def run(args, toml=None, tmp=None):
        if toml is not None:
            path = tmp / "agent.toml"
            path.write_text(toml)
            args = [*args[:-1], args[-1], "--config", str(path)] if args else args
        result = CliRunner().invoke(cli, args)
        return result, seen.get("config")
    return run


def test_every_option_of_the_agent_is_a_key_of_the_example():
    keys = set(tomllib.loads(example_uncommented()))
    options = {agent_config.key_of(p) for p in agent_command.params
               if isinstance(p, click.Option) and p.name not in agent_config.NOT_KEYS
               and not p.hidden}
    assert options and options <= keys
    assert "local-shm" not in keys  # an earlier name is read, not shown
    assert {"connect", "control"} <= keys  # `hvgpu`'s own options the agent uses


def test_every_key_of_the_example_is_accepted(tmp_path):
    ctx = agent_context()
    path = tmp_path / "agent.toml"
    path.write_text(example_uncommented())
    checked = agent_config.check(ctx, str(path), tomllib.loads(path.read_text()))
    assert set(checked) == set(agent_config.settable(ctx)) - {"local-shm"}


def test_the_file_sets_the_agent_and_the_command_line_wins(tmp_path, captured):
    toml = ('vsock-port = 6000\nno-mps = true\nlisten = ["unix:///x.sock"]\n'
            'placement = "spread"\nlog-level = "debug"\nstate-dir = "/srv/s"\n'
            'connect = "test:///default"\n')
    base = ["agent", "--no-vsock"]
    result, config = captured(base, toml, tmp_path)
    assert config is not None, result.output
    assert (config.mps, config.listen, config.placement, config.log_level, config.state_dir,
            config.connect) == (False, ["unix:///x.sock"], "spread", "DEBUG", "/srv/s",
                                "test:///default")
    assert config.vsock_port is None  # --no-vsock from the command line
    result, config = captured(["-c", "qemu:///session", "agent", "--placement", "pack",
                               "--vsock-port", "7000"], toml, tmp_path)
    assert (config.placement, config.vsock_port, config.connect) == \
        ("pack", 7000, "qemu:///session")


def test_a_file_written_for_an_earlier_version_keeps_its_local_shm(tmp_path, captured):
    # local-shm is what local-region was called before regions had one name
    result, config = captured(["agent", "--no-vsock"], 'local-shm = "2G"\n', tmp_path)
    assert config is not None, result.output
    assert config.local_region == 2 << 30
    result, config = captured(["agent", "--no-vsock", "--local-region", "512M"],
                              'local-shm = "2G"\n', tmp_path)
    assert config.local_region == 512 << 20  # the command line still wins
    result, config = captured(["agent", "--no-vsock", "--local-shm", "0"], None, tmp_path)
    assert config.local_region == 0
    result, config = captured(["agent", "--no-vsock", "--local-shm", "1G", "--local-region",
                               "2G"], None, tmp_path)
    assert result.exit_code == 2 and "disagree" in result.output


@pytest.mark.parametrize("toml, said", [
    ("vsock_port = 1\n", "'vsock_port' is not an option of `hvgpu agent` (did you mean "
                         "'vsock-port'?)"),
    ("colour = 1\n", "'colour' is not an option of `hvgpu agent`; the keys are:"),
    ("vsock-port = '5170'\n", "'vsock-port' must be an integer, not '5170'"),
    ("vsock-port = 0\n", "'vsock-port': 0 is not in the range"),
    ("no-mps = 'yes'\n", "'no-mps' must be true or false"),
    ("listen = 'unix:///x'\n", "'listen' must be a list of strings"),
    ("placement = 'random'\n", "'placement': 'random' is not one of"),
    ("gpu = true\n", "'gpu' must be an integer, not True"),
    ("connect = 3\n", "'connect' must be a string"),
    ("vsock-port = \n", "is not TOML"),
])
def test_a_bad_key_or_value_is_refused_naming_it(tmp_path, captured, toml, said):
    result, config = captured(["agent"], toml, tmp_path)
    assert result.exit_code == 2 and config is None
    assert str(tmp_path / "agent.toml") in result.output
    assert said in " ".join(result.output.split()), result.output


def test_a_missing_file_is_an_error_only_when_named(tmp_path, captured, monkeypatch):
    result, config = captured(["agent", "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 2 and "none.toml: no such file" in result.output
    monkeypatch.setattr(agent_config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    result, config = captured(["agent", "--no-vsock"])
    assert config is not None, result.output  # the default one may be missing


TRUSTING = 'executor-user = "root"\ncontrol-group = "users"\nlisten = ["tcp://0.0.0.0:5170"]\n'


@pytest.mark.parametrize("file_mode, dir_mode", [(0o666, 0o755), (0o664, 0o755),
                                                 (0o644, 0o777)])
def test_a_config_others_may_write_is_refused(tmp_path, file_mode, dir_mode):
    """It can make executors root and open the control socket to a group: a file (or a
    directory above it) that others may write is refused, as sudo refuses such a
    sudoers file."""
    etc = tmp_path / "etc-hvgpu"
    etc.mkdir()
    path = etc / "agent.toml"
    path.write_text(TRUSTING)
    os.chmod(path, file_mode)
    os.chmod(etc, dir_mode)
    with pytest.raises(click.BadParameter, match="not trusted"):
        agent_config.read(str(path))
    os.chmod(path, 0o644)
    os.chmod(etc, 0o755)
    assert agent_config.read(str(path))[1]["executor-user"] == "root"
