"""A bounded stateful fuzz run: hostile connections of one VM that keep the handles
their replies hand out and reuse and abuse them, the control lane fuzzed between
them, while a second VM (the canary) is served and checked throughout.

test_fuzz.py sends single random frames; those rarely get past the first check of
a graph, a mapping, a pool or a region, which need handles from earlier replies.
Here 40 pairs of connections of vm1, two open at once, each make valid calls
first and keep what the replies give, then up to 200 steps from a fixed seed
(HVGPU_FUZZ_SEED runs another) that name it in valid and hostile ways: their own
live objects, ones they destroyed or freed, the other open connection's, the
canary's device addresses, earlier connections' handles and edge values.

- memory: allocations, frees and double frees, copies and memsets at and past
  the ends of allocations; bytes written are read back and compared;
- modules and kernels: compiled (with refused options and failing sources),
  unloaded while graphs use them, launched with parameter buffers of the wrong
  size and functions of unloaded modules;
- streams and events; stream capture (begin, query its nodes, end on the wrong
  stream or twice, synchronise while capturing, unknown modes, staged copies);
- graphs: built node by node (kernel, memset, memcpy to and from regions, event
  and empty nodes, dependencies on nodes of other graphs and connections),
  instantiated, launched, uploaded, updated, their kernel nodes' parameters set;
  destroyed twice, destroyed while instantiations live; and graphs launched
  after the memory, module, event and region they name were let go of, which
  must not fault the executor;
- virtual memory management: reservations, physical memory and mappings made,
  accessed, unmapped and released in every order, sizes off the granularity;
- memory pools: created, allocated from on streams, trimmed, attributes set,
  destroyed with live allocations, freed twice;
- the region lane: memfd regions passed with REGION_ATTACH (unsealed, too
  small, no descriptor, a pipe, two at once) and, in the second half, the VM's
  device region; rooms allocated and freed at wrong offsets and at the other
  connection's, copies naming offsets outside them; bytes through a region
  read back and compared;
- what the guest reads about its vGPU (SLICE_INFO, VGPU_PROCESSES under hostile
  HELLO client texts, VGPU_UTILIZATION, attributes), and the executor's STATS
  of all that, read back through the agent's metrics;
- random frames and valid ones mutated (test_fuzz.Fuzzer) amid the state, and
  connections that end with captures, graphs, mappings, pools and regions alive:
  politely, at once, in the middle of a frame, or with a frame that breaks it;
- the control lane: bodies that are no JSON object (null, nesting 100,000 deep),
  arguments of wrong kinds and unknown names, unknown methods, requests past
  gRPC's 4 MiB, forged caller metadata, half-sent requests and more connections
  at once than the relay takes.

Throughout: the ledger never charges vm1 less than its executor's device holds
(read with no frame of either connection still being served), nor more than the
quota; each connection's own memory and device-region room,
filled once and aimed at by the other, are unchanged when it closes; every
canary round (a saxpy checked, a fresh connection) is right.

Afterwards: no traceback or uncaught exception in the agent's log or the
executors' output, no reply HVGPU_ERROR_INTERNAL or CUDA_ERROR_UNKNOWN, the
fuzzed executor never died or was replaced, its fds, threads and memory and the
agent's back near where they started, vm1's ledger back to 0 once its
connections closed and the double's device holding nothing (no graph either)
when its executor ends, the canary's metrics without an error and its
VGPU_PROCESSES without vm1's, and the agent still answering list and status with
both slices unchanged. The run must also have reached deep state (each of DEEP
succeeded, graphs launched, bytes compared), so that it cannot pass by being
refused at the first check.
"""

from __future__ import annotations

import array
import fcntl
import json
import logging
import mmap
import os
import random
import socket
import struct
import threading
import urllib.request
from collections import defaultdict

import grpc
import numpy as np
import pytest
from prometheus_client import parser

from hvgpu.guest import Connection, Device
from hvgpu.host import control_grpc
from hvgpu.host.names import VgpuKey, region_name
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from hvgpu.virtio.framing import MAX_HELD_FDS, pack_header
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.fake_gpu import FakeDevice
from tests.host.test_agent import SAXPY, reports
from tests.security.data_lane import (exactly, executor_pid, fds, frame, raw, read_reply,
                                      read_to_eof, rss, threads, vm_status, wait_for)
from tests.security.test_fuzz import Fuzzer, OtherVm

SEED = int(os.environ.get("HVGPU_FUZZ_SEED", "20261215"))  # another seed: another run
PAIRS = 40  # pairs of hostile connections open at once, one after another
STEPS = 200  # calls each connection makes, at most (it may end sooner)
M = 1 << 20
G = 2 * M  # the double's granularity
QUOTA = 32 * M
REGION = 8 * M  # vm1's region size: its device region, and the budget memfds share
SOURCE = (SAXPY + '\nextern "C" __global__ void noop() {}\n').encode()
MAX64 = (1 << 64) - 1
EDGE = [0, 1, 2, 3, 15, 16, 17, 255, 4096, 1 << 31, 1 << 32, 1 << 63, MAX64]
SAXPY_PARAMS = struct.Struct("<f4xQQi")
HOSTILE_NAMES = ["", "x" * 300, "\x1b[2J\x1b[31mroot", "a; pid 1; init", "\n\r\t",
                 "é\u202etxt.exe", "%s%n%x"]
TENANT_PIDS = range(4000, 4050)
# Calls that only succeed on state earlier replies made: the run must have reached them.
DEEP = {"GRAPH_INSTANTIATE", "GRAPH_ADD_KERNEL_NODE", "GRAPH_ADD_MEMCPY_NODE",
        "GRAPH_ADD_EVENT_NODE", "GRAPH_ADD_DEPENDENCIES", "GRAPH_EXEC_UPDATE",
        "GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", "GRAPH_EXEC_DESTROY", "STREAM_END_CAPTURE",
        "STREAM_CAPTURE_INFO", "MEM_MAP", "MEM_SET_ACCESS", "MEM_UNMAP", "MEM_RETAIN_HANDLE",
        "MEM_RELEASE", "MEM_ALLOC_ASYNC", "MEM_POOL_TRIM_TO", "MEM_POOL_DESTROY",
        "REGION_ATTACH", "REGION_ALLOC", "REGION_FREE", "REGION_DETACH", "MODULE_UNLOAD",
        "EVENT_DESTROY", "VGPU_PROCESSES"}


@pytest.fixture
def agent(tmp_path):
    wide = tmp_path / "device-wide"  # what each executor's double holds of the device
    wide.mkdir()
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"),
                           metrics="127.0.0.1:0", executor_write=[str(wide)])
    running.config.env["HVGPU_FAKE_DEVICE_WIDE"] = str(wide)
    # Executors log errors alone: the lines about a VM are rationed (logs.PerVm), and a
    # flood of a hostile guest's warnings must not push a traceback out of the ration.
    running.agent.config.log_level = "ERROR"
    running.agent.config.env["HVGPU_FAKE_REPORT_GRAPHS"] = "1"
    running.agent.config.region_dir = str(tmp_path)
    with open(tmp_path / region_name(VgpuKey("vm1", 0)), "wb") as f:  # as QEMU makes it
        f.truncate(REGION)
    running.api.attach("vm1", "32M", region="8M")
    running.api.attach("vm2", "32M")
    yield running
    running.stop()


_BITS = {"u8": 8, "u16": 16, "u32": 32, "i32": 32, "u64": 64, "i64": 64}


def _fit(op: str, values) -> tuple:
    """Each integer cut to its field's width (a handle of 64 bits in a u32 field keeps its
    low bits), as a guest's C code would pass it."""
    out = []
    for (_, typ), value in zip(P.OPS_BY_NAME[op].request, values):
        if typ in _BITS and isinstance(value, int):
            bits = _BITS[typ]
            value &= (1 << bits) - 1
            if typ[0] == "i" and value >> (bits - 1):
                value -= 1 << bits
        out.append(value)
    return tuple(out)


