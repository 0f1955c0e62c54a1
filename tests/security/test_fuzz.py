"""A bounded fuzz run of the data lane: tens of thousands of hostile frames
against one VM's executor while a second VM is served.

Random bytes, valid frames of every op with edge-case values (pointers at and
past the guest's allocations, huge counts, unknown handles), and valid frames
mutated (bad magic, wrong version, lying body and payload lengths, unknown ops,
truncated bodies, HELLO with payloads, noise), from a fixed seed, on a few hundred
connections. Afterwards: no uncaught exception or traceback in the executors'
stderr, the executor's fds, threads and memory back near where they started,
and every call of the other VM, interleaved throughout, was right.
"""

from __future__ import annotations

import random
import socket
import struct

import numpy as np
import pytest

from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.host.test_agent import SAXPY
from tests.security.data_lane import (executor_pid, fds, hello, raw, read_reply, read_to_eof, rss,
                                      threads, vm_status, wait_for)

SEED = 20261202
FRAMES = 30_000
M = 1 << 20
_HELLO = P.OP["HELLO"]
_BITS = {"u8": 8, "u16": 16, "u32": 32, "i32": 32, "u64": 64, "i64": 64}


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    running.agent.config.log_level = "INFO"  # executors start later: a line per connection
    running.api.attach("vm1", "32M")
    running.api.attach("vm2", "32M")
    yield running
    running.stop()


class Fuzzer:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.ptrs = [0]  # device addresses worth aiming at: the guest's own allocations

    def scalar(self, typ: str):
        rng = self.rng
        if typ in ("f32", "f64"):
            return rng.choice([0.0, -1.0, 1e30, float("nan"), rng.random()])
        bits = _BITS[typ]
        top = (1 << bits) - 1
        pick = rng.random()
        if pick < 0.3:
            value = rng.choice([0, 1, 2, 3, 4, 15, 16, 17, 18, 64, 1024, top, top >> 1])
        elif pick < 0.6 and bits == 64:
            base = rng.choice(self.ptrs)
            value = base + rng.choice([0, 1, 255, 4095, 4096, 1 << 20, -1, 1 << 40])
        else:
            value = rng.getrandbits(bits)
        value &= top
        if typ.startswith("i") and value >> (bits - 1):
            value -= 1 << bits
        return value

    def var(self, typ: str):
        n = self.rng.choice([0, 1, 4, 8, 16, 40, 72, 144, self.rng.randrange(300)])
        data = self.rng.randbytes(n)
        return data.decode("latin-1") if typ == "str" else data

    def request(self, seq: int) -> bytes:
        """A well-formed request of a random op with edge-case values."""
        op = self.rng.choice(P.OPS)
        values = [self.var(t) if t in P.VARIABLE else self.scalar(t) for _, t in op.request]
        body = codec.REQUEST[op.code].encode(values)
        payload = self.rng.randbytes(self.rng.choice([0, 1, 100, 4096])) \
            if op.request_payload else b""
        flags = P.FLAG_ONEWAY if op.kind == P.ONEWAY else 0
        return pack_header(op.code, flags, seq, 0, len(body), len(payload)) + body + payload

    def mutate(self, frame: bytes) -> bytes:
        """The frame changed in a way whose length is still known: the session goes on."""
        rng = self.rng
        head, rest = bytearray(frame[:P.HEADER.size]), frame[P.HEADER.size:]
        body_len = struct.unpack_from("<I", head, 16)[0]
        body, payload = bytearray(rest[:body_len]), rest[body_len:]
        kind = rng.randrange(5)
        if kind == 0 and body:  # flipped bytes in the body: lengths, handles, text
            for _ in range(rng.randint(1, 4)):
                body[rng.randrange(len(body))] = rng.randrange(256)
        elif kind == 1:  # a truncated body
            del body[rng.randrange(len(body) + 1):]
        elif kind == 2:  # trailing junk
            body += rng.randbytes(rng.randint(1, 64))
        elif kind == 3:  # an op no protocol has
            struct.pack_into("<H", head, 4, rng.choice([0, 0x03, 0x7F, 0xFF, 0xFFFF]))
        else:  # flags: one-way, reply, progress, all
            head[3] = rng.choice([0, 1, 2, 4, 7, 255])
        struct.pack_into("<I", head, 16, len(body))
        return bytes(head + body + payload)

    def breaking(self, frame: bytes) -> bytes:
        """The frame changed so that the framing breaks: the agent closes the connection."""
        rng = self.rng
        data = bytearray(frame)
        kind = rng.randrange(6)
        if kind == 0:  # bad magic
            struct.pack_into("<H", data, 0, rng.getrandbits(16))
        elif kind == 1:  # another protocol version
            data[2] = rng.choice([0, 2, 255])
        elif kind == 2:  # a lying body length
            struct.pack_into("<I", data, 16, rng.choice([0, 1, len(data), P.MAX_BODY,
                                                         P.MAX_BODY + 1, 0xFFFFFFFF]))
        elif kind == 3:  # a lying payload length: what follows is taken as payload
            struct.pack_into("<Q", data, 24, rng.choice([1, 4096, 1 << 20, P.MAX_PAYLOAD,
                                                         P.MAX_PAYLOAD + 1, (1 << 64) - 1]))
        elif kind == 4:  # a truncated header
            del data[rng.randrange(P.HEADER.size):]
        else:  # noise
            data = bytearray(rng.randbytes(rng.randrange(1, 200)))
        return bytes(data)

    def connection(self, seq0: int) -> tuple[bytes, int]:
        """What one hostile connection sends after its HELLO, and how many frames:
        frames the session must answer and go on from, then perhaps one that breaks it."""
        rng = self.rng
        out, count = [], rng.randint(40, 160)
        for i in range(count):
            pick = rng.random()
            if pick < 0.6:
                out.append(self.request(seq0 + i))
            elif pick < 0.97:
                out.append(self.mutate(self.request(seq0 + i)))
            else:
                out.append(hello(caps=rng.getrandbits(64), payload=rng.randbytes(rng.randrange(64))))
        if rng.random() < 0.5:
            out.append(self.breaking(self.request(seq0 + count)))
            count += 1
        return b"".join(out), count

    def opening(self) -> tuple[bytes, bool]:
        """The first frame: (bytes, whether it is a HELLO the agent accepts)."""
        rng = self.rng
        pick = rng.random()
        if pick < 0.85:
            return hello(caps=rng.getrandbits(64)), True
        if pick < 0.92:
            return hello(payload=rng.randbytes(rng.randrange(1, 2000))), False
        return self.breaking(hello()), False


