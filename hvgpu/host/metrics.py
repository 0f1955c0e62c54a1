"""Prometheus metrics of the agent: ``hvgpu agent --metrics ADDR`` serves /metrics.

The only module that uses prometheus-client (for the metric families and
their text formats). Its HTTP server runs in a thread of its own; each scrape
reads the latest snapshot the agent's loop published
(usage.Snapshot: immutable), so a scrape never touches the registry, never
waits for the loop, and never reads NVML (the usage sampler did, off the
loop). Names follow dcgm-exporter and HAMi: ``hvgpu_vgpu_*`` per vGPU
(labels vm, device, gpu, uuid), ``hvgpu_gpu_*`` per GPU (labels gpu, uuid; its
model's name is said once, by the info metric ``hvgpu_gpu_info``), ``hvgpu_*``
for the agent. Prometheus's conventions: a fraction is a ``_ratio`` from 0 to 1,
never a percent; a count is named for what it counts.

The HTTP server is ours (MetricsServer), not prometheus-client's, which serves
each connection from a thread of its own with no timeout and no bound: any
local user could take every descriptor of the agent with idle connections
(1,030 of them stopped its guests and its control lane). Ours is one thread
and a selector, with a bound on connections and a deadline for each.

Must not change anything, and serves nothing but metrics.
"""

from __future__ import annotations

import errno
import gzip
import ipaddress
import logging
import os
import re
import selectors
import socket
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

from hvgpu.errors import HvgpuError
from hvgpu.host.logs import Budget
from hvgpu.host.usage import Snapshot
from hvgpu.virtio.transport import listen_tcp

log = logging.getLogger(__name__)

VGPU_LABELS = ["vm", "device", "gpu", "uuid"]
GPU_LABELS = ["gpu", "uuid"]
GPU_INFO_LABELS = [*GPU_LABELS, "name"]
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # a host name or an IPv4 address

# What scrapers may hold of the agent (any local user can connect): each holds one
# descriptor and at most REQUEST_MAX bytes, for REQUEST_SECONDS to send its request
# and REPLY_SECONDS to take the reply; no more than MAX_SCRAPERS at once.
MAX_SCRAPERS = 16
REQUEST_MAX = 8192  # a request's line and headers (Prometheus sends about 300 bytes)
REQUEST_SECONDS = 5.0
REPLY_SECONDS = 10.0
ACCEPT_BATCH = 64  # accepts in one turn of the loop, so that open scrapes are served too
ACCEPT_PAUSE = 0.5  # seconds without accepting once accept ran out of descriptors
ACCEPT_LOG_EVERY = 10.0  # one line about failed accepts in this many seconds


class MetricsError(HvgpuError):
    code = "bad-metrics-address"


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) of "HOST:PORT": an IPv4 address, [IPv6] or a host name; port 0 takes
    any free one. Raises MetricsError saying what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise MetricsError(f"metrics address {text!r}: expected HOST:PORT, for example "
                           "127.0.0.1:9464 or [::1]:9464")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise MetricsError(f"metrics address {text!r}: port {port!r} is not a number in "
                           "0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise MetricsError(f"metrics address {text!r}: {host!r} is not an IPv6 "
                               "address") from None
    elif ":" in host:
        raise MetricsError(f"metrics address {text!r}: write an IPv6 address in brackets, "
                           "[::1]:9464")
    elif not _HOST.fullmatch(host):
        raise MetricsError(f"metrics address {text!r}: {host!r} is not a host name or "
                           "address")
    return host, int(port)


