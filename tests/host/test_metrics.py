"""Prometheus metrics (``hvgpu agent --metrics``), scraped as Prometheus would.

The agent runs in a thread with the GPU test double and recorded NVML answers
(tests/fake_nvml.py); a guest allocates, launches and copies, and the test
reads /metrics over HTTP and checks what an operator would check. Values are
polled until they arrive (executors report every few seconds), never timed.
"""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import threading
import time
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

from hvgpu import __version__
from hvgpu.errors import ConnectionLost, CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.host.cli import cli
from hvgpu.host.executor import messages
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.fake_nvml import FakeNvml, gpu
from tests.host.test_agent import SAXPY

parser = pytest.importorskip("prometheus_client.parser")

M = 1 << 20
UUID = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"  # the test double's GPU (conftest)
VGPU = {"vm": "vm1", "device": "0", "gpu": "0", "uuid": UUID}


def scrape(agent) -> dict:
    """{(name, frozenset(labels)): value} of one scrape, sample names as exposed."""
    url = f"http://127.0.0.1:{agent.agent.metrics.port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in parser.text_string_to_metric_families(text)
            for s in family.samples}


def value(samples, name, **labels):
    return samples.get((name, frozenset({**VGPU, **labels}.items())))


def wait_for(agent, check, timeout=60.0):
    """The first scrape for which check(samples) is true."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(agent)
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never got there; last scrape: {samples}")
        time.sleep(0.2)


@pytest.fixture
def nvml():
    return FakeNvml([gpu(UUID, 1, used_gib=0, util=40, processes={})])


@pytest.fixture
def agent(tmp_path, nvml):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",), nvml=nvml,
                           metrics="127.0.0.1:0")
    running.agent.sampler.every = 0.2  # readings come sooner; nothing waits on them
    yield running
    running.stop()


def _executor_pid(agent):
    (st,) = agent.api.status()
    return st["executors"][0]["pid"] if st["executors"] else None


def test_a_scrape_shows_what_the_guest_did(agent, nvml):
    agent.api.attach("vm1", "64M", "25%", allow_time_shared=True)
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        kernel = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
        x = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
        dx, dy = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
        held = dev.allocate(8 * M)
        dx.copy_from(x)
        dy.copy_from(x)
        for _ in range(5):
            launch(kernel, LaunchConfig(grid=4, block=256), np.float32(2), dx, dy, x.size)
        out = np.empty_like(x)
        dy.copy_to(out)
        with pytest.raises(CudaError):  # one failed call, by its status
            dev.allocate(1 << 30)
        (st,) = agent.api.status()
        assert st["mem_used"] >= 10 * M
        pid = st["executors"][0]["pid"]
        nvml.gpus[0]["processes"] = {pid: 37, 999999: 90}  # another process's share is not ours

        s = wait_for(agent, lambda s: value(s, "hvgpu_vgpu_launches_total") == 5
                     and value(s, "hvgpu_vgpu_utilization_ratio") == 0.37)
        assert value(s, "hvgpu_vgpu_memory_limit_bytes") == 64 * M
        assert value(s, "hvgpu_vgpu_memory_used_bytes") == st["mem_used"]
        assert value(s, "hvgpu_vgpu_compute_share_ratio") == 0.25
        assert value(s, "hvgpu_vgpu_connections") == 1
        assert value(s, "hvgpu_vgpu_copy_bytes_total", direction="to_gpu") == 2 * x.nbytes
        assert value(s, "hvgpu_vgpu_copy_bytes_total", direction="from_gpu") == x.nbytes
        assert value(s, "hvgpu_vgpu_round_trips_total") >= 5  # allocations, compile, copy back
        assert value(s, "hvgpu_vgpu_errors_total", status="CUDA_ERROR_OUT_OF_MEMORY") == 1
        assert value(s, "hvgpu_vgpu_executor_restarts_total") == 0
        # the GPU's name once, in its info metric; its series carry index and UUID only
        gpu_labels = frozenset({"gpu": "0", "uuid": UUID}.items())
        assert s[("hvgpu_gpu_info", gpu_labels | {("name", "NVIDIA H200")})] == 1
        assert s[("hvgpu_gpu_memory_total_bytes", gpu_labels)] == 1 << 30
        assert s[("hvgpu_gpu_memory_reserved_bytes", gpu_labels)] == 64 * M
        assert s[("hvgpu_gpu_utilization_ratio", gpu_labels)] == 0.40
        assert not [key for key in s if key[0] != "hvgpu_gpu_info" and
                    "name" in dict(key[1])]
        assert not [key for key in s if key[0].endswith("_percent")]  # fractions: 0 to 1
        assert s[("hvgpu_vgpus", frozenset())] == 1 and s[("hvgpu_vms", frozenset())] == 1
        assert ("hvgpu_slices", frozenset()) not in s  # it counted vGPUs: hvgpu_vgpus
        assert s[("hvgpu_gpus", frozenset())] == 1 and s[("hvgpu_nvml_up", frozenset())] == 1
        assert s[("hvgpu_build_info", frozenset({"version": __version__}.items()))] == 1
        held.close()


def test_counters_survive_an_executor_that_is_killed(agent):
    agent.api.attach("vm1", "64M")
    with Connection(agent.vm_address("vm1")) as conn:
        dev = Device(connection=conn)
        buf = dev.allocate(M)
        buf.copy_from(np.zeros(M, dtype=np.uint8))
        wait_for(agent, lambda s: value(s, "hvgpu_vgpu_copy_bytes_total",
                                        direction="to_gpu") == M)
        os.kill(_executor_pid(agent), signal.SIGKILL)
        with pytest.raises((ConnectionLost, CudaError, OSError)):
            for _ in range(100):  # the connection ends with its executor
                dev.mem_info()
                time.sleep(0.1)
    with Connection(agent.vm_address("vm1")) as conn:  # a new executor
        Device(connection=conn).allocate(M).copy_from(np.zeros(M, dtype=np.uint8))
        s = wait_for(agent, lambda s: value(s, "hvgpu_vgpu_copy_bytes_total",
                                            direction="to_gpu") == 2 * M)
        assert value(s, "hvgpu_vgpu_executor_restarts_total") == 1
        assert value(s, "hvgpu_vgpu_connections") == 1


def test_utilisation_is_absent_where_the_driver_gives_none_and_usage_carries_it(agent, nvml):
    agent.api.attach("vm1", "64M")
    with Connection(agent.vm_address("vm1")) as conn:
        Device(connection=conn).allocate(M)
        pid = _executor_pid(agent)
        record = agent.agent.registry.get(agent.agent.registry.keys_of("vm1")[0])
        ex = record.current

        def usage_reply():
            return agent.agent.call("usage", lambda: agent.agent._answer(ex, messages.USAGE,
                                                                         {"id": 1}))

        nvml.gpus[0]["processes"] = None  # per-process figures not supported
        wait_for(agent, lambda s: value(s, "hvgpu_vgpu_memory_used_bytes") == M
                 and record.util is None)
        assert value(scrape(agent), "hvgpu_vgpu_utilization_ratio") is None
        assert "util" not in usage_reply()
        nvml.gpus[0]["processes"] = {pid: None}  # on the GPU, no sample: it ran nothing
        wait_for(agent, lambda s: value(s, "hvgpu_vgpu_utilization_ratio") == 0)
        nvml.gpus[0]["processes"] = {pid: 63}
        wait_for(agent, lambda s: value(s, "hvgpu_vgpu_utilization_ratio") == 0.63)
        deadline = time.monotonic() + 30
        while usage_reply().get("util") != 63:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        messages.encode(messages.REPLY, id=1, **usage_reply())  # the table carries it


class _BrokenNvml(FakeNvml):
    """NVML that opens, then fails every read (a driver or GPU gone bad)."""

    def nvmlDeviceGetCount(self):
        raise RuntimeError("GPU is lost")


@pytest.mark.parametrize("case, nvml, up", [
    ("no GPU", FakeNvml([]), 1),  # NVML answers and lists none
    ("no driver", FakeNvml(fail_init="Driver Not Loaded"), 0),
    ("broken", _BrokenNvml(), 0),
])
def test_no_gpu_and_a_broken_driver_are_told_apart(tmp_path, case, nvml, up):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",), nvml=nvml,
                           metrics="127.0.0.1:0", gpus=lambda: [])  # the inventory: none
    running.agent.sampler.every = 0.2
    try:
        s = wait_for(running, lambda s: ("hvgpu_nvml_up", frozenset()) in s)
        assert s[("hvgpu_nvml_up", frozenset())] == up, case
        assert s[("hvgpu_gpus", frozenset())] == 0, case
        assert s[("hvgpu_vgpus", frozenset())] == 0
    finally:
        running.stop()


def _tcp_listening() -> set:
    """Inodes of the TCP sockets this process listens on."""
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and f"socket:[{fields[9]}]" in ours:  # LISTEN
                    listening.add(fields[9])
    return listening


def test_no_metrics_server_without_the_option(tmp_path):
    before = _tcp_listening()
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))
    try:
        assert running.agent.metrics is None
        assert _tcp_listening() == before  # nothing listens for scrapes
        servers = [t for t in threading.enumerate()
                   if isinstance(getattr(getattr(t, "_target", None), "__self__", None),
                                 socketserver.BaseServer)]
        assert servers == []
        assert running.agent.snapshot.slices == 0  # the snapshot is there all the same
    finally:
        running.stop()


def test_a_bad_metrics_address_is_refused_before_anything_starts():
    result = CliRunner().invoke(cli, ["agent", "--metrics", "9464"])
    assert result.exit_code == 2
    assert "expected HOST:PORT, for example 127.0.0.1:9464" in result.output
    result = CliRunner().invoke(cli, ["agent", "--metrics", "127.0.0.1:70000"])
    assert result.exit_code == 2 and "not a number in 0..65535" in result.output


def test_a_port_in_use_is_a_clear_error(tmp_path, agent):
    from hvgpu.host.metrics import MetricsError

    taken = f"127.0.0.1:{agent.agent.metrics.port}"
    (tmp_path / "other").mkdir()
    with pytest.raises(MetricsError, match="cannot serve metrics on 127.0.0.1:"):
        RunningAgent(tmp_path / "other", FAKE_DEVICE, metrics=taken)


def _http(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    return reply


def test_the_endpoint_answers_http_as_a_scraper_expects(agent):
    port = agent.agent.metrics.port
    head = _http(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in head
    assert _http(port, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert _http(port, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    gz = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(gz, timeout=10) as reply:
        assert reply.headers["Content-Encoding"] == "gzip"
        import gzip
        assert b"hvgpu_vgpus" in gzip.decompress(reply.read())


def test_a_request_head_over_its_bound_is_refused(agent):
    from hvgpu.host.metrics import REQUEST_MAX

    port = agent.agent.metrics.port
    line = b"GET /metrics HTTP/1.1\r\n" + b"X-Filler: " + b"a" * REQUEST_MAX + b"\r\n"
    try:
        reply = _http(port, line)
    except ConnectionResetError:  # the unread rest of it reset the connection first
        return
    assert reply.startswith(b"HTTP/1.1 431 ")
