"""The control lane's client: what it says when the agent cannot be reached, and when
the agent took a call and never answered it."""

import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from hvgpu.errors import TransportError
from hvgpu.host.cli import EXIT_UNKNOWN, cli
from hvgpu.host.control_grpc import ControlClient, OutcomeUnknown
from tests.conftest import REPO

# An agent's control lane that ends its process once a call arrived (an agent killed
# while it works on a call it received), or hangs on it (resize).
DYING_AGENT = textwrap.dedent("""
    import os, sys, time
    from hvgpu.host.control_grpc import serve

    class Api:
        def _gone(self, **kwargs):
            os._exit(9)
        attach = detach = list = _gone

        def resize(self, **kwargs):  # an agent that hangs on it
            time.sleep(600)

    serve(Api(), sys.argv[1])
    print("serving", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def dying_agent(tmp_path):
    control = str(tmp_path / "control.sock")
    proc = subprocess.Popen([sys.executable, "-c", DYING_AGENT, control], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == "serving\n"
    yield control
    proc.kill()
    proc.wait()


def test_a_change_the_agent_received_and_never_answered_is_of_unknown_outcome(dying_agent):
    result = CliRunner().invoke(cli, ["--control", dying_agent, "attach", "vm1", "--mem", "4G"])
    assert result.exit_code == EXIT_UNKNOWN == 3, result.output
    assert "no agent answers" not in result.output
    assert "received `attach vm1`" in result.output
    assert "whether it was done is unknown" in result.output and "hvgpu list" in result.output


def test_a_change_the_agent_did_not_answer_in_time_is_of_unknown_outcome(dying_agent):
    with pytest.raises(OutcomeUnknown) as info:
        # long enough for a loaded machine to connect and send; the agent hangs anyway
        ControlClient(dying_agent, timeout=5).call("resize", vm="vm1", mem="8G")
    # the agent took it; whether the client then timed out or saw the call end, the
    # outcome is unknown and said so
    assert "received `resize vm1`" in str(info.value) and "hvgpu list" in str(info.value)


def test_a_query_the_agent_never_answered_is_said_so_and_changed_nothing(dying_agent):
    with pytest.raises(TransportError) as info:
        ControlClient(dying_agent).call("list")
    assert not isinstance(info.value, OutcomeUnknown)
    assert "took the list call" in str(info.value) and "Nothing was changed" in str(info.value)


def test_no_socket_or_a_refused_one_means_nothing_was_asked(tmp_path):
    missing = str(tmp_path / "none.sock")
    result = CliRunner().invoke(cli, ["--control", missing, "attach", "vm1", "--mem", "4G"])
    assert result.exit_code == 1
    assert f"no agent answers on {missing} (there is no socket there)" in result.output
    assert "Nothing was asked of it" in result.output
    import socket
    left = tmp_path / "left.sock"  # what an agent killed with SIGKILL leaves behind
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(left))
    sock.close()
    result = CliRunner().invoke(cli, ["--control", str(left), "detach", "vm1"])
    assert result.exit_code == 1
    assert "no agent answers" in result.output and "nothing listens on it" in result.output


def test_the_exit_statuses_are_in_the_help():
    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    assert "3 attach, detach or resize reached the agent and no reply came" in text
