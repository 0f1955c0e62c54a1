"""bench/data_lane.py without a GPU: each row's window logic on a host-memory side that
can be told to lose work, the pairing of a whole session, and the published table.

HostDevice follows data_lane.InProcess's primitives with NumPy arrays for device memory,
so the logic that Native and Hvgpu share runs here as it runs on the GPU machine."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from bench import checks, data_lane, pairs


class HostDevice(data_lane.InProcess):
    def __init__(self, name="native", fault=None):
        super().__init__()
        self.name, self.fault = name, fault
        self.count = 0
        self.launcher = object()  # a native side with a front end to compare
        self.conn = None

    def dev_alloc(self, n):
        return np.zeros(n, dtype=np.uint8)

    def pinned_alloc(self, n):
        return np.zeros(n, dtype=np.uint8)

    def memset(self, dev, byte):
        dev[:] = byte

    def h2d(self, dev, offset, host):
        if self.fault != "no-h2d":
            dev[offset:offset + host.nbytes] = host

    def d2h(self, host, dev, offset):
        if self.fault != "no-d2h":
            host[:] = dev[offset:offset + host.nbytes]

    def sync(self):
        pass

    def launches(self, n):
        self.count = (self.count + n - (self.fault == "lose-launch")) & 0xFFFFFFFF
        return n

    def counter_set(self, value):
        self.count = value

    def counter_get(self):
        return self.count

    def sgemm_setup(self, a, b):
        self.a, self.b = a, b
        self.c = np.zeros_like(a)
        self.reference = a.astype(np.float64) @ b

    def sgemm(self, k):
        if self.fault != "no-sgemm":
            self.c[:] = self.a @ self.b
        return k

    def c_poison(self):
        self.c.view(np.uint8)[:] = checks.POISON

    def c_get(self):
        return self.c.copy()


def _side(fault=None, name="native"):
    side = HostDevice(name, fault)
    rng = np.random.default_rng(0)
    side.sgemm_setup(rng.standard_normal((64, 64), dtype=np.float32),
                     rng.standard_normal((64, 64), dtype=np.float32))
    return side


@pytest.mark.parametrize("spec", ["launch", "sync", "sgemm", "h2d:70001:pageable",
                                  "h2d:4093:pinned", "d2h:70001:pinned", "d2h:1:pageable"])
def test_every_row_passes_its_check_on_a_working_side(spec):
    side = _side()
    w = side.window(spec, seed=5, seconds=0.001)
    assert w["check"] is None and w["ops"] >= 1 and w["seconds"] >= 0.001
    if spec == "launch":
        assert w["ops"] % checks.LAUNCH_BATCH == 0


@pytest.mark.parametrize("fault,spec,expect", [
    ("lose-launch", "launch", "of them ran"),
    ("no-sgemm", "sgemm", "relative error nan"),
    ("no-h2d", "h2d:70001:pageable", "device memory after the window, read back"),
    ("no-h2d", "h2d:70001:pinned", "nothing was copied"),
    ("no-d2h", "d2h:70001:pinned", "host memory after the window"),
])
def test_a_window_whose_work_was_lost_fails(fault, spec, expect):
    assert expect in _side(fault).window(spec, seed=5, seconds=0.001)["check"]


def test_a_d2h_window_cannot_pass_on_what_an_earlier_window_left():
    side = _side()
    assert side.window("d2h:4093:pageable", seed=1, seconds=0.001)["check"] is None
    side.fault = "no-d2h"  # the host buffer is kept for the row: it held seed 1's bytes
    assert "host memory" in side.window("d2h:4093:pageable", seed=2, seconds=0.001)["check"]


def test_odd_sizes_are_checked_with_both_kinds_of_host_memory_and_buffers_given_back():
    side = _side()
    assert side.odd_sizes(seed=1) == {"pageable": None, "pinned": None}
    assert side._buffers == {}
    broken = side.odd_sizes.__func__(_side("no-d2h"), seed=1)
    assert broken["pageable"].startswith("H2D of 1 bytes") and broken["pinned"]


def test_unknown_rows_are_refused():
    with pytest.raises(ValueError):
        _side().window("h2d:12:sideways", seed=1, seconds=0.001)
    with pytest.raises(SystemExit):
        data_lane.select(["warp_speed"])


def test_the_default_rows_compare_like_with_like_in_each_group():
    names = [f.row.name for f in data_lane.select(["default"])]
    assert names == ["launch_rate", "sync_roundtrip", "h2d_64 MiB", "d2h_64 MiB",
                     "pinned_h2d_64 MiB", "pinned_d2h_64 MiB", "sgemm_4096", "cupy_launch_rate",
                     "shim_launch_rate", "shim_sgemm_4096"]
    every = data_lane.select(["all"])
    assert len(every) == len(data_lane.FIGURES) > len(names)
    assert [f.row.name for f in data_lane.select(["shim_d2h_1 GiB", "cupy"])] == \
        ["cupy_launch_rate", "cupy_sync_roundtrip", "shim_d2h_1 GiB"]
    assert data_lane.BY_NAME["shim_pinned_h2d_64 MiB"].spec == f"h2d:{64 << 20}:pinned"


def _small(fig):
    """The same row with a copy of 70001 bytes: its logic, not its size, is under test."""
    kind, size, mem = data_lane.parse_spec(fig.spec)
    return dataclasses.replace(fig, spec=f"{kind}:70001:{mem}") if size else fig


def _session(tmp_path, rows, native=None, hvgpu=None, odd_sizes=False):
    session = data_lane.Session("unix:///nowhere", [_small(f) for f in data_lane.select(rows)],
                                tmp_path / "logs")
    native, hvgpu = native or _side(), hvgpu or _side(name="hvgpu")
    hvgpu.reference = native.reference
    session.sides["api"] = {"native": native, "hvgpu": hvgpu}
    session.checks["api"] = {side.name: side.odd_sizes(1) if odd_sizes else
                             {"pageable": None, "pinned": None} for side in (native, hvgpu)}
    return session


def test_a_session_alternates_sides_with_fresh_seeds_and_fails_only_the_broken_rows(tmp_path):
    seen = []
    native, hvgpu = _side(), _side("no-h2d", "hvgpu")
    for side in (native, hvgpu):
        real = side.window
        side.window = (lambda real, name: lambda spec, seed, seconds:
                       seen.append((spec, name, seed)) or real(spec, seed, seconds))(real, side.name)
    session = _session(tmp_path, ["launch_rate", "h2d_64 MiB", "sgemm_4096"], native, hvgpu,
                       odd_sizes=True)
    results = session.measure(3, 0.001)
    launches = [(name, seed) for spec, name, seed in seen if spec == "launch"]
    assert [n for n, _ in launches] == ["native", "hvgpu"] + \
        ["native", "hvgpu", "hvgpu", "native", "native", "hvgpu"]  # warm-up, then ABBA
    assert len({s for _, s in launches[2:]}) == 6  # every timed window its own seed
    assert results["launch_rate"]["status"] in ("ok", "noisy")
    assert results["sgemm_4096"]["status"] in ("ok", "noisy")
    h2d = results["h2d_64 MiB"]
    assert h2d["status"] == "failed"
    assert any(f.startswith("hvgpu, odd sizes (pageable)") for f in h2d["failures"])
    assert any(f.startswith("hvgpu, pair 1: device memory") for f in h2d["failures"])


def test_a_row_without_a_like_for_like_native_launch_is_skipped(tmp_path):
    native = _side()
    native.launcher, native.launcher_problem = None, "no native Python launch() to compare with"
    session = _session(tmp_path, ["launch_rate"], native)
    e = session.measure(3, 0.001)["launch_rate"]
    assert e["status"] == "skipped" and "no native Python launch()" in pairs.ratio_cell(e)


def test_a_group_that_could_not_start_fails_its_rows_with_the_reason(tmp_path):
    session = _session(tmp_path, ["shim_launch_rate", "cupy_launch_rate"])
    session.problems["shim"] = "nvcc or cuBLAS not found"
    results = session.measure(3, 0.001)
    assert results["shim_launch_rate"]["failures"] == ["nvcc or cuBLAS not found"]
    assert results["cupy_launch_rate"]["failures"] == ["its sides were not set up"]


def _doc(tmp_path, quick=False):
    session = _session(tmp_path, ["launch_rate", "sync_roundtrip", "h2d_64 MiB", "sgemm_4096"])
    session.info["front_ends"]["launch_rate"] = {"native": "cuda.core 1.2 launch()",
                                                 "hvgpu": "hvgpu.guest.launch()"}
    results = session.measure(3, 0.001)
    doc = data_lane.document(session, results, 3, 0.25 if quick else 2.0, quick, ping_us=45.6)
    doc["when"] = "2026-12-04 10:00 UTC"
    return doc


def test_the_table_gives_medians_ranges_targets_and_the_method(tmp_path):
    doc = _doc(tmp_path)
    text = data_lane.table(doc)
    lines = text.splitlines()
    assert lines[0] == ("| figure | native | hvgpu | hvgpu / native (median of 3 pairs, range) "
                        "| target |")
    assert lines[2].startswith("| **Python API**")
    launch = next(x for x in lines if x.startswith("| pipelined launches (launch())"))
    assert " launch/s | " in launch and ("(" in launch and "–" in launch)
    sync = next(x for x in lines if x.startswith("| sync round trip"))
    assert "hvgpu ≤ 60 µs (met)" in sync
    assert "2026-12-04 10:00 UTC: 3 pairs of windows of at least 2 s each" in text
    assert "cuda.core 1.2 launch() natively, hvgpu.guest.launch() through hvgpu" in text
    assert "pageable and pinned, with guard bytes (api): all as sent." in text
    assert "hvgpu PING (transport and executor, no CUDA): 45.6 µs" in text
    json.dumps(doc)  # the results file is plain JSON


def test_the_page_takes_a_paired_run_and_refuses_a_quick_one(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text("intro\n<!-- bench-table -->\nold\n<!-- /bench-table -->\nend\n")
    good, quick = tmp_path / "good.json", tmp_path / "quick.json"
    good.write_text(json.dumps(_doc(tmp_path)))
    quick.write_text(json.dumps(_doc(tmp_path, quick=True)))
    with pytest.raises(SystemExit, match="quick run"):
        data_lane.render_page(quick, page)
    assert "old" in page.read_text()
    data_lane.render_page(good, page)
    text = page.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "3 pairs of windows" in text
    old_format = tmp_path / "old.json"
    old_format.write_text(json.dumps({"results": {}}))
    with pytest.raises(SystemExit, match="before paired windows"):
        data_lane.render_page(old_format, page)


def test_hvgpu_sides_copies_pass_every_check_through_a_real_agent(fake_agent):
    """data_lane.Hvgpu's copy primitives over the guest API, the agent and an executor
    (the GPU test double behind it): odd sizes and offsets, pageable and pinned, and a
    copy row's windows. Its kernels are not the double's, so only copies run here."""
    from hvgpu.guest import Connection, Device

    hv = data_lane.Hvgpu.__new__(data_lane.Hvgpu)
    data_lane.InProcess.__init__(hv)
    hv.conn = Connection(fake_agent.address)
    hv.dev = Device(connection=hv.conn)
    hv._pinned = []
    try:
        assert hv.odd_sizes(seed=3) == {"pageable": None, "pinned": None}
        for spec in ("h2d:70001:pageable", "d2h:70001:pinned", "h2d:4099:pinned",
                     "d2h:65537:pageable"):
            assert hv.window(spec, seed=9, seconds=0.001)["check"] is None, spec
            hv.release()
    finally:
        hv.close()
