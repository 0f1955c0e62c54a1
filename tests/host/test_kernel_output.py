"""What kernels print reaches the guest that synchronised, not the agent's log."""

from __future__ import annotations

import struct

from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from tests.security.data_lane import exactly, frame, hello, raw

PTX = b".version 8.0\n.target sm_90\n.visible .entry say(\n .param .u32 v\n)\n{\n ret;\n}\n\0"


def _frames_until_reply(sock, seq):
    """Every frame up to and including the reply to ``seq``: (flags, op, seq, body,
    payload), progress frames left out."""
    out = []
    while True:
        head = exactly(sock, P.HEADER.size)
        (_, _, flags, op, _, fseq, status, blen, _, plen) = P.HEADER.unpack(head)
        body, payload = exactly(sock, blen), exactly(sock, plen)
        if flags & P.FLAG_PROGRESS:
            continue
        out.append((flags, op, fseq, status, body, payload))
        if fseq == seq and not flags & P.FLAG_OUTPUT:
            return out


def _guest(agent, caps):
    sock = raw(agent.address)
    sock.sendall(hello(caps))
    (_, _, _, _, body, _), = _frames_until_reply(sock, 1)
    agreed = codec.REPLY[P.OP["HELLO"]].decode(body)[2]
    sock.sendall(frame("MODULE_LOAD_DATA", seq=2, payload=PTX))
    module = struct.unpack("<Q", _frames_until_reply(sock, 2)[-1][4])[0]
    sock.sendall(frame("MODULE_GET_FUNCTION", module, "say", seq=3))
    function = struct.unpack("<Q", _frames_until_reply(sock, 3)[-1][4])[0]
    return sock, function, agreed


def _say(sock, function, value, lines, seq):
    sock.sendall(frame("LAUNCH_KERNEL", function, 1, 1, 1, 1, 1, 1, 0, 0,
                       struct.pack("<ii", value, lines), flags=P.FLAG_ONEWAY, seq=seq))


def test_what_a_kernel_prints_comes_before_the_synchronisation_returns(fake_agent):
    sock, function, agreed = _guest(fake_agent, P.CAP_OUTPUT)
    assert agreed & P.CAP_OUTPUT
    _say(sock, function, 7, 2, seq=4)
    sock.sendall(frame("CTX_SYNCHRONIZE", seq=5))
    got = _frames_until_reply(sock, 5)
    output = [f for f in got if f[0] & P.FLAG_OUTPUT]
    assert [f[5] for f in output] == [b"kernel says 7\nkernel says 8\n"]
    assert got[-1][0] & P.FLAG_REPLY and got[-1][3] == 0  # then the real reply
    assert got.index(output[0]) < len(got) - 1
    # Printed once: the next synchronisation brings nothing more.
    sock.sendall(frame("CTX_SYNCHRONIZE", seq=6))
    assert not [f for f in _frames_until_reply(sock, 6) if f[0] & P.FLAG_OUTPUT]


def test_a_guest_that_cannot_take_output_gets_none_and_the_agent_log_keeps_it_out(fake_agent):
    sock, function, agreed = _guest(fake_agent, 0)
    assert not agreed & P.CAP_OUTPUT
    _say(sock, function, 1, 1, seq=4)
    sock.sendall(frame("CTX_SYNCHRONIZE", seq=5))
    got = _frames_until_reply(sock, 5)
    assert len(got) == 1 and got[0][3] == 0
    # A guest that can still gets only what was printed after it asked.
    other, fn2, _ = _guest(fake_agent, P.CAP_OUTPUT)
    _say(other, fn2, 40, 1, seq=4)
    other.sendall(frame("CTX_SYNCHRONIZE", seq=5))
    assert [f[5] for f in _frames_until_reply(other, 5) if f[0] & P.FLAG_OUTPUT] == \
        [b"kernel says 40\n"]


def test_a_kernel_that_prints_without_end_costs_the_executor_a_bounded_buffer(monkeypatch):
    import os
    import time

    from hvgpu.host.executor import kernel_output

    monkeypatch.setattr(kernel_output, "LIMIT", 1 << 16)
    r, w = os.pipe()
    out = kernel_output.KernelOutput(r)
    # Far more than the pipe holds: the writer (the driver) must never block on it.
    for _ in range(64):
        os.write(w, b"x" * 4095 + b"\n")
    time.sleep(0.2)
    taken = out.take()
    note, _, kept = taken.partition(b"]\n")
    assert note.startswith(b"[hvgpu: ") and b"dropped" in note
    assert len(kept) == 1 << 16 and kept.endswith(b"x\n")
    assert out.take() == b""
    os.close(w)