class Collector:
    """Metric families from the latest snapshot; prometheus-client calls collect() in
    its HTTP thread, once per scrape."""

    def __init__(self, latest: Callable[[], Snapshot]):
        self.latest = latest

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.latest()

        def vgpu_gauge(name, doc):
            return GaugeMetricFamily(name, doc, labels=VGPU_LABELS)

        limit = vgpu_gauge("hvgpu_vgpu_memory_limit_bytes", "Memory quota of the vGPU.")
        used = vgpu_gauge("hvgpu_vgpu_memory_used_bytes",
                          "Device memory the vGPU's executors hold (reserved in its quota "
                          "before the driver allocates it).")
        share = vgpu_gauge("hvgpu_vgpu_compute_share_ratio",
                           "Share of the GPU's SMs of the vGPU (MPS), 0 to 1; 0: none "
                           "reserved, time-shared.")
        util = vgpu_gauge("hvgpu_vgpu_utilization_ratio",
                          "GPU (SM) utilisation of the vGPU's executor processes, 0 to 1, "
                          "from NVML's per-process samples; absent where the driver gives "
                          "none.")
        conns = vgpu_gauge("hvgpu_vgpu_connections", "Guest connections open on the vGPU.")
        launches = CounterMetricFamily("hvgpu_vgpu_launches", "Kernel launches.",
                                       labels=VGPU_LABELS)
        copied = CounterMetricFamily("hvgpu_vgpu_copy_bytes",
                                     "Bytes copied between the guest and the GPU.",
                                     labels=[*VGPU_LABELS, "direction"])
        trips = CounterMetricFamily("hvgpu_vgpu_round_trips",
                                    "Guest calls that waited for the agent's reply.",
                                    labels=VGPU_LABELS)
        restarts = CounterMetricFamily("hvgpu_vgpu_executor_restarts",
                                       "Executors started for the vGPU after its first "
                                       "(a crash, a kill, a poisoned context, a resize "
                                       "under MPS, the VM started again).",
                                       labels=VGPU_LABELS)
        errors = CounterMetricFamily("hvgpu_vgpu_errors", "Guest calls that failed, by "
                                     "CUDA status.", labels=[*VGPU_LABELS, "status"])
        for v in snap.vgpus:
            labels = [v.vm, str(v.device), str(v.gpu), v.uuid]
            limit.add_metric(labels, v.limit)
            used.add_metric(labels, v.used)
            share.add_metric(labels, v.compute / 100)
            if v.util is not None:
                util.add_metric(labels, v.util / 100)
            conns.add_metric(labels, v.connections)
            launches.add_metric(labels, v.launches)
            copied.add_metric([*labels, "to_gpu"], v.to_gpu)
            copied.add_metric([*labels, "from_gpu"], v.from_gpu)
            trips.add_metric(labels, v.round_trips)
            restarts.add_metric(labels, v.restarts)
            for status, n in v.errors:
                errors.add_metric([*labels, status], n)
        yield from (limit, used, share, util, conns, launches, copied, trips, restarts, errors)

        total = GaugeMetricFamily("hvgpu_gpu_memory_total_bytes", "Memory of the GPU.",
                                  labels=GPU_LABELS)
        reserved = GaugeMetricFamily("hvgpu_gpu_memory_reserved_bytes",
                                     "Memory the GPU's slices reserve (their quotas).",
                                     labels=GPU_LABELS)
        gpu_used = GaugeMetricFamily("hvgpu_gpu_memory_used_bytes",
                                     "Memory in use on the GPU, by any process (NVML).",
                                     labels=GPU_LABELS)
        gpu_util = GaugeMetricFamily("hvgpu_gpu_utilization_ratio",
                                     "GPU utilisation, 0 to 1 (NVML).", labels=GPU_LABELS)
        gpu_info = GaugeMetricFamily("hvgpu_gpu_info", "The GPU's model name (empty where "
                                     "it was not read); always 1.", labels=GPU_INFO_LABELS)
        for g in snap.gpus:
            labels = [str(g.index), g.uuid]
            gpu_info.add_metric([*labels, g.name], 1)
            reserved.add_metric(labels, g.memory_reserved)
            if g.memory_total is not None:
                total.add_metric(labels, g.memory_total)
            if g.memory_used is not None:
                gpu_used.add_metric(labels, g.memory_used)
            if g.utilization is not None:
                gpu_util.add_metric(labels, g.utilization / 100)
        yield from (gpu_info, total, reserved, gpu_used, gpu_util)

        yield GaugeMetricFamily("hvgpu_vgpus", "vGPUs the agent serves (each a slice of "
                                "one GPU).", value=len(snap.vgpus))
        yield GaugeMetricFamily("hvgpu_vms", "VMs with at least one vGPU.",
                                value=len({v.vm for v in snap.vgpus}))
        if snap.nvml is not None:  # absent until the first reading, about 2 s
            yield GaugeMetricFamily("hvgpu_gpus", "GPUs in the agent's latest reading; 0 "
                                    "with hvgpu_nvml_up 1: NVML answers and lists none.",
                                    value=snap.gpus_read)
            yield GaugeMetricFamily("hvgpu_nvml_up", "1: the latest reading of the GPUs "
                                    "came from NVML; 0: NVML could not be opened or read "
                                    "(no driver, or a broken one: the agent's log says "
                                    "why).", value=int(snap.nvml))
        info = GaugeMetricFamily("hvgpu_build_info", "The agent's version; always 1.",
                                 labels=["version"])
        info.add_metric([snap.version], 1)
        yield info