def _memfd(size: int, seal: bool = True, room: int | None = None) -> int:
    fd = os.memfd_create("hvgpu-fuzz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size if room is None else room)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


class Loot:
    """What the run has seen: values worth naming from elsewhere."""

    def __init__(self):
        self.canary_ptrs: list[int] = []  # device addresses of the other VM
        self.handles: list[int] = []  # handles earlier connections were given
        self.internal: list[str] = []  # replies HVGPU_ERROR_INTERNAL or CUDA_ERROR_UNKNOWN
        self.data_checks = 0  # bytes read back and compared
        self.by_op: dict = {}  # (op, status) -> calls
        self.calls = 0
        self.ok = 0


class Tenant:
    """One hostile connection of vm1 that keeps what its replies hand out."""

    def __init__(self, agent, rng: random.Random, number: int, loot: Loot, device_phase: bool,
                 region_file: str):
        self.rng, self.loot, self.number = rng, loot, number
        self.device_phase, self.region_file = device_phase, region_file
        self.sock = raw(agent.vm_address("vm1"))
        self.seq = 1
        self.pid = TENANT_PIDS[number % len(TENANT_PIDS)]
        name = rng.choice([f"tenant{number}"] * 3 + HOSTILE_NAMES)
        caps = P.CAP_REGION_MEMFD | P.CAP_REGION_DEVICE | rng.choice([0, P.CAP_PROGRESS])
        hello = codec.REQUEST[P.OP["HELLO"]].encode(
            (P.VERSION, P.MIN_VERSION, caps, P.client_text("hostile", self.pid, name)))
        self.sock.sendall(pack_header(P.OP["HELLO"], 0, 1, 0, len(hello)) + hello)
        _, _, _, status, body = read_reply(self.sock)
        assert status == 0
        self.caps = codec.REPLY[P.OP["HELLO"]].decode(body)[2]
        self.live: dict[str, list] = defaultdict(list)
        self.dead: dict[str, list] = defaultdict(list)
        self.sizes: dict[int, int] = {}  # live MEM_ALLOC -> bytes
        self.nodes: dict[int, list[int]] = defaultdict(list)  # graph -> its node handles
        self.kernel_nodes: set[int] = set()
        self.made_from: dict[int, int] = {}  # instantiation -> its graph
        self.captures: dict[int, int] = {}  # stream -> the graph it captures into
        self.kernels: dict[int, str] = {}  # function -> its kernel's name
        self.views: dict[int, tuple] = {}  # region -> (mmap, size, own memfd)
        self.rooms: dict[int, list[int]] = defaultdict(list)  # region -> offsets taken
        self.reservations: dict[int, int] = {}  # start -> size
        self.maps: list[tuple[int, int]] = []
        self.peer: Tenant | None = None
        self.sent_fds: list[int] = []  # copies of descriptors sent that no frame took yet
        # Memory and a room of the device region this guest fills once and never names
        # again: the other connection aims at them; checked when this one closes.
        self.sentinel: tuple[int, bytes] | None = None
        self.sentinel_rooms: list[tuple[int, int, bytes]] = []  # (region, offset, bytes)
        self.fuzz = Fuzzer(0)
        self.fuzz.rng = rng
        self.alive = True

    # -- the wire ----------------------------------------------------------------------

    def _send(self, data: bytes, fds=()) -> None:
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", fds).tobytes())])
        else:
            self.sock.sendall(data)

    def call(self, op: str, *values, payload: bytes = b"", fds=()):
        """(status, values): values are the reply's, or None where it failed; a failure
        that is an earlier one-way frame's, reported here, leaves this call undone."""
        self.seq += 1
        self._send(frame(op, *_fit(op, values), seq=self.seq, payload=payload), fds)
        return self._answer(op, self.seq)

    def _answer(self, op: str, seq: int):
        while True:  # replies to mutated frames, and progress frames, are passed over
            head = exactly(self.sock, P.HEADER.size)
            (_, _, flags, _, _, rseq, status, blen, _, plen) = P.HEADER.unpack(head)
            body, payload = exactly(self.sock, blen), exactly(self.sock, plen)
            if rseq == seq and not flags & P.FLAG_PROGRESS:
                break
        self.loot.calls += 1
        self.loot.by_op[(op, status)] = self.loot.by_op.get((op, status), 0) + 1
        if status:
            message = codec.ERROR.decode(body)[3]
            if status in (P.HV_INTERNAL, P.CUDA_ERROR_UNKNOWN):
                self.loot.internal.append(f"{op} -> {P.status_name(status)}: {message}")
            return status, None
        self.loot.ok += 1
        values = codec.REPLY[P.OP[op]].decode(body)
        return 0, values + ((payload,) if plen else ())

    def post(self, op: str, *values, payload: bytes = b"", alone: bool = False) -> None:
        """A one-way frame; mostly followed by a PING, which takes its error, if any (else
        the next call would answer that error, undone)."""
        self.seq += 1
        self._send(frame(op, *_fit(op, values), flags=P.FLAG_ONEWAY, seq=self.seq,
                         payload=payload))
        if not alone and self.rng.random() < 0.6:
            self.call("PING")

    def got(self, op: str, *values, **kw):
        """The reply's first value, or None."""
        status, reply = self.call(op, *values, **kw)
        return reply[0] if status == 0 and reply else None

    # -- what to name --------------------------------------------------------------------

    def pick(self, kind: str) -> int:
        """A handle or address of ``kind``: mostly one this guest holds, else one it let
        go of, the other connection's, the other VM's, an earlier connection's, an edge."""
        rng = self.rng
        live, dead = self.live[kind], self.dead[kind]
        roll = rng.random()
        if live and roll < 0.8:
            return rng.choice(live)
        if dead and roll < 0.88:
            return rng.choice(dead)
        if self.peer is not None and self.peer.live[kind] and roll < 0.94:
            if kind == "ptr" and self.peer.sentinel and rng.random() < 0.3:
                return self.peer.sentinel[0] + rng.choice([0, 64])
            return rng.choice(self.peer.live[kind])
        if kind == "ptr" and self.loot.canary_ptrs and roll < 0.97:
            return rng.choice(self.loot.canary_ptrs)
        if self.loot.handles and rng.random() < 0.5:
            return rng.choice(self.loot.handles)
        return rng.choice(EDGE)

    def stream(self) -> int:
        roll = self.rng.random()
        if roll < 0.35:
            return 0
        if roll < 0.4:
            return self.rng.choice([1, 2, 3, MAX64])
        return self.pick("stream")

    def safe_ptr(self, need: int = 1) -> tuple[int, int] | None:
        """A live MEM_ALLOC of at least ``need`` bytes: what a kernel may be given."""
        fits = [p for p in self.live["ptr"] if self.sizes.get(p, 0) >= need]
        return (p := self.rng.choice(fits), self.sizes[p]) if fits else None

    def target(self, n: int) -> int:
        """A device address for ``n`` bytes: inside, across the end of, or outside
        what this guest holds. While a capture is under way, never its pool or mapped
        memory, which no graph holds back (a replay into it would fault the executor)."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.6 and self.live["ptr"]:
            p = rng.choice(self.live["ptr"])
            size = self.sizes[p]
            return p + rng.choice([0, 0, max(0, size - n), size - 1, size, rng.randrange(size)])
        if roll < 0.75 and not self.captures:
            spans = [(p, 4096) for p in self.live["pptr"]] + self.maps
            if spans:
                p, size = rng.choice(spans)
                return p + rng.choice([0, size - 1, rng.randrange(size)])
        return self.pick("ptr")

    def node_deps(self, graph: int) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:
            mine = self.nodes.get(graph, [])
            chosen = rng.sample(mine, min(len(mine), rng.randint(0, 3)))
        elif roll < 0.7:
            others = [n for g, ns in self.nodes.items() if g != graph for n in ns]
            chosen = rng.sample(others, min(len(others), 2))
        elif roll < 0.8:
            return rng.randbytes(rng.choice([1, 7, 9]))  # not whole handles
        elif roll < 0.9 and self.peer is not None:
            chosen = [n for ns in self.peer.nodes.values() for n in ns][:2]
        else:
            chosen = [rng.choice(EDGE)]
        return struct.pack(f"<{len(chosen)}Q", *chosen)

    def kernel_args(self) -> tuple[int, bytes]:
        """(function, parameters): saxpy on live allocations only (its replay must not
        fault), or a kernel and parameters that do not fit each other."""
        rng = self.rng
        saxpy = [f for f, k in self.kernels.items() if k == "saxpy"]
        noop = [f for f, k in self.kernels.items() if k == "noop"]
        roll = rng.random()
        if roll < 0.45 and saxpy:
            x, y = self.safe_ptr(64), self.safe_ptr(64)
            if x and y:
                n = rng.randint(0, min(x[1], y[1]) // 4)
                return rng.choice(saxpy), SAXPY_PARAMS.pack(2.0, x[0], y[0], n)
        if roll < 0.75 and noop:
            return rng.choice(noop), b""
        if roll < 0.85:  # the wrong size for whatever it names
            return self.pick("function"), rng.randbytes(rng.choice([1, 12, 27, 29, 64]))
        return self.pick("function") if not saxpy else rng.choice(EDGE), b""

    # -- steps ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Valid calls first, each usually made: something of every kind to abuse."""
        rng = self.rng
        ptr, data = self.got("MEM_ALLOC", 4096), rng.randbytes(4096)
        if ptr is not None:
            self.post("MEMCPY_HTOD", ptr, 0, payload=data, alone=True)
            if self.call("PING")[0] == 0:
                self.sentinel = (ptr, data)
        if rng.random() < 0.9:
            module = self.got("MODULE_COMPILE", "fuzz.cu", "", payload=SOURCE)
            if module is not None:
                self.live["module"].append(module)
                for name in ("saxpy", "noop"):
                    function = self.got("MODULE_GET_FUNCTION", module, name)
                    if function is not None:
                        self.live["function"].append(function)
                        self.kernels[function] = name
        for size in (65536, M, 4096):
            ptr = self.got("MEM_ALLOC", size)
            if ptr is not None:
                self.live["ptr"].append(ptr)
                self.sizes[ptr] = size
        for _ in range(2):
            stream = self.got("STREAM_CREATE", 1)
            if stream is not None:
                self.live["stream"].append(stream)
            event = self.got("EVENT_CREATE", 0)
            if event is not None:
                self.live["event"].append(event)
        if rng.random() < 0.7:
            va = self.got("MEM_ADDRESS_RESERVE", 4 * G, 0, 0, 0)
            handle = self.got("MEM_CREATE", G, 1, 0, 1, 0, 0)
            if va is not None and handle is not None:
                self.live["va"].append(va)
                self.reservations[va] = 4 * G
                self.live["mem"].append(handle)
                if self.call("MEM_MAP", va, G, 0, handle, 0)[0] == 0:
                    self.maps.append((va, G))
                    self.call("MEM_SET_ACCESS", va, G, struct.pack("<iiI", 1, 0, 3))
        if rng.random() < 0.7:
            pool = self.got("MEM_POOL_CREATE", 1, 0, 1, 0, 0, 0)
            if pool is not None:
                self.live["pool"].append(pool)
                ptr = self.got("MEM_ALLOC_ASYNC", 4096, pool, 0)
                if ptr is not None:
                    self.live["pptr"].append(ptr)
        if rng.random() < 0.7:
            self.attach(valid=True)
            for region in self.live["region"]:
                for _ in range(2):
                    offset = self.got("REGION_ALLOC", region, 0, 8192)
                    if offset is not None:
                        self.rooms[region].append(offset)
                self.leave_a_room(region)
        if rng.random() < 0.7:
            graph = self.got("GRAPH_CREATE", 0)
            if graph is not None:
                self.live["graph"].append(graph)
                function, params = self.kernel_args()
                node = self.got("GRAPH_ADD_KERNEL_NODE", graph, function, 1, 1, 1, 64, 1, 1, 0,
                                b"", params)
                if node is not None:
                    self.nodes[graph].append(node)
                    self.kernel_nodes.add(node)
                spot = self.safe_ptr(4096)
                if spot is not None:
                    node = self.got("GRAPH_ADD_MEMSET_NODE", graph, spot[0], 0, 5, 1, 4096, 1,
                                    struct.pack("<Q", node) if node else b"")
                    if node is not None:
                        self.nodes[graph].append(node)
                made = self.got("GRAPH_INSTANTIATE", graph, 0)
                if made is not None:
                    self.live["exec"].append(made)
                    self.made_from[made] = graph

    def step(self) -> None:
        rng = self.rng
        kind = rng.choices(
            ["mem", "copy", "module", "launch", "stream", "capture", "graph", "scenario", "vmm",
             "pool", "region", "info", "random", "end"],
            [10, 12, 4, 8, 8, 8, 16, 4, 10, 9, 11, 5, 5, 0.6])[0]
        getattr(self, f"do_{kind}")()

    def do_mem(self) -> None:
        rng = self.rng
        if rng.random() < 0.5 or not self.live["ptr"]:
            size = rng.choice([256, 4096, 65536, 65536, M, 3 * M, 64 * M, 0, 1 << 63])
            ptr = self.got("MEM_ALLOC", size)
            if ptr is not None:
                self.live["ptr"].append(ptr)
                self.sizes[ptr] = size
        else:
            ptr = self.pick("ptr")
            if rng.random() < 0.15:
                ptr += rng.choice([16, 256])  # inside an allocation, not its start
            self.forget("ptr", ptr)
            self.sizes.pop(ptr, None)
            self.call("MEM_FREE", ptr)

    def do_copy(self) -> None:
        rng = self.rng
        roll = rng.random()
        n = rng.choice([1, 64, 4096, 8192, 65536])
        if roll < 0.3 and not self.captures:  # written and read back whole: checked
            spot = self.safe_ptr(n)
            if spot is None:
                return
            at = spot[0] + rng.randrange(spot[1] - n + 1)
            data = rng.randbytes(n)
            self.post("MEMCPY_HTOD", at, 0, payload=data, alone=True)  # its error: the next
            status, got = self.call("MEMCPY_DTOH", at, n, 0)
            if status == 0:
                assert got[0] == data, "a guest did not read back what it wrote"
                self.loot.data_checks += 1
        elif roll < 0.5:
            self.post("MEMCPY_HTOD", self.target(n), self.stream(), payload=rng.randbytes(n))
        elif roll < 0.65:
            self.call("MEMCPY_DTOH", self.target(n), rng.choice([n, 1 << 40]), self.stream())
        elif roll < 0.8:
            self.post("MEMCPY_DTOD", self.target(n), self.target(n), n, self.stream())
        else:
            width = rng.choice([1, 2, 4, 4, 3, 0])
            self.post("MEMSET", self.target(n), n // max(width, 1), rng.getrandbits(32), width,
                      self.stream())

    def do_module(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.35 or not self.live["module"]:
            options = rng.choice(["", "--std=c++17", "--time=/tmp/x", "-I/etc\0-default-device"])
            source = SOURCE if rng.random() < 0.85 else b"#error no\n" + SOURCE
            status, got = self.call("MODULE_COMPILE", "fuzz.cu", options, payload=source)
            if status == 0:
                self.live["module"].append(got[0])
        elif roll < 0.45:
            self.call("MODULE_LOAD_DATA", payload=rng.randbytes(rng.choice([0, 4, 100, 5000])))
        elif roll < 0.75:
            name = rng.choice(["saxpy", "noop", "noop", "nope", "", "saxpy\0x"])
            function = self.got("MODULE_GET_FUNCTION", self.pick("module"), name)
            if function is not None:
                self.live["function"].append(function)
                self.kernels[function] = name
        elif roll < 0.85:
            module = self.pick("module")
            self.forget("module", module)
            self.call("MODULE_UNLOAD", module)  # its functions are stale from here
        else:
            function = self.pick("function")
            op = rng.choice(["FUNC_GET_PARAM_INFO", "FUNC_GET_ATTRIBUTES", "FUNC_GET_ATTRIBUTE",
                             "FUNC_SET_ATTRIBUTE", "OCCUPANCY_MAX_BLOCKS"])
            args = {"FUNC_GET_PARAM_INFO": (function,),
                    "FUNC_GET_ATTRIBUTES": (function, rng.choice([0, 16, 33, 1 << 31])),
                    "FUNC_GET_ATTRIBUTE": (function, rng.choice([0, 8, 99, -1])),
                    "FUNC_SET_ATTRIBUTE": (function, rng.choice([8, 9, 1, -5]),
                                           rng.choice([0, 100, -1, 1 << 30])),
                    "OCCUPANCY_MAX_BLOCKS": (function, rng.choice([0, 256, -1]),
                                             rng.choice([0, MAX64]), 0)}[op]
            self.call(op, *args)

    def do_launch(self) -> None:
        rng = self.rng
        function, params = self.kernel_args()
        grid = rng.choice([(1, 1, 1), (4, 1, 1), (0, 1, 1), (1 << 31, 1 << 16, 1)])
        block = rng.choice([(256, 1, 1), (1, 1, 1), (2048, 1, 1), (0, 0, 0)])
        stream = self.stream()
        if rng.random() < 0.8:
            self.post("LAUNCH_KERNEL", function, *grid, *block, rng.choice([0, 0, 1 << 20]),
                      stream, params)
        else:
            attrs = rng.randbytes(rng.choice([0, 72, 144, 71]))
            self.post("LAUNCH_KERNEL_EX", function, *grid, *block, 0, stream, params, attrs)
        if rng.random() < 0.3:
            if rng.random() < 0.5:
                self.call(rng.choice(["CTX_SYNCHRONIZE", "PING"]))
            else:
                self.sync(stream)

    def do_stream(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            stream = self.got("STREAM_CREATE", rng.choice([0, 1, 1, 2, 0xFFFFFFFF]))
            if stream is not None:
                self.live["stream"].append(stream)
        elif roll < 0.25:
            stream = self.got("STREAM_CREATE_PRIORITY", rng.choice([0, 1]),
                              rng.choice([0, -5, 7, -(1 << 31)]))
            if stream is not None:
                self.live["stream"].append(stream)
        elif roll < 0.35:
            stream = self.pick("stream")
            self.forget("stream", stream)
            self.captures.pop(stream, None)
            self.call("STREAM_DESTROY", stream)  # perhaps while it captures
        elif roll < 0.5:
            event = self.got("EVENT_CREATE", rng.choice([0, 2, 0xFFFF]))
            if event is not None:
                self.live["event"].append(event)
        elif roll < 0.6:
            event = self.pick("event")
            self.forget("event", event)
            self.call("EVENT_DESTROY", event)
        elif roll < 0.72:
            self.post("EVENT_RECORD", self.pick("event"), self.stream())
        elif roll < 0.82:
            self.post("STREAM_WAIT_EVENT", self.stream(), self.pick("event"),
                      rng.choice([0, 1, 7]))
        else:
            op = rng.choice(["STREAM_SYNCHRONIZE", "STREAM_QUERY", "EVENT_QUERY",
                             "EVENT_SYNCHRONIZE", "EVENT_ELAPSED_TIME"])
            if op == "STREAM_SYNCHRONIZE":
                self.sync(self.stream())
            elif op == "STREAM_QUERY":
                self.call(op, self.stream())
            elif op == "EVENT_ELAPSED_TIME":
                self.call(op, self.pick("event"), self.pick("event"))
            else:
                self.call(op, self.pick("event"))

    def sync(self, stream: int) -> None:
        self.call("STREAM_SYNCHRONIZE", stream)
        if stream in self.captures:  # refused, and it invalidated the capture:
            self.captures.pop(stream)
            self.end_capture(stream)  # ended now, making no graph

    def end_capture(self, stream: int) -> None:
        graph = self.got("STREAM_END_CAPTURE", stream)
        if graph is not None:
            self.live["graph"].append(graph)

    def do_capture(self) -> None:
        rng = self.rng
        roll = rng.random()
        free = [s for s in self.live["stream"] if s not in self.captures]
        if roll < 0.35:
            stream = rng.choice(free) if free and rng.random() < 0.8 else self.stream()
            status, got = self.call("STREAM_BEGIN_CAPTURE", stream,
                                    rng.choice([0, 1, 2, 2, 3, 0xFFFFFFFF]))
            if status == 0:
                self.captures[stream] = got[1]
        elif roll < 0.5:
            stream = rng.choice(list(self.captures)) if self.captures else self.stream()
            status, got = self.call("STREAM_CAPTURE_INFO", stream, rng.choice([0, 1]))
            if status == 0 and got[3] and got[4]:
                self.nodes[got[3]] += list(struct.unpack(f"<{len(got[4]) // 8}Q", got[4]))
        elif roll < 0.85 and (self.captures or roll < 0.55):
            if self.captures and rng.random() < 0.85:
                stream = rng.choice(list(self.captures))
                del self.captures[stream]
            else:
                stream = self.stream()  # not capturing, or another connection's
                if stream in self.captures:
                    del self.captures[stream]
            self.end_capture(stream)
        else:  # work on a capturing stream: captured, or refused and invalidating it
            if not self.captures:
                return
            stream = rng.choice(list(self.captures))
            choice = rng.random()
            if choice < 0.4:
                function, params = self.kernel_args()
                self.post("LAUNCH_KERNEL", function, 1, 1, 1, 32, 1, 1, 0, stream, params)
            elif choice < 0.7:
                spot = self.safe_ptr(64)
                if spot:
                    self.post("MEMSET", spot[0], 16, 7, 4, stream)
            elif choice < 0.85:  # staged by the executor: never captured
                self.post("MEMCPY_HTOD", self.target(64), stream, payload=b"x" * 64)
            else:
                self.post("EVENT_RECORD", self.pick("event"), stream)

    def do_graph(self) -> None:
        rng = self.rng
        roll = rng.random()
        graph = self.pick("graph")
        if roll < 0.1 or not self.live["graph"]:
            made = self.got("GRAPH_CREATE", rng.choice([0, 0, 0, 1]))
            if made is not None:
                self.live["graph"].append(made)
        elif roll < 0.45:
            deps = self.node_deps(graph)
            which = rng.random()
            if which < 0.3:
                function, params = self.kernel_args()
                node = self.got("GRAPH_ADD_KERNEL_NODE", graph, function, 1, 1, 1, 64, 1, 1,
                                rng.choice([0, 0, 1 << 20]), deps, params)
                if node is not None:
                    self.kernel_nodes.add(node)
            elif which < 0.5:
                spot = self.safe_ptr(256)
                dst = spot[0] if spot and rng.random() < 0.7 else self.pick("ptr")
                node = self.got("GRAPH_ADD_MEMSET_NODE", graph, dst,
                                rng.choice([0, 64, 256, MAX64]), 9,
                                rng.choice([1, 2, 4, 3]), rng.choice([16, 64, 0, 1 << 40]),
                                rng.choice([1, 2, 0]), deps)
            elif which < 0.75:
                node = self.memcpy_node(graph, deps)
            elif which < 0.9:
                node = self.got("GRAPH_ADD_EVENT_NODE", graph, rng.choice([0, 1, 2]), 0,
                                self.pick("event"), deps)
            else:
                node = self.got("GRAPH_ADD_EMPTY_NODE", graph, deps)
            if node is not None:
                self.nodes[graph].append(node)
        elif roll < 0.5:
            self.call("GRAPH_ADD_DEPENDENCIES", graph, self.node_deps(graph),
                      self.node_deps(graph))
        elif roll < 0.58:
            status, got = self.call("GRAPH_GET_NODES", graph,
                                    rng.choice([0, 1, 16, 0xFFFFFFFF]))
            if status == 0 and got[1]:
                self.nodes[graph] += list(struct.unpack(f"<{len(got[1]) // 8}Q", got[1]))
        elif roll < 0.65:
            made = self.got("GRAPH_INSTANTIATE", graph, rng.choice([0, 0, 1, 8, MAX64]))
            if made is not None:
                self.live["exec"].append(made)
                self.made_from[made] = graph
        elif roll < 0.78:
            exec_ = self.pick("exec")
            if rng.random() < 0.7:
                self.post("GRAPH_LAUNCH", exec_, self.stream())
            else:
                self.post("GRAPH_UPLOAD", exec_, self.stream())
            if rng.random() < 0.5:
                self.call("CTX_SYNCHRONIZE")
        elif roll < 0.88:
            exec_ = self.pick("exec")
            if rng.random() < 0.4:
                self.call("GRAPH_EXEC_UPDATE", exec_, graph)
            else:
                function, params = self.kernel_args()
                # mostly a kernel node of the graph it was made from; else any node
                nodes = [n for n in self.nodes.get(self.made_from.get(exec_), ())
                         if n in self.kernel_nodes]
                if not nodes or rng.random() < 0.3:
                    nodes = [n for ns in self.nodes.values() for n in ns] or [17]
                self.call("GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", exec_, rng.choice(nodes),
                          function, 1, 1, 1, 32, 1, 1, 0, params)
        elif roll < 0.94:
            self.forget("graph", graph)
            self.call("GRAPH_DESTROY", graph)  # twice, while instantiated, while capturing
        else:
            exec_ = self.pick("exec")
            self.forget("exec", exec_)
            self.call("GRAPH_EXEC_DESTROY", exec_)

    def do_scenario(self) -> None:
        """A graph is built and instantiated on what the guest holds, then the guest lets go
        of that (memory, module, event, region, the graph itself) and launches what it
        instantiated: the replay must find all of it still there (the executor keeps
        what a graph names until the last graph goes), or the executor would fault."""
        rng = self.rng
        spot = self.safe_ptr(4096)
        saxpy = [f for f, k in self.kernels.items() if k == "saxpy"]
        stream = rng.choice(self.live["stream"] or [0])
        if spot is None:
            return
        ptr = spot[0]
        if rng.random() < 0.5 and stream:  # captured
            if self.call("STREAM_BEGIN_CAPTURE", stream, 2)[0]:
                return
            if saxpy:
                self.post("LAUNCH_KERNEL", saxpy[0], 1, 1, 1, 64, 1, 1, 0, stream,
                          SAXPY_PARAMS.pack(3.0, ptr, ptr, 64), alone=True)
            self.post("MEMSET", ptr, 64, 1, 4, stream, alone=True)
            event = rng.choice(self.live["event"] or [0])
            if event:
                self.post("EVENT_RECORD", event, stream, alone=True)
            region = rng.choice([r for r in self.live["region"] if self.rooms.get(r)] or [0])
            if region:
                self.post("MEMCPY_DTOH_REGION", region, 0, self.rooms[region][0], ptr, 64, stream,
                          alone=True)
            graph = self.got("STREAM_END_CAPTURE", stream)
        else:  # built node by node
            graph = self.got("GRAPH_CREATE", 0)
            event = region = 0
            if graph is not None:
                if saxpy:
                    self.got("GRAPH_ADD_KERNEL_NODE", graph, saxpy[0], 1, 1, 1, 64, 1, 1, 0, b"",
                             SAXPY_PARAMS.pack(3.0, ptr, ptr, 64))
                self.got("GRAPH_ADD_MEMSET_NODE", graph, ptr, 0, 1, 4, 64, 1, b"")
                event = rng.choice(self.live["event"] or [0])
                if event:
                    self.got("GRAPH_ADD_EVENT_NODE", graph, 0, 0, event, b"")
                region = rng.choice([r for r in self.live["region"] if self.rooms.get(r)] or [0])
                if region:
                    self.got("GRAPH_ADD_MEMCPY_NODE", graph, 2, region, self.rooms[region][0],
                             ptr, 64, b"")
        if graph is None:
            return
        self.live["graph"].append(graph)
        exec_ = self.got("GRAPH_INSTANTIATE", graph, 0)
        if exec_ is None:
            return
        self.live["exec"].append(exec_)
        # let go of what it names, in some order
        gone = [lambda: self.call("MEM_FREE", ptr), lambda: self.call("GRAPH_DESTROY", graph)]
        if event:
            gone.append(lambda: self.call("EVENT_DESTROY", event))
        detach = rng.random() < 0.5
        if region and detach:
            gone.append(lambda: self.call("REGION_DETACH", region))
        elif region:  # the room it copies to (whose next owner may be another connection)
            room = self.rooms[region].pop(0)
            gone.append(lambda: self.call("REGION_FREE", region, 0, room))
        if saxpy and rng.random() < 0.5:
            module = rng.choice(self.live["module"] or [0])
            gone.append(lambda: self.call("MODULE_UNLOAD", module))
            self.forget("module", module)
        rng.shuffle(gone)
        for undo in gone[:rng.randint(1, len(gone))]:
            undo()
        for kind, value in (("ptr", ptr), ("graph", graph), ("event", event),
                            ("region", region if detach else 0)):
            self.forget(kind, value)
        self.sizes.pop(ptr, None)
        view = self.views.pop(region, None) if detach else None
        if view is not None and view[2]:
            view[0].close()
        if self.peer is not None and self.peer.alive:  # another process of the VM takes
            for theirs in self.peer.live["region"]:     # room in the device region now
                self.peer.leave_a_room(theirs)
        for _ in range(rng.randint(1, 3)):
            self.post("GRAPH_LAUNCH", exec_, rng.choice([stream, 0]), alone=True)
        status, _ = self.call("CTX_SYNCHRONIZE")
        assert status not in P.STICKY_STATUSES, "a graph's replay faulted"
        if rng.random() < 0.6:
            self.forget("exec", exec_)
            self.call("GRAPH_EXEC_DESTROY", exec_)

    def memcpy_node(self, graph: int, deps: bytes):
        rng = self.rng
        kind = rng.choice([0, 1, 2, 2, 3])
        size = rng.choice([64, 4096, 0, 1 << 40])
        region = self.pick("region")
        offset = self.room(region)
        spot = self.safe_ptr(4096)
        ptr = spot[0] if spot and rng.random() < 0.8 else self.pick("ptr")
        other = self.safe_ptr(4096)
        dst, src = {0: (ptr, other[0] if other else ptr), 1: (ptr, offset),
                    2: (offset, ptr)}.get(kind, (ptr, ptr))
        return self.got("GRAPH_ADD_MEMCPY_NODE", graph, kind, region, dst & MAX64, src & MAX64,
                        size, deps)

    def do_vmm(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.15:
            size = rng.choice([4 * G, 8 * G, G + 4096, 0, 1 << 50])
            start = self.got("MEM_ADDRESS_RESERVE", size, rng.choice([0, G, 3]),
                             rng.choice([0, 0, 4096, 12345]), rng.choice([0, 0, 1]))
            if start is not None:
                self.live["va"].append(start)
                self.reservations[start] = size
        elif roll < 0.22:
            start = self.pick("va")
            size = self.reservations.get(start, 4 * G)
            if rng.random() < 0.8:
                self.forget("va", start)
            self.call("MEM_ADDRESS_FREE", start, size if rng.random() < 0.8 else G)
        elif roll < 0.37:
            size = rng.choice([G, 2 * G, G + 1, 0, 64 * M])
            valid = rng.random() < 0.6
            handle = self.got("MEM_CREATE", size, 1 if valid else rng.choice([1, 0]),
                              0 if valid else rng.choice([0, 1]), 1,
                              0 if valid else rng.choice([0, 1]),
                              0 if valid else rng.choice([0, 0xFF]))
            if handle is not None:
                self.live["mem"].append(handle)
        elif roll < 0.45:
            handle = self.pick("mem")
            if rng.random() < 0.8:
                self.forget("mem", handle)
            self.call("MEM_RELEASE", handle)  # perhaps still mapped
        elif roll < 0.62:
            base = self.pick("va") if self.live["va"] else self.pick("ptr")
            start = base + rng.choice([0, 0, G, 2 * G, 4096])
            size = rng.choice([G, G, 2 * G, 4096])
            status, _ = self.call("MEM_MAP", start, size, rng.choice([0, 0, G, 4096]),
                                  self.pick("mem"), rng.choice([0, 0, 1]))
            if status == 0:
                self.maps.append((start, size))
        elif roll < 0.72:
            start, size = rng.choice(self.maps) if self.maps else (self.pick("va"), G)
            if rng.random() < 0.2:
                size += G
            status, _ = self.call("MEM_SET_ACCESS", start, size,
                                  rng.choice([struct.pack("<iiI", 1, 0, 3),
                                              struct.pack("<iiI", 1, 0, 3),
                                              struct.pack("<iiI", 1, 1, 3),
                                              struct.pack("<iiI", 2, 0, 3),
                                              struct.pack("<iiI", 1, 0, 1),
                                              b"", rng.randbytes(13)]))
        elif roll < 0.82:
            start, size = rng.choice(self.maps) if self.maps else (self.pick("va"), G)
            size = rng.choice([size, size, G, size + G, 4096])
            if self.call("MEM_UNMAP", start, size)[0] == 0:
                self.maps = [m for m in self.maps if not start <= m[0] < start + size]
        else:
            start = rng.choice(self.maps)[0] if self.maps else self.pick("va")
            op = rng.choice(["MEM_GET_ACCESS", "MEM_RETAIN_HANDLE", "MEM_HANDLE_INFO",
                             "MEM_GET_GRANULARITY"])
            value = {"MEM_GET_ACCESS": start + rng.choice([0, 4096]),
                     "MEM_RETAIN_HANDLE": start, "MEM_HANDLE_INFO": self.pick("mem"),
                     "MEM_GET_GRANULARITY": rng.choice([0, 1, 2])}[op]
            got = self.got(op, value)
            if op == "MEM_RETAIN_HANDLE" and got is not None:
                self.live["mem"].append(got)

    def do_pool(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.12:
            valid = rng.random() < 0.6
            pool = self.got("MEM_POOL_CREATE", 1 if valid else rng.choice([1, 0]),
                            0 if valid else rng.choice([0, 1]), 1,
                            0 if valid else rng.choice([0, 1]), rng.choice([0, 4 * M, 1]), 0)
            if pool is not None:
                self.live["pool"].append(pool)
        elif roll < 0.18:
            pool = self.got("MEM_POOL_DEFAULT")
            if pool is not None and pool not in self.live["pool"]:
                self.live["pool"].append(pool)
        elif roll < 0.26:
            pool = self.pick("pool")
            if rng.random() < 0.8:
                self.forget("pool", pool)
            self.call("MEM_POOL_DESTROY", pool)  # perhaps with live allocations
        elif roll < 0.5:
            stream = self.stream()
            ptr = self.got("MEM_ALLOC_ASYNC", rng.choice([100, 4096, M, 3 * M, 40 * M, 0]),
                           self.pick("pool") if rng.random() < 0.7 else 0, stream)
            if ptr is not None:
                self.live["pptr"].append(ptr)
        elif roll < 0.68:
            ptr = self.pick("pptr")
            self.forget("pptr", ptr)
            self.post("MEM_FREE_ASYNC", ptr, self.stream())
            if rng.random() < 0.5:
                self.call("PING")
        elif roll < 0.78:
            self.call("MEM_POOL_TRIM_TO", self.pick("pool"), rng.choice([0, 4 * M, MAX64]))
        elif roll < 0.9:
            self.call("MEM_POOL_SET_ATTRIBUTE", self.pick("pool"),
                      rng.choice([1, 2, 3, 4, 4, 5, 6, 7, 8, 9, -1]),
                      rng.choice([0, 1, 4 * M, MAX64]))
        else:
            self.call("MEM_POOL_GET_ATTRIBUTE", self.pick("pool"),
                      rng.choice([1, 4, 5, 6, 7, 8, 0, 99]))

    def leave_a_room(self, region: int) -> None:
        """In the VM's device region, a room filled once and left alone."""
        view = self.views.get(region)
        if view is None or view[2] or len(self.sentinel_rooms) >= 8:
            return
        offset = self.got("REGION_ALLOC", region, 0, 4096)
        if offset is not None:
            data = self.rng.randbytes(4096)
            view[0][offset:offset + 4096] = data
            self.sentinel_rooms.append((region, offset, data))

    def room(self, region: int) -> int:
        """An offset in a region: a room of this guest's, the other connection's room
        that it left alone, or one that is no room; never a room this guest left alone
        (its own copy or REGION_FREE there may change or give it away: what check_sentinels
        would hold against the other connection)."""
        rng = self.rng
        roll = rng.random()
        # the other's left rooms while it holds their region: once it detached, the room
        # went back to the region and may be this guest's now
        theirs = [offset for r, offset, _ in self.peer.sentinel_rooms
                  if r in self.peer.live["region"]] if self.peer is not None else []
        if roll < 0.15 and theirs:
            offset = rng.choice(theirs)
        else:
            offset = rng.choice(self.rooms.get(region) or [0])
            offset = offset + rng.choice([0, 0, 0, 4096, -4096, 1, 1 << 40]) if roll < 0.9 \
                else rng.choice(EDGE)
        if any(r == region and at <= offset < at + 4096 for r, at, _ in self.sentinel_rooms):
            return 1 << 40  # no room
        return offset

    def do_region(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            self.attach()
        elif roll < 0.3:
            region = self.pick("region")
            self.forget("region", region)
            view = self.views.pop(region, None)
            self.call("REGION_DETACH", region)  # perhaps while a graph copies to it
            if view is not None and view[2]:
                view[0].close()
        elif roll < 0.5:
            region = self.pick("region")
            offset = self.got("REGION_ALLOC", region, rng.choice([0, 0, 1]),
                              rng.choice([4096, 4096, 1, 65536, 0, 1 << 40]))
            if offset is not None:
                self.rooms[region].append(offset)
        elif roll < 0.6:
            region = self.pick("region")
            offset = self.room(region)
            if offset in self.rooms.get(region, ()):
                self.rooms[region].remove(offset)
            self.call("REGION_FREE", region, 0, offset)
        elif roll < 0.75:
            self.region_round_trip()
        elif roll < 0.8:
            self.leave_a_room(self.pick("region"))
        else:
            region = self.pick("region")
            offset = self.room(region)
            size = rng.choice([64, 4096, 1 << 30])
            if rng.random() < 0.5:
                self.post("MEMCPY_HTOD_REGION", self.target(64), region, 0, offset & MAX64, size,
                          self.stream())
            else:
                self.post("MEMCPY_DTOH_REGION", region, 0, offset & MAX64, self.target(64), size,
                          self.stream())

    def attach(self, valid: bool = False) -> None:
        rng = self.rng
        if self.device_phase and rng.random() < 0.6:
            size = 0 if valid else rng.choice([0, 0, REGION, 4096])
            status, got = self.call("REGION_ATTACH", R.KIND_DEVICE, 0, size)
            if status == 0:
                fd = os.open(self.region_file, os.O_RDWR)  # as the guest maps its BAR
                try:
                    view = mmap.mmap(fd, REGION)
                finally:
                    os.close(fd)
                assert R.unpack_header(view)[1] == got[3]  # its header carries the token
                self.live["region"].append(got[0])
                self.views[got[0]] = (view, REGION, False)
            return
        size = M if valid else rng.choice([M, M, 4 * M, 4096, 5000])
        how = "sealed" if valid else rng.choice(["sealed"] * 5 + [
            "unsealed", "short", "none", "pipe", "two", "flags", "device-fd"])
        fds = []
        if how in ("sealed", "two", "flags", "device-fd"):
            fds = [_memfd(size)]
        elif how == "unsealed":
            fds = [_memfd(size, seal=False)]
        elif how == "short":
            fds = [_memfd(size, room=size // 2)]
        elif how == "pipe":
            fds = list(os.pipe())
        if how == "two":
            fds.append(_memfd(size))
        kind = R.KIND_DEVICE if how == "device-fd" else R.KIND_MEMFD
        for fd in fds:  # as the executor's reader holds them: oldest first, 4 at most
            if len(self.sent_fds) < MAX_HELD_FDS:
                self.sent_fds.append(os.dup(fd))
        taken = self.sent_fds.pop(0) if self.sent_fds else None
        try:
            status, got = self.call("REGION_ATTACH", kind, 1 if how == "flags" else 0, size,
                                    fds=fds)
            if status == 0:
                self.live["region"].append(got[0])
                self.views[got[0]] = (mmap.mmap(taken, size), size, True)
        finally:
            for fd in fds + ([taken] if taken is not None else []):
                os.close(fd)

    def region_round_trip(self) -> None:
        """Bytes into the region, to the device and back out at another offset: checked."""
        rng = self.rng
        mine = [r for r in self.live["region"] if r in self.views]
        spot = self.safe_ptr(4096)
        if not mine or spot is None or self.captures:
            return
        region = rng.choice(mine)
        view, size, own = self.views[region]
        if own:
            src, dst = 0, size - 4096 if size >= 8192 else None
        else:
            rooms = self.rooms.get(region) or []
            if len(rooms) < 2:
                return
            src, dst = rng.sample(rooms, 2)
        if dst is None:
            return
        data = rng.randbytes(4096)
        view[src:src + 4096] = data
        self.post("MEMCPY_HTOD_REGION", spot[0], region, 0, src, 4096, 0, alone=True)
        self.post("MEMCPY_DTOH_REGION", region, 0, dst, spot[0], 4096, 0, alone=True)
        if self.call("STREAM_SYNCHRONIZE", 0)[0] == 0:
            assert view[dst:dst + 4096] == data, "bytes through a region came back changed"
            self.loot.data_checks += 1

    def do_info(self) -> None:
        rng = self.rng
        op = rng.choice(["SLICE_INFO", "MEM_GET_INFO", "VGPU_PROCESSES", "VGPU_UTILIZATION",
                         "DEVICE_GET_ATTRIBUTES", "CTX_GET_LIMIT", "DEVICE_TOTAL_MEM",
                         "TENSOR_MAP_ENCODE_TILED"])
        if op == "SLICE_INFO":
            status, got = self.call(op)
            if status == 0:
                vm, mem, used, _ = got
                assert vm == "vm1" and mem == QUOTA and used <= QUOTA, got
        elif op == "VGPU_PROCESSES":
            status, got = self.call(op)
            if status == 0:
                pids = struct.unpack(f"<{got[0]}I", got[1])
                assert all(p in TENANT_PIDS for p in pids), pids  # never vm2's processes
        elif op == "DEVICE_GET_ATTRIBUTES":
            self.call(op, rng.choice([0, 0, 1, -1]), rng.choice([0, 1, 200, 0xFFFFFFFF]))
        elif op == "CTX_GET_LIMIT":
            self.call(op, rng.choice([0, 1, 9, 10, -1]))
        elif op == "DEVICE_TOTAL_MEM":
            status, got = self.call(op, rng.choice([0, 1]))
            if status == 0:
                assert got[0] == QUOTA
        elif op == "TENSOR_MAP_ENCODE_TILED":
            spot = self.safe_ptr(4096)
            self.call(op, 7, rng.choice([1, 2, 0, 9]), spot[0] if spot else self.pick("ptr"),
                      struct.pack("<2Q", 64, 16), struct.pack("<Q", 256),
                      struct.pack("<2I", 16, 16), struct.pack("<2I", 1, 1), 0, 0, 0, 0)
        else:
            self.call(op)

    def do_random(self) -> None:
        """A frame of any op with edge values, or a well-formed one mutated: the session
        answers or skips it and goes on; a PING then finds the replies in step."""
        rng = self.rng
        # (not its live allocations: a random MEM_FREE of one would leave a kernel of
        # this guest's writing memory given back, a fault of its own making)
        self.fuzz.ptrs = (self.dead["ptr"] + self.live["pptr"]
                          + [m[0] for m in self.maps])[-15:] or [0]
        while True:
            data = self.fuzz.request(self.seq + 1)
            op = struct.unpack_from("<H", data, 4)[0]
            # kernels with random pointers would fault the executor: not what this tests
            if P.op_name(op) not in ("LAUNCH_KERNEL", "LAUNCH_KERNEL_EX", "GRAPH_LAUNCH",
                                     "GRAPH_ADD_KERNEL_NODE",
                                     "GRAPH_EXEC_KERNEL_NODE_SET_PARAMS",
                                     # one takes a descriptor sent before; the other may
                                     # give back the room check_sentinels reads
                                     "REGION_ATTACH", "REGION_DETACH"):
                # nor, while it holds rooms it left alone, one that may give one back or
                # copy into one (a random offset may be one: 4096 is the region's first)
                if not self.sentinel_rooms or P.op_name(op) not in (
                        "REGION_FREE", "MEMCPY_DTOH_REGION", "GRAPH_ADD_MEMCPY_NODE"):
                    break
        if rng.random() < 0.5:
            data = self.fuzz.mutate(data)
        self.seq += 1
        self.sock.sendall(data)
        self.call("PING")

    def do_end(self) -> None:
        self.alive = False

    def forget(self, kind: str, value: int) -> None:
        if value in self.live[kind]:
            self.live[kind].remove(value)
            self.dead[kind].append(value)

    def check_sentinels(self) -> None:
        """What this guest filled and left alone is as it left it, whatever the other
        connection of its VM named."""
        if self.sentinel is not None:
            self.call("PING")  # an earlier one-way frame's error, if any, goes here
            # on a stream of its own: the legacy one joins no capture of any connection
            stream = self.got("STREAM_CREATE", 1) or 0
            status, got = self.call("MEMCPY_DTOH", self.sentinel[0], 4096, stream)
            assert status == 0 and got[0] == self.sentinel[1], "another connection changed " \
                "memory of this one"
            self.loot.data_checks += 1
        # (a room goes with its region: once detached, another connection may have it)
        for region, offset, data in self.sentinel_rooms:
            if region in self.live["region"]:
                with open(self.region_file, "rb") as f:  # as the guest sees its BAR
                    f.seek(offset)
                    assert f.read(4096) == data, "another connection changed this one's room"
                self.loot.data_checks += 1

    def close(self) -> None:
        """Gone, with whatever it holds: at once, politely, or in the middle of a frame."""
        rng = self.rng
        for kind in ("stream", "event", "graph", "exec", "module", "function", "region"):
            self.loot.handles += self.live[kind][:3]
        self.loot.handles = self.loot.handles[-64:]
        how = rng.random()
        try:
            if how < 0.25:  # half a frame: a copy whose payload never comes whole
                body = codec.REQUEST[P.OP["MEMCPY_HTOD"]].encode((self.target(64), 0))
                self.sock.sendall(pack_header(P.OP["MEMCPY_HTOD"], P.FLAG_ONEWAY, self.seq + 1,
                                              0, len(body), 1 << 20) + body + b"x" * 1000)
            elif how < 0.5:
                self.sock.sendall(self.fuzz.breaking(frame("PING", seq=self.seq + 1)))
            if how < 0.75:
                self.sock.shutdown(socket.SHUT_WR)
                read_to_eof(self.sock)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it closed the connection for a broken frame: that is allowed
        self.sock.close()
        for fd in self.sent_fds:
            os.close(fd)
        for view, _, _ in self.views.values():
            view.close()
        self.views.clear()


class ControlFuzz:
    """The control lane, as a member of the control group who sends anything."""

    METHODS = {"gpus": ["connect"], "list": ["connect"], "status": ["connect"],
               "attach": ["vm", "mem", "compute", "gpu", "cid", "placement", "count", "add",
                          "region", "allow_time_shared", "connect"],
               "detach": ["vm", "unplug", "device", "connect"],
               "resize": ["vm", "mem", "compute", "device", "region", "allow_time_shared",
                          "connect"]}
    # a kind no argument of the method takes: a list, an object, or true for a size
    WRONG = [[1], {"a": 1}, [], {}, [[["deep"]]]]

    def __init__(self, agent, rng: random.Random):
        self.path, self.rng = agent.control, rng
        self.calls = 0

    def _raw(self, method: str, body: bytes, metadata=None):
        channel = grpc.insecure_channel(f"unix://{self.path}")
        try:
            stub = channel.unary_unary(f"/{method}", request_serializer=lambda b: b,
                                       response_deserializer=json.loads)
            return stub(body, timeout=30, metadata=metadata)
        finally:
            channel.close()

    def call(self, name: str, body: bytes, metadata=None):
        """The reply; a gRPC failure only where gRPC itself refuses the call."""
        self.calls += 1
        try:
            return self._raw(f"{control_grpc.SERVICE}/{name}", body, metadata)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNIMPLEMENTED,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED), (name, exc)
            return None

    def value(self):
        rng = self.rng
        return rng.choice([None, 0, -1, 1 << 70, 1.5, float("nan"), "", "vm1", "vm2", "64M",
                           "-5M", "1e99", "x" * 10_000, True, False, [], {}, "\0", "é"])

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        name = rng.choice(list(self.METHODS))
        if roll < 0.15:  # no JSON object at all
            body = rng.choice([b"", b"not json", b"[1, 2]", b"\xff\xfe", b"1e999999", b"null",
                               b"[" * 100_000, rng.randbytes(rng.randrange(1, 500)),
                               b'{"vm": "vm1"', b'{"vm": "vm1", "mem": "' + b"9" * 100_000])
            reply = self.call(name, body)
            assert reply is None or reply["code"] == "bad-request", reply
        elif roll < 0.5 and name in ("attach", "detach", "resize"):
            # a change that must be refused whole: one argument of a kind no argument
            # takes, one it does not know, or one of the agent's own
            args = {a: self.value() for a in rng.sample(self.METHODS[name],
                                                        rng.randint(0, 3))}
            args.setdefault("vm", rng.choice(["vm1", "vm2"]))
            poison = rng.random()
            if poison < 0.5:
                args[rng.choice(self.METHODS[name])] = rng.choice(self.WRONG)
            elif poison < 0.75:
                args[rng.choice(["bogus", "VM", "mem ", "\0"])] = 1
            else:
                args["_inventory"] = []
            reply = self.call(name, json.dumps(args).encode())
            assert reply is not None and reply["ok"] is False, (name, args, reply)
        elif roll < 0.65:  # reads, with or without wrong arguments
            args = {} if rng.random() < 0.5 else {"connect": self.value()}
            reply = self.call(rng.choice(["gpus", "list", "status"]), json.dumps(args).encode())
            assert reply is not None
            assert reply["ok"] or isinstance(reply["code"], str), reply
        elif roll < 0.75:  # no such method
            self.calls += 1
            try:
                self._raw(rng.choice([f"{control_grpc.SERVICE}/shutdown",
                                      f"{control_grpc.SERVICE}/_call",
                                      "other.Service/list", f"{control_grpc.SERVICE}/"]), b"{}")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
        elif roll < 0.82:  # huge: past gRPC's 4 MiB, and just under it
            size = rng.choice([5 * M, 3 * M])
            reply = self.call(name, json.dumps({"vm": "x" * size}).encode())
            assert reply is None or reply["ok"] is False
        elif roll < 0.9:  # a caller that states anything about itself
            stated = rng.choice(["root (uid 0, pid 1)", "x" * 5000, "a\" b=c", ""])  # printable
            reply = self.call("list", b"{}", metadata=((control_grpc.CALLER_KEY, stated),))
            assert reply["ok"], reply
        else:
            self.connections()

    def connections(self) -> None:
        """More connections at once than the relay takes, each sending half a request or
        nothing, then gone; a real call is served afterwards."""
        rng = self.rng
        socks = []
        for _ in range(rng.choice([5, 20, control_grpc.RELAY_CLIENTS + 10])):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(self.path)
                s.sendall(rng.choice([b"", b"PRI * HTTP/2.0\r\n",
                                      b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(100),
                                      rng.randbytes(3000)]))
            except OSError:
                pass  # refused or reset: the relay takes so many
            socks.append(s)
        for s in socks:
            s.close()
        self.calls += 1
        wait_for(lambda: self._served(), "the control lane to serve again", timeout=30)

    def _served(self) -> bool:
        try:
            return self._raw(f"{control_grpc.SERVICE}/list", b"{}")["ok"]
        except grpc.RpcError:
            return False


def _scrape(agent) -> dict:
    url = f"http://127.0.0.1:{agent.agent.metrics.port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def _errors(samples, vm: str) -> dict:
    return {dict(labels)["status"]: v for (name, labels), v in samples.items()
            if name == "hvgpu_vgpu_errors_total" and dict(labels).get("vm") == vm}


def _held(agent, pid: int, *tenants: Tenant) -> tuple[int, int]:
    """(what vm1's executor holds of the device, what vm1's ledger charges), once
    every frame the tenants sent has been served. The two are read one after the
    other; the executor gives memory back to the device before its charge to the
    ledger, so a release served in between (a one-way MEM_FREE_ASYNC that was the
    last allocation of a destroyed pool, say) would be read as held and not charged.
    A PING of each connection waits for its frames (served in order); the releases
    the executor then sends the agent can only be late, which reads as more charged."""
    for t in tenants:
        t.call("PING")
    path = agent.tmp / "device-wide" / str(pid)
    device = int(path.read_text() or 0) if path.exists() else 0
    return device, vm_status(agent, "vm1")["mem_used"]


def test_the_device_figure_is_never_put_back_by_an_older_reading(tmp_path, monkeypatch):
    """What _held reads of the device: two sessions publish it from their threads; the
    one whose figure was taken before the other's release puts it in place after."""
    monkeypatch.setenv("HVGPU_FAKE_DEVICE_WIDE", str(tmp_path))
    reached, go = threading.Event(), threading.Event()
    older = None

    class Slow(FakeDevice):
        def _used(self):
            n = super()._used()
            if threading.current_thread() is older:
                reached.set()
                assert go.wait(30)
            return n

    device = Slow()
    ptr = device.mem_alloc(4 * M)
    older = threading.Thread(target=device._publish)  # a figure with the 4 MiB in it
    older.start()
    assert reached.wait(30)
    release = threading.Thread(target=device.mem_free, args=(ptr,))
    release.start()
    release.join(1)  # it may publish now, or wait for the older figure to be in place
    go.set()
    older.join(30)
    release.join(30)
    assert (tmp_path / str(os.getpid())).read_text() == str(device._used())


def _me() -> tuple[int, int]:
    return fds(os.getpid()), threads(os.getpid())


def test_stateful_hostile_sequences_break_nothing_leak_nothing_and_stop_no_one(
        agent, capfd, caplog, tmp_path):
    caplog.set_level(logging.INFO)
    other = OtherVm(agent)
    control = ControlFuzz(agent, random.Random(SEED + 1))
    loot = Loot()
    region_file = str(tmp_path / region_name(VgpuKey("vm1", 0)))
    # vm1's executor started by a raw guest: the guest client would map the device region,
    # which stays mapped while the executor lives, and memfds would not fit beside it
    warm = Tenant(agent, random.Random(0), 0, loot, False, region_file)
    assert warm.got("MEM_ALLOC", M) is not None
    warm.close()
    pid = executor_pid(agent, "vm1")
    other.check()
    with Connection(agent.vm_address("vm2")) as conn:  # the canary's addresses, to aim at
        dev = Device(connection=conn)
        bufs = [dev.allocate(n) for n in (4096, M)]
        loot.canary_ptrs = [b.ptr for b in bufs]
        for b in bufs:
            b.close()
    control.step()
    _scrape(agent)
    wait_for(lambda: vm_status(agent, "vm1")["connections"] == 0, "vm1's first guest to go")
    fds0, threads0, rss0 = fds(pid), threads(pid), rss(pid)
    me0, me_rss0 = _me(), rss(os.getpid())  # the agent runs in this process

    rng = random.Random(SEED)
    number = 0
    for pair in range(PAIRS):
        device_phase = pair >= PAIRS // 2  # the device region takes the whole region budget
        a = Tenant(agent, rng, number, loot, device_phase, region_file)
        b = Tenant(agent, rng, number + 1, loot, device_phase, region_file)
        number += 2
        a.peer, b.peer = b, a
        a.setup()
        b.setup()
        for i in range(STEPS):
            for t in (a, b):
                if t.alive:
                    t.step()
            if not (a.alive or b.alive):
                break
            if i % 10 == 9:  # the ledger never charges less than the device holds
                device, charged = _held(agent, pid, a, b)
                assert device <= charged <= QUOTA, (device, charged)
            if i % 40 == 39:
                control.step()
        for t in (a, b):
            t.check_sentinels()
        a.close()
        b.close()
        if pair % 2 == 1:
            other.check()
            control.step()
    other.check()
    with Connection(agent.vm_address("vm1")) as conn:  # the fuzzed executor still serves
        data = np.arange(M // 4, dtype=np.uint32)
        held = Device(connection=conn).allocate(M)
        held.copy_from(data)
        out = np.empty_like(data)
        held.copy_to(out)
        assert np.array_equal(out, data)
        held.close()
    with Connection(agent.vm_address("vm2")) as conn:  # the canary sees its own alone
        count, pids, _, names = conn.call("VGPU_PROCESSES")
        pids = struct.unpack(f"<{count}I", pids)
        assert not set(pids) & set(TENANT_PIDS), pids
        assert "tenant" not in names and "hostile" not in names
    other.conn.close()

    assert loot.internal == [], loot.internal[:10]
    wait_for(lambda: vm_status(agent, "vm1")["connections"] == 0, "vm1's connections to end")
    assert vm_status(agent, "vm1")["mem_used"] == 0  # the ledger: back to nothing
    assert vm_status(agent, "vm1")["executors"][-1]["pid"] == pid  # never died or replaced
    assert len(vm_status(agent, "vm1")["executors"]) == 1
    wait_for(lambda: fds(pid) <= fds0 + 5, f"the executor's fds to return near {fds0}")
    wait_for(lambda: threads(pid) <= threads0 + 3, f"its threads to return near {threads0}")
    grown = rss(pid) - rss0
    assert grown < 150 * M, f"the fuzzed executor grew by {grown >> 20} MiB"
    wait_for(lambda: _me()[0] <= me0[0] + 10, f"the agent's fds to return near {me0[0]}")
    wait_for(lambda: _me()[1] <= me0[1] + 6, f"the agent's threads to return near {me0[1]}")
    grown = rss(os.getpid()) - me_rss0
    assert grown < 150 * M, f"the agent's process grew by {grown >> 20} MiB"

    # STATS: what the executors reported reached the metrics, each VM's its own
    samples = wait_for_errors(agent)
    assert not _errors(samples, "vm2"), _errors(samples, "vm2")
    labels = set(_errors(samples, "vm1"))
    assert labels <= {name for name, _ in P.STATUSES.values()} | {"UNKNOWN"}, labels

    # the control lane: still answering, nothing changed by what it refused
    client = control_grpc.ControlClient(agent.control)
    try:
        slices = {(s["vm"], s["mem"]) for s in client.call("list")}
        assert slices == {("vm1", QUOTA), ("vm2", QUOTA)}, slices
        assert {s["vm"] for s in client.call("status")} == {"vm1", "vm2"}
    finally:
        client.close()

    out, err = capfd.readouterr()
    for sign in ("Traceback", "Exception in thread", "unexpected", "fake cu"):
        for text in (out, err):
            assert sign not in text, text[max(0, text.find(sign) - 2000):text.find(sign) + 2000]
    bad = [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR
           or "Traceback" in r.getMessage()]
    assert bad == [], bad[:5]

    # the double's device, once vm1's executor ends: nothing left allocated, no graph
    agent.api.detach("vm1")
    (report,) = reports(agent, 1, timeout=60)
    assert report["left"] == 0 and report["graphs_left"] == 0, report

    # and the run went deep: each kind of state was made and used, not refused at once
    reached = {op for op, status in loot.by_op if status == 0}
    assert DEEP <= reached, sorted(DEEP - reached)
    assert report["graph_launches"] >= 100 and loot.data_checks >= 100, \
        (report, loot.data_checks)
    assert control.calls >= 20


def wait_for_errors(agent) -> dict:
    """A scrape once vm1's executor has reported the failures of its guests."""
    found = {}

    def reported():
        found.update(_scrape(agent))
        return bool(_errors(found, "vm1"))
    wait_for(reported, "vm1's errors in the metrics", timeout=30)
    return found


def test_a_guest_never_aims_its_own_copies_at_the_rooms_it_left_alone():
    """check_sentinels holds a changed room against the other connection, so the run's
    own aims must stay off the rooms a guest filled and left alone: an offset next to
    one of its rooms, an edge value, or the other connection's left room once that one
    detached the region and this guest was given the room, named in its own copy or
    REGION_FREE, changes or gives away its own room, as it may."""
    peer = Tenant.__new__(Tenant)  # only what room() reads
    peer.live = defaultdict(list, region=[3])  # its region 1 detached: its rooms given back
    peer.sentinel_rooms = [(1, 24576, b""), (3, 32768, b"")]
    me = Tenant.__new__(Tenant)
    me.rng, me.peer = random.Random(0), peer
    me.rooms = defaultdict(list, {1: [20480]})
    me.sentinel_rooms = [(1, 4096, b""), (1, 24576, b"")]  # 24576: the peer's, given again
    aims = {me.room(1) for _ in range(5000)}
    mine = [a for a in aims if any(r == 1 and o <= a < o + 4096 for r, o, _ in me.sentinel_rooms)]
    assert mine == []
    assert 32768 in aims and 20480 in aims  # the other's left room, and its own, still named
