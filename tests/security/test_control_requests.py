"""A member of the control group sends what the CLI never would: JSON of the wrong
kinds, or no JSON at all. Each call is refused as a bad request naming what is
wrong, nothing changes, no traceback reaches the agent's log (or gRPC's), and
the next well-formed call is served."""

from __future__ import annotations

import logging
import selectors
import socket
import struct

import grpc
import pytest

from hvgpu.host import control_grpc

from tests.security.test_control_audit import _call


def _tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.exc_info or "Traceback" in r.getMessage()]


@pytest.mark.parametrize("args, named", [
    ({"vm": "vm1", "mem": "64M", "count": "2"}, "count"),
    ({"vm": "vm1", "mem": "64M", "count": True}, "count"),
    ({"vm": "vm1", "mem": "64M", "count": [1]}, "count"),
    ({"vm": "vm1", "mem": "64M", "placement": ["pack"]}, "placement"),
    ({"vm": "vm1", "mem": "64M", "placement": {"a": 1}}, "placement"),
    ({"vm": "vm1", "mem": "64M", "cid": "3"}, "cid"),
    ({"vm": "vm1", "mem": ["64M"]}, "mem"),
    ({"vm": "vm1", "mem": True}, "mem"),
    ({"vm": "vm1", "mem": "64M", "gpu": {"index": 0}}, "gpu"),
    ({"vm": "vm1", "mem": "64M", "add": "yes"}, "add"),
    ({"vm": ["vm1"], "mem": "64M"}, "vm"),
])
def test_an_argument_of_another_json_kind_is_refused_by_name(agent, caplog, args, named):
    caplog.set_level(logging.DEBUG)
    reply = _call(agent.control, "attach", **args)
    assert reply["ok"] is False and reply["code"] == "bad-request", reply
    assert f"argument {named!r} takes" in reply["message"]
    assert _tracebacks(caplog) == []
    assert agent.api.list() == []  # nothing attached
    assert _call(agent.control, "attach", vm="vm1", mem="64M", count=1)["ok"]
    assert len(agent.api.list()) == 1


def test_other_operations_check_their_arguments_too(agent, caplog):
    caplog.set_level(logging.DEBUG)
    assert _call(agent.control, "attach", vm="vm1", mem="64M")["ok"]
    for name, args in [("detach", {"vm": "vm1", "device": "0"}),
                       ("detach", {"vm": "vm1", "unplug": 1}),
                       ("resize", {"vm": "vm1", "mem": "128M", "device": [0]}),
                       ("list", {"connect": 5})]:
        reply = _call(agent.control, name, **args)
        assert reply["code"] == "bad-request", (name, reply)
    assert _tracebacks(caplog) == []
    assert [v["mem"] for v in agent.api.list()] == [64 << 20]


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1, 2]", b"\xff\xfe", b"1e999999", b"[" * 100_000, b"null",
    b'{"vm": "vm1", "mem": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
])
def test_a_body_that_is_no_json_object_is_refused_without_a_traceback(agent, caplog, body):
    caplog.set_level(logging.DEBUG)
    # through the control socket, as a client would, but without the client's encoder
    channel = grpc.insecure_channel(f"unix://{agent.control}")
    try:
        stub = channel.unary_unary(f"/{control_grpc.SERVICE}/attach",
                                   request_serializer=lambda b: b,
                                   response_deserializer=control_grpc.json.loads)
        reply = stub(body, timeout=30)
    finally:
        channel.close()
    assert reply["ok"] is False and reply["code"] == "bad-request", reply
    assert "JSON object" in reply["message"]
    assert _tracebacks(caplog) == []
    assert _call(agent.control, "attach", vm="vm1", mem="64M")["ok"]



def test_a_connection_reset_in_a_turn_that_names_its_other_side_too_stops_no_relay(
        agent, caplog):
    """The relay serves every ready socket of a turn of its selector: where one side of a
    connection ends it (a client's reset closes both sockets), the other side's event in
    the same turn must find it gone, not fail on a closed socket and end the relay
    (fuzzing finding: control calls were no longer served)."""
    caplog.set_level(logging.DEBUG)
    relay = agent.server.relay
    sel, real = relay._sel, relay._sel.select

    def both_sides(timeout=None):  # a ready side reported with its other side, after it
        ready = real(timeout)
        named = {key.fileobj for key, _ in ready}
        more = []
        for key, _ in ready:
            if isinstance(key.data, tuple):
                other = key.data[0].socks[1 - key.data[1]]
                if other not in named:
                    try:
                        more.append((sel.get_key(other), selectors.EVENT_READ))
                    except (KeyError, ValueError):
                        continue
                    named.add(other)
        return ready + more

    sel.select = both_sides
    for _ in range(3):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(agent.control)
        client.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # gRPC keeps it open
        client.recv(1)  # gRPC's settings came back: both sides are served
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset
    assert _call(agent.control, "list")["ok"]
    assert relay._thread.is_alive()
    assert not [r for r in caplog.records if r.name == "hvgpu.host.control_grpc"
                and r.levelno >= logging.ERROR]
