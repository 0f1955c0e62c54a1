"""bench/pairs.py: the ABBA order, the window loop (on a fake clock), and what a row's
per-pair ratios are turned into."""

from __future__ import annotations

import pytest

from bench import pairs


def test_pairs_alternate_abba_so_neither_side_always_runs_second():
    assert list(pairs.order(3)) == [(0, "native"), (0, "hvgpu"), (1, "hvgpu"), (1, "native"),
                                     (2, "native"), (2, "hvgpu")]
    seconds = [side for k, (_, side) in enumerate(pairs.order(4)) if k % 2]
    assert seconds.count("native") == seconds.count("hvgpu") == 2


class Clock:
    def __init__(self, step):
        self.t, self.step = 100.0, step

    def __call__(self):
        return self.t

    def tick(self):
        self.t += self.step


def test_a_window_repeats_until_its_time_is_up_and_times_the_final_synchronize():
    clock = Clock(0.3)
    calls = []

    def op():
        calls.append("op")
        clock.tick()

    def finish():
        calls.append("sync")
        clock.t += 5.0  # the queued work drains

    ops, elapsed = pairs.window(op, 2.0, finish, clock=clock)
    assert ops == 7 and calls == ["op"] * 7 + ["sync"]  # 7 * 0.3 = 2.1 >= 2.0
    assert elapsed == pytest.approx(7.1)


def test_a_window_counts_what_a_batch_says_it_did_and_always_runs_once():
    clock = Clock(1.0)

    def batch():
        clock.tick()
        return 1000

    assert pairs.window(batch, 2.5, clock=clock) == (3000, 3.0)
    assert pairs.window(batch, 0.0, clock=clock)[0] == 1000


def test_run_pairs_keeps_each_sides_windows_in_pair_order():
    seen = []

    def measure(side, pair):
        seen.append((pair, side))
        return {"ops": pair + 1, "seconds": 1.0, "side": side}

    out = pairs.run_pairs(measure, 3)
    assert seen == list(pairs.order(3))
    assert [w["ops"] for w in out["native"]] == [1, 2, 3]
    assert [w["ops"] for w in out["hvgpu"]] == [1, 2, 3]
    assert out["order"] == ["native", "hvgpu", "hvgpu", "native", "native", "hvgpu"]


def test_the_summary_is_the_median_of_per_pair_ratios_and_their_spread():
    s = pairs.summary([100.0, 110.0, 90.0], [120.0, 121.0, 99.0])
    assert s["ratios"] == pytest.approx([1.2, 1.1, 1.1])
    assert s["ratio"] == pytest.approx(1.1) and s["min"] == pytest.approx(1.1)
    assert s["max"] == pytest.approx(1.2)
    assert s["spread_pct"] == pytest.approx(100 * (1.2 / 1.1 - 1))  # 9.1%: not noisy
    assert not s["noisy"]
    assert s["native"] == 100.0 and s["hvgpu"] == 120.0  # each side's median window


def test_lower_is_better_figures_turn_the_ratio_so_above_one_is_still_hvgpu_better():
    s = pairs.summary([2.0, 2.0, 2.0], [50.0, 40.0, 50.0], higher_is_better=False)
    assert s["ratios"] == pytest.approx([0.04, 0.05, 0.04]) and s["ratio"] == pytest.approx(0.04)
    assert s["noisy"] and s["spread_pct"] == pytest.approx(25.0)


def test_unpaired_windows_have_no_summary():
    with pytest.raises(ValueError):
        pairs.summary([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        pairs.summary([], [])


ROW = pairs.Row("h2d", "H2D 64 MiB", "GB/s", scale=64 * 2**20 / 1e9, target=0.9)


def _windows(native_s, hvgpu_s, checks=None):
    checks = checks or {}
    return {"order": ["native", "hvgpu", "hvgpu", "native", "native", "hvgpu"][:2 * len(native_s)],
            "native": [{"ops": 10, "seconds": s, "check": None} for s in native_s],
            "hvgpu": [{"ops": 10, "seconds": s, "check": checks.get(i)}
                      for i, s in enumerate(hvgpu_s)]}


def test_a_quiet_row_publishes_its_median_ratio_and_range():
    e = pairs.entry(ROW, _windows([2.0, 2.0, 2.0], [2.0, 2.1, 1.95]), [])
    assert e["status"] == "ok" and e["target"] == 0.9
    assert pairs.ratio_cell(e) == f"**1.00** ({2.0 / 2.1:.2f}–{2.0 / 1.95:.2f})"
    assert pairs.value_cell(e, "native", ".2f") == f"{10 * 64 * 2**20 / 1e9 / 2.0:.2f} GB/s"


def test_a_noisy_row_says_so_instead_of_publishing_a_ratio():
    e = pairs.entry(ROW, _windows([2.0, 2.0, 2.0], [2.0, 2.6, 2.0]), [])
    assert e["status"] == "noisy" and e["spread_pct"] == pytest.approx(100 * (1 - 2.0 / 2.6))
    assert pairs.ratio_cell(e) == "noisy: ±23% (0.77–1.00)"
    assert "**" not in pairs.ratio_cell(e)


def test_a_failed_check_or_a_missing_pair_fails_the_row_whatever_its_timing():
    bad = pairs.entry(ROW, _windows([2.0] * 3, [2.0] * 3, {1: "byte 0 is 0xff, not 0x3a"}), [])
    assert bad["status"] == "failed"
    assert bad["failures"] == ["hvgpu, pair 2: byte 0 is 0xff, not 0x3a"]
    assert pairs.ratio_cell(bad) == "**failed**: hvgpu, pair 2: byte 0 is 0xff, not 0x3a"
    crashed = pairs.entry(ROW, None, ["hvgpu worker exited with status -6"])
    assert crashed["status"] == "failed" and pairs.value_cell(crashed, "hvgpu", ".2f") == ""
    half = _windows([2.0, 2.0], [2.0])
    assert pairs.entry(ROW, half, [])["status"] == "failed"
    long = pairs.entry(ROW, None, ["x" * 300])
    assert len(pairs.ratio_cell(long)) < 140
    lines = pairs.entry(ROW, None, ["worker exited: ImportError (its log: x.log)\nTraceback"])
    assert pairs.ratio_cell(lines) == "**failed**: worker exited: ImportError (its log: x.log)"


def test_a_row_without_a_like_for_like_side_is_skipped_not_failed():
    e = pairs.entry(ROW, None, [], skipped="cuda.core is not installed")
    assert e["status"] == "skipped"
    assert pairs.ratio_cell(e) == "not measured: cuda.core is not installed"
    assert pairs.entry(ROW, None, ["boom"], skipped="x")["status"] == "failed"


def test_the_footer_gives_date_pairs_and_window_and_quick_runs_are_not_publishable():
    doc = {"when": "2026-12-04 10:00 UTC", "method": pairs.method(3, 2.0, quick=False)}
    text = pairs.footer(doc)
    assert text.startswith("2026-12-04 10:00 UTC: 3 pairs of windows of at least 2 s each")
    assert "ABBA" in text and "±10%" in text and "Quick" not in text
    assert pairs.unpublishable(doc) is None
    quick = {"when": "x", "method": pairs.method(3, 0.25, quick=True)}
    assert "Quick run" in pairs.footer(quick) and "quick" in pairs.unpublishable(quick)
    assert "before paired" in pairs.unpublishable({"when": "x", "results": {}})