def _hostile(agent, fuzz: Fuzzer) -> int:
    """One hostile connection; the frames it sent."""
    with raw(agent.vm_address("vm1")) as sock:
        first, accepted = fuzz.opening()
        sock.sendall(first)
        sent = 1
        if accepted:
            if read_reply(sock)[3] != 0:
                return sent
            if fuzz.rng.random() < 0.5:  # something real to aim at
                body = codec.REQUEST[P.OP["MEM_ALLOC"]].encode((fuzz.rng.choice([256, 4096, M]),))
                sock.sendall(pack_header(P.OP["MEM_ALLOC"], 0, 1, 0, len(body)) + body)
                flags, op, seq, status, rbody = read_reply(sock)
                if status == 0:
                    fuzz.ptrs = fuzz.ptrs[-15:] + [codec.REPLY[op].decode(rbody)[0]]
                sent += 1
            data, count = fuzz.connection(2)
            sent += count
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # it closed the connection for a broken frame: that is allowed
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            read_to_eof(sock)  # socket.timeout (30 s): the executor never ended the session
        except ConnectionResetError:
            pass
        return sent


class OtherVm:
    """Real work on vm2, checked each time."""

    def __init__(self, agent):
        self.agent = agent
        self.conn = Connection(agent.vm_address("vm2"))
        self.kernel = Program(SAXPY, connection=self.conn).compile().get_kernel("saxpy")
        self.rounds = 0

    def check(self) -> None:
        dev = Device(connection=self.conn)
        n = 4096
        x = np.arange(n, dtype=np.float32)
        dx, dy = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
        dx.copy_from(x)
        dy.copy_from(np.ones(n, np.float32))
        launch(self.kernel, LaunchConfig(grid=n // 256, block=256), np.float32(2), dx, dy, n)
        out = np.empty_like(x)
        dy.copy_to(out)
        assert np.array_equal(out, 2 * x + 1)
        dx.close()
        dy.close()
        with Connection(self.agent.vm_address("vm2")) as fresh:  # and new connections
            assert fresh.call("SLICE_INFO")[0] == "vm2"
        self.rounds += 1


def test_fuzzed_frames_crash_nothing_leak_nothing_and_stop_no_one_else(agent, capfd):
    other = OtherVm(agent)
    with Connection(agent.vm_address("vm1")) as conn:  # starts vm1's executor
        conn.call("PING")
    pid = executor_pid(agent, "vm1")
    wait_for(lambda: vm_status(agent, "vm1")["connections"] == 0, "vm1's first guest to go")
    fds0, threads0, rss0 = fds(pid), threads(pid), rss(pid)

    fuzz = Fuzzer(SEED)
    sent = connections = 0
    while sent < FRAMES:
        sent += _hostile(agent, fuzz)
        connections += 1
        if connections % 40 == 0:
            other.check()
    other.check()
    with Connection(agent.vm_address("vm1")) as conn:  # the fuzzed executor still serves
        held = Device(connection=conn).allocate(M)
        held.copy_from(np.zeros(M, np.uint8))
        held.close()
    other.conn.close()

    wait_for(lambda: vm_status(agent, "vm1")["connections"] == 0, "vm1's connections to end")
    wait_for(lambda: fds(pid) <= fds0 + 5, f"the executor's fds to return near {fds0}")
    wait_for(lambda: threads(pid) <= threads0 + 3, f"its threads to return near {threads0}")
    grown = rss(pid) - rss0
    assert grown < 100 * M, f"the fuzzed executor grew by {grown >> 20} MiB"
    assert vm_status(agent, "vm1")["mem_used"] == 0
    assert vm_status(agent, "vm1")["executors"][-1]["pid"] == pid  # it never died
    err = capfd.readouterr().err
    for sign in ("Traceback", "Exception in thread", "unexpected"):
        assert sign not in err, err[max(0, err.find(sign) - 2000):err.find(sign) + 2000]
    assert other.rounds >= 5 and connections >= 200
