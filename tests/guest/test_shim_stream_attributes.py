"""Stream attributes through the libcuda.so.1 shim, against the agent with the GPU test
double: cuda/stream_attributes.c sets, reads and copies each attribute a stream takes
(an access policy window over its own buffer, as NVIDIA's simpleAttributes does), and
in its `hostile` mode tries a window over memory it does not own, attributes that name
events, NULL values and forged streams."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build, run


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("stream_attributes"), "stream_attributes")


def test_stream_attributes_run_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "a new stream's window: 0 bytes\n"
        "priority: the greatest yes\n"
        "window: over x yes, 1048576 bytes, hit ratio 0.6, hit 2, miss 1\n"
        "sync policy: 3\n"
        "memory sync domain: 1\n"
        "priority set on t: the least yes\n"
        "copied to t: window over x yes, 1048576 bytes\n"
        "copied to t: sync policy 3\n"
        "saxpy under the window: sum 1835002\n"
        "reset: 0 bytes\n"
        "stream_attributes: ok\n")


def test_hostile_stream_attributes_are_refused(exe, fake_agent):
    out = run(exe, fake_agent.address, "hostile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("hostile: foreign windows, event attributes, NULL "
                                           "values and forged streams refused")