class _Scraper:
    """One scraper's connection: the request read so far, then the reply being sent."""

    __slots__ = ("sock", "deadline", "got", "reply", "sent")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.got = bytearray()
        self.reply: bytes | None = None  # None: still reading the request
        self.sent = 0


class MetricsServer:
    """A small HTTP server for /metrics: one thread, one selector, every socket
    non-blocking. A scraper holds one descriptor and a few KiB for a few seconds at
    most; MAX_SCRAPERS are open at once, and a new one closes the oldest that has
    not finished sending its request (a scrape sends its request at once and is
    answered in the same turn, so only idle connections make way). Failed accepts
    pause accepting for a moment and are logged once every ACCEPT_LOG_EVERY
    seconds with the count of the others."""

    def __init__(self, address: str, latest: Callable[[], Snapshot]):
        host, port = parse_address(address)
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise MetricsError("--metrics needs prometheus-client, which is not installed "
                               "(pip install 'hvgpu[host]')") from None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(Collector(latest))
        try:
            self._listener = listen_tcp(host, port, backlog=MAX_SCRAPERS)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {address}: {exc.strerror or exc}") \
                from None
        self.host, self.port = host, self._listener.getsockname()[1]
        self._scrapers: dict[_Scraper, None] = {}  # oldest first
        self._paused_until: float | None = None  # accepting again then
        self._accept_log = Budget(lines=1, per=ACCEPT_LOG_EVERY)
        self._reply_log = Budget(lines=1, per=ACCEPT_LOG_EVERY)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="hvgpu-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host,
                 self.port)

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # full: it is waking anyway
            pass
        self._thread.join(timeout=10)
        os.close(self._wake_w)

    # -- the server's thread ---------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._timeout()):
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._on_scraper(key.data)
                self._expire()
        except Exception:  # a bug here ends the metrics, never the agent
            log.exception("the metrics server failed; no more scrapes are served")
        finally:
            for scraper in list(self._scrapers):
                self._close(scraper)
            self._selector.close()
            self._listener.close()
            os.close(self._wake_r)

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [s.deadline for s in self._scrapers]
        if self._paused_until is not None:
            deadlines.append(self._paused_until)
        return max(0.0, min([now + 1.0, *deadlines]) - now)

    def _expire(self) -> None:
        now = time.monotonic()
        for scraper in [s for s in self._scrapers if s.deadline <= now]:
            self._close(scraper)
        if self._paused_until is not None and self._paused_until <= now:
            self._paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, "listen")

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):  # then the others get their turn
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(exc)
                return
            conn.setblocking(False)
            if len(self._scrapers) >= MAX_SCRAPERS:
                reading = [s for s in self._scrapers if s.reply is None]
                self._close(reading[0] if reading else next(iter(self._scrapers)))
            scraper = _Scraper(conn, time.monotonic() + REQUEST_SECONDS)
            self._scrapers[scraper] = None
            self._selector.register(conn, selectors.EVENT_READ, scraper)

    def _accept_failed(self, exc: OSError) -> None:
        """Out of descriptors or memory, accept fails at once every time it is tried:
        stop trying for ACCEPT_PAUSE (a busy loop would burn a core and, logging each
        failure, fill the journal)."""
        pause = exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
        if pause:
            self._selector.unregister(self._listener)
            self._paused_until = time.monotonic() + ACCEPT_PAUSE
        dropped = self._accept_log.take("accept")
        if dropped is not None:
            more = f" ({dropped} more failures since the last such line)" if dropped else ""
            log.warning("metrics: accepting a scraper failed: %s%s%s", exc.strerror or exc,
                        more, f"; not accepting for {ACCEPT_PAUSE:g} s" if pause else "")

    def _close(self, scraper: _Scraper) -> None:
        self._scrapers.pop(scraper, None)
        try:
            self._selector.unregister(scraper.sock)
        except (KeyError, ValueError):
            pass
        scraper.sock.close()

    def _on_scraper(self, scraper: _Scraper) -> None:
        if scraper.reply is None:
            try:
                chunk = scraper.sock.recv(REQUEST_MAX + 1 - len(scraper.got))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._close(scraper)
                return
            scraper.got += chunk
            end = _END_OF_HEAD.search(scraper.got)
            if end is None and len(scraper.got) <= REQUEST_MAX:
                return
            scraper.reply = (self._respond(bytes(scraper.got[:end.start()])) if end else
                             _reply(431, "Request Header Fields Too Large",
                                    f"a request's line and headers are {REQUEST_MAX} bytes "
                                    "at most\n"))
            scraper.got = bytearray()
            scraper.deadline = time.monotonic() + REPLY_SECONDS
            self._selector.modify(scraper.sock, selectors.EVENT_WRITE, scraper)
        try:
            scraper.sent += scraper.sock.send(memoryview(scraper.reply)[scraper.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(scraper)
            return
        if scraper.sent == len(scraper.reply):  # one request per connection
            self._close(scraper)

    def _respond(self, head: bytes) -> bytes:
        """The whole reply to a request's line and headers."""
        from prometheus_client.exposition import choose_encoder, gzip_accepted

        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _reply(400, "Bad Request", "not an HTTP request\n")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return _reply(405, "Method Not Allowed", "GET /metrics\n", [("Allow", "GET, HEAD")])
        if urlsplit(target).path not in ("/", "/metrics"):
            return _reply(404, "Not Found", "metrics are at /metrics\n")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        try:
            encoder, content_type = choose_encoder(headers.get("accept", ""))
        except Exception:  # a version it cannot parse: the classic text format
            encoder, content_type = choose_encoder("")
        try:
            body = encoder(self._registry)
        except Exception:  # a bug of ours, which every scrape would log again
            if self._reply_log.take("collect") is not None:
                log.exception("metrics: collecting failed")
            return _reply(500, "Internal Server Error", "collecting the metrics failed\n")
        extra = [("Content-Type", content_type)]
        if gzip_accepted(headers.get("accept-encoding", "")):
            body = gzip.compress(body)
            extra.append(("Content-Encoding", "gzip"))
        return _reply(200, "OK", body, extra, head_only=method == "HEAD")


_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")


def _reply(code: int, reason: str, body: bytes | str, headers=(), head_only=False) -> bytes:
    if isinstance(body, str):
        body = body.encode()
        headers = [("Content-Type", "text/plain; charset=utf-8"), *headers]
    lines = [f"HTTP/1.1 {code} {reason}", *(f"{k}: {v}" for k, v in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else body)
