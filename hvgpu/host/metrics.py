"""Prometheus metrics of the agent: ``hvgpu agent --metrics ADDR`` serves /metrics.

The only module that uses prometheus-client. Its HTTP server runs in threads
of its own; each scrape reads the latest snapshot the agent's loop published
(usage.Snapshot: immutable), so a scrape never touches the registry, never
waits for the loop, and never reads NVML (the usage sampler did, off the
loop). Names follow dcgm-exporter and HAMi: ``hvgpu_vgpu_*`` per vGPU
(labels vm, device, gpu, uuid), ``hvgpu_gpu_*`` per GPU, ``hvgpu_*`` for the
agent.

Must not change anything, and serves nothing but metrics.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Callable

from hvgpu.errors import HvgpuError
from hvgpu.host.usage import Snapshot

log = logging.getLogger(__name__)

VGPU_LABELS = ["vm", "device", "gpu", "uuid"]
GPU_LABELS = ["gpu", "uuid", "name"]
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # a host name or an IPv4 address


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
        share = vgpu_gauge("hvgpu_vgpu_compute_share_percent",
                           "Share of the GPU's SMs of the vGPU (MPS); 0: none reserved, "
                           "time-shared.")
        util = vgpu_gauge("hvgpu_vgpu_utilization_percent",
                          "GPU (SM) utilisation of the vGPU's executor processes, from "
                          "NVML's per-process samples; absent where the driver gives none.")
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
            share.add_metric(labels, v.compute)
            if v.util is not None:
                util.add_metric(labels, v.util)
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
        gpu_util = GaugeMetricFamily("hvgpu_gpu_utilization_percent",
                                     "GPU utilisation (NVML).", labels=GPU_LABELS)
        for g in snap.gpus:
            labels = [str(g.index), g.uuid, g.name]
            reserved.add_metric(labels, g.memory_reserved)
            if g.memory_total is not None:
                total.add_metric(labels, g.memory_total)
            if g.memory_used is not None:
                gpu_used.add_metric(labels, g.memory_used)
            if g.utilization is not None:
                gpu_util.add_metric(labels, g.utilization)
        yield from (total, reserved, gpu_used, gpu_util)

        yield GaugeMetricFamily("hvgpu_slices", "vGPUs (slices) the agent serves.",
                                value=snap.slices)
        info = GaugeMetricFamily("hvgpu_build_info", "The agent's version; always 1.",
                                 labels=["version"])
        info.add_metric([snap.version], 1)
        yield info


class MetricsServer:
    """prometheus-client's HTTP server, in its own threads."""

    def __init__(self, address: str, latest: Callable[[], Snapshot]):
        host, port = parse_address(address)
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise MetricsError("--metrics needs prometheus-client, which is not installed "
                               "(pip install 'hvgpu[host]')") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector(latest))
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {address}: {exc.strerror or exc}") \
                from None
        bound = self._httpd.server_address
        self.host, self.port = host, bound[1]
        log.info("metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host,
                 self.port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
