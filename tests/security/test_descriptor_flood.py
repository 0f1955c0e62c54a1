"""A local user against the agent's descriptors: idle connections to the metrics
endpoint, and accepts that fail once the descriptors are gone.

Before: prometheus-client's server gave every connection a thread and a
descriptor with no timeout, so 1,030 idle connections took every descriptor of
the agent; guests' connections then timed out, `hvgpu list` failed, and the
agent logged 'Too many open files' at every turn of its loop (784,000 lines in
30 s). Every loop below is bounded in count and in time, and stays on loopback.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest

from hvgpu.guest import Connection, Device
from hvgpu.host import metrics
from hvgpu.host.control_grpc import ControlClient
from hvgpu.host.usage import EMPTY
from tests.conftest import FAKE_DEVICE, RunningAgent

pytest.importorskip("prometheus_client")

IDLE = 300  # well past the bound, well under any test machine's descriptor limit
SCRAPERS = 16  # what the README promises: scrapers held at once


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",),
                           metrics="127.0.0.1:0")
    yield running
    running.stop()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def held_by_server(port: int) -> int:
    """Connected TCP sockets this process holds whose local port is ``port``: the
    server's side of its scrapers (sockets still in the accept queue have no
    descriptor, and the test's own ends have other local ports)."""
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] != "0A" and f"socket:[{fields[9]}]" in ours:
            count += 1
    return count


def open_idle(port: int, n: int, seconds: float = 30.0) -> list[socket.socket]:
    """Up to ``n`` connections that never send a byte, opened within ``seconds``."""
    deadline = time.monotonic() + seconds
    conns = []
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        conns.append(s)
    return conns


def test_idle_connections_to_the_metrics_endpoint_hold_a_bounded_share_of_the_agent(
        agent, caplog):
    port = agent.agent.metrics.port
    threads_before = threading.active_count()
    conns = open_idle(port, IDLE)
    try:
        assert len(conns) > 2 * SCRAPERS
        time.sleep(0.5)  # the server has seen them all
        assert held_by_server(port) <= SCRAPERS
        assert threading.active_count() <= threads_before + 2  # no thread per connection
        # a scrape, a guest and the control lane are all served meanwhile
        assert "hvgpu_vgpus" in scrape(port)
        client = ControlClient(agent.control, timeout=10)
        try:
            client.call("attach", vm="vm1", mem="64M")
            assert [v["vm"] for v in client.call("list")] == ["vm1"]
        finally:
            client.close()
        with Connection(agent.vm_address("vm1")) as conn:
            assert Device(connection=conn).mem_info()[1] == 64 << 20
    finally:
        for s in conns:
            s.close()
    lines = [r for r in caplog.records if r.name == "hvgpu.host.metrics"]
    assert len(lines) <= 3, [r.getMessage() for r in lines]


def test_an_idle_scraper_is_closed_after_its_deadline(agent, monkeypatch):
    monkeypatch.setattr(metrics, "REQUEST_SECONDS", 0.5, raising=False)
    port = agent.agent.metrics.port
    (idle,) = open_idle(port, 1)
    try:
        idle.settimeout(10)
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server, not by us
        assert time.monotonic() - started < 5
    finally:
        idle.close()


@contextmanager
def descriptors_exhausted():
    """No new descriptor can be made in this process meanwhile (the soft limit is
    the lowest free number); the limit is put back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open("/dev/null", os.O_RDONLY)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _failing_accepts(address, caplog, logger: str) -> tuple[list, float]:
    """Connect once while no descriptor is left; (the log lines about accept, CPU
    seconds this process spent) over two seconds of that."""
    s = socket.socket(*address[0])
    s.setblocking(False)
    try:
        caplog.clear()
        with descriptors_exhausted():
            cpu = time.process_time()
            try:
                s.connect(address[1])
            except BlockingIOError:
                pass
            time.sleep(2.0)
            cpu = time.process_time() - cpu
    finally:
        s.close()
    lines = [r.getMessage() for r in caplog.records
             if r.name == logger and "accept" in r.getMessage()]
    return lines, cpu


def test_failing_accepts_of_the_metrics_endpoint_are_logged_once_and_do_not_spin(caplog):
    caplog.set_level(logging.DEBUG)
    server = metrics.MetricsServer("127.0.0.1:0", lambda: EMPTY)
    try:
        lines, cpu = _failing_accepts(((socket.AF_INET, socket.SOCK_STREAM),
                                       ("127.0.0.1", server.port)), caplog,
                                      "hvgpu.host.metrics")
        assert cpu < 0.5  # it rested instead of trying again at once
        assert len(lines) == 1 and "Too many open files" in lines[0]
        assert "hvgpu_vgpus" in scrape(server.port)  # and accepts again once it can
    finally:
        server.stop()


def test_failing_accepts_of_a_guest_listener_are_logged_once_and_do_not_spin(tmp_path,
                                                                              caplog):
    caplog.set_level(logging.DEBUG)
    running = RunningAgent(tmp_path, FAKE_DEVICE)  # no control lane: gRPC makes descriptors
    try:
        lines, cpu = _failing_accepts(((socket.AF_UNIX, socket.SOCK_STREAM),
                                       str(running.socket)), caplog, "hvgpu.host.agent")
        assert len(lines) == 1 and "Too many open files" in lines[0], lines[:3]
        assert cpu < 0.5  # it rested instead of trying again at once
        with Connection(running.address) as conn:  # accepting again
            assert Device(connection=conn).mem_info()[1] > 0
    finally:
        running.stop()
