"""A guest against the host's log: what it says is clipped, how often it makes the
host write is bounded per VM.

Before: HELLO's client text (up to 1 MiB) was written whole, for every
connection, and every connection wrote its lines however fast a guest
connected. The executors write to the agent's stderr (the journal, in
production), which is what these tests read; the agent's own lines go through
the handler ``hvgpu agent`` installs. Every loop is bounded in count and time.
"""

from __future__ import annotations

import io
import logging
import time

from hvgpu.host import logs
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header
from tests.security.data_lane import raw, read_reply

HELLO = P.OP["HELLO"]
FLOOD = 300  # connections
FLOOD_SECONDS = 60.0


def hello_from(client: str) -> bytes:
    body = codec.REQUEST[HELLO].encode((P.VERSION, P.MIN_VERSION, 0, client))
    return pack_header(HELLO, 0, 1, 0, len(body), 0) + body


def say_hello(address: str, client: str) -> None:
    sock = raw(address)
    try:
        sock.sendall(hello_from(client))
        assert read_reply(sock)[3] == 0  # HELLO answered
    finally:
        sock.close()


def wait_for_text(capfd, needle: str, seconds: float = 20.0) -> str:
    """Everything written to stderr until ``needle`` appears in it."""
    out, deadline = "", time.monotonic() + seconds
    while needle not in out:
        assert time.monotonic() < deadline, f"{needle!r} never written; got {out[-2000:]!r}"
        time.sleep(0.1)
        out += capfd.readouterr().err
    return out


def test_a_guests_client_text_is_clipped_in_the_log(agent, control, capfd):
    control.call("attach", vm="vm1", mem="64M")
    huge = "hostile " + "A" * (P.MAX_BODY - 200)
    say_hello(agent.vm_address("vm1"), huge)
    say_hello(agent.vm_address("vm1"), "marker-after")  # its line comes after the first's
    err = wait_for_text(capfd, "marker-after")
    (line,) = [ln for ln in err.splitlines() if "'hostile AAAA" in ln]
    assert len(line) < 400
    assert f"({len(huge)} characters)" in line  # what it was, said, not written
    assert len(err) < 64 << 10


def test_a_guest_connecting_in_a_loop_is_held_to_the_vms_log_budget(agent, control, capfd):
    control.call("attach", vm="vm1", mem="64M")
    address = agent.vm_address("vm1")
    started = time.monotonic()
    for n in range(FLOOD):
        if time.monotonic() - started > FLOOD_SECONDS:
            break
        say_hello(address, f"flood {n}")
    took = time.monotonic() - started
    assert n > 100  # it did flood
    time.sleep(2.5)  # a line's worth of budget comes back, and the flood's lines are out
    say_hello(address, "after the flood")
    err = wait_for_text(capfd, "'after the flood'")
    lines = [ln for ln in err.splitlines() if "executor[slice vm1]" in ln]
    # a burst of 60, then one a second (README); the margin covers the start's lines
    assert len(lines) <= 60 + took + 3 + 10, len(lines)
    (after,) = [ln for ln in lines if "'after the flood'" in ln]
    assert "lines about vm1 suppressed before this one" in after


def test_the_agents_lines_about_a_vm_are_held_to_its_budget(agent, control):
    stream = io.StringIO()
    handler = logs.handler("text", "agent", stream)  # what `hvgpu agent` installs
    hv = logging.getLogger("hvgpu")
    level = hv.level
    hv.addHandler(handler)
    hv.setLevel(logging.INFO)  # as `hvgpu agent` runs
    try:
        control.call("attach", vm="vm1", mem="64M")
        control.call("attach", vm="vm2", mem="64M")
        started = time.monotonic()
        for n in range(FLOOD):
            if time.monotonic() - started > FLOOD_SECONDS:
                break
            say_hello(agent.vm_address("vm1"), f"flood {n}")
        took = time.monotonic() - started
        time.sleep(2.5)  # a line's worth of budget comes back
        say_hello(agent.vm_address("vm1"), "after the flood")
        say_hello(agent.vm_address("vm2"), "a neighbour")  # another VM's budget is its own
        deadline = time.monotonic() + 20
        while "connected: slice vm2" not in stream.getvalue():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        hv.removeHandler(handler)
        hv.setLevel(level)
    lines = [ln for ln in stream.getvalue().splitlines() if "slice vm1" in ln]
    assert len(lines) <= 60 + took + 3 + 5, len(lines)
    assert any("lines about vm1 suppressed before this one" in ln for ln in lines)
