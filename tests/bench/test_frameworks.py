"""bench/frameworks.py without a GPU: rows of two worker processes (a NumPy workload
behind bench/workloads/common.py) measured in ABBA windows, brought to the same step
count, judged by their final weights and losses; and the published table from a run."""

from __future__ import annotations

import json
import os

import pytest

from bench import frameworks
from bench.workloads import common


def _run(losses):
    return {"throughput": 100.0, "unit": "img/s", "losses": losses, "round_trips_per_step": 0.025}


def test_losses_match_only_when_every_step_is_within_the_tolerance():
    native = _run([2.0, 1.5, 1.0])
    assert frameworks.compare(native, _run([2.0, 1.5, 1.0])) == {"match": True,
                                                                "max_rel_diff": 0.0}
    near = frameworks.compare(native, _run([2.0, 1.5, 1.0 * (1 + frameworks.LOSS_RTOL / 2)]))
    assert near["match"]
    far = frameworks.compare(native, _run([2.0, 1.5 * (1 + 2 * frameworks.LOSS_RTOL), 1.0]))
    assert not far["match"] and far["max_rel_diff"] > frameworks.LOSS_RTOL
    assert not frameworks.compare(native, _run([2.0, 1.5]))["match"]  # a step missing


def test_the_weights_checksum_estimates_their_relative_distance():
    import numpy as np

    rng = np.random.default_rng(1)
    w = [rng.standard_normal((300, 40)), rng.standard_normal(7)]
    same = frameworks.weights_difference(common.checksum(w), common.checksum([a.copy() for a in w]))
    assert same == 0.0
    moved = [a * (1 + 1e-2) for a in w]  # 1% away
    rel = frameworks.weights_difference(common.checksum(w), common.checksum(moved))
    assert 2e-3 < rel < 5e-2
    assert frameworks.weights_difference(common.checksum(w), common.checksum(w[:1])) is None
    assert frameworks.weights_difference(None, common.checksum(w)) is None


def test_variants_give_both_sides_the_same_environment():
    module, env, label = frameworks.spec("resnet-cudamallocasync")
    assert module == "bench.workloads.resnet"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"} and "both sides" in label
    assert frameworks.spec("gpt") == ("bench.workloads.gpt", {}, frameworks.WORKLOADS["gpt"][1])
    assert set(frameworks.DEFAULT) <= set(frameworks.WORKLOADS) | set(frameworks.VARIANTS)


def _row(tmp_path, name, hvgpu_env):
    base = dict(os.environ, FAKE_SLOW="0.001")  # a step of a millisecond or so
    base.pop("FAKE_DRIFT", None)
    return frameworks.Training(name, "tests.bench.fake_workload", f"fake {name}", base,
                               dict(base, **hvgpu_env), tmp_path / "logs").start()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    rows = [_row(tmp, "slower", {"FAKE_SLOW": "0.002"}), _row(tmp, "drift", {"FAKE_DRIFT": "0.05"})]
    try:
        frameworks.wait_ready(rows, timeout=60)
        frameworks.measure(rows, 3, 0.05)
        doc = frameworks.document(rows, 3, 0.05, quick=True)
    finally:
        for row in rows:
            row.close()
    return doc


def test_a_row_alternates_its_sides_then_brings_them_to_the_same_step(measured):
    e = measured["results"]["slower"]
    assert e["order"] == ["native", "hvgpu", "hvgpu", "native", "native", "hvgpu"]
    steps = e["steps"]
    assert steps["in_windows"]["native"] > steps["in_windows"]["hvgpu"]  # it catches up
    assert steps["after_warmup"] == steps["in_windows"]["native"]
    assert e["losses"]["match"] and e["losses"]["count"] == steps["warmup"] + steps["after_warmup"]
    assert e["weights"]["rel_diff"] == 0.0 and e["weights"]["count"] == 16
    assert e["status"] in ("ok", "noisy") and e["ratio"] < 1.0  # hvgpu sleeps in every step
    assert e["unit"] == "samples/s" and e["native"] > e["hvgpu"]


def test_a_side_that_computes_something_else_fails_its_row(measured):
    e = measured["results"]["drift"]
    assert e["status"] == "failed" and "ratio" in e  # timed fine, but not the same training
    assert any(f.startswith("final weights differ from native: rel. diff") for f in e["failures"])
    assert e["weights"]["rel_diff"] > frameworks.WEIGHTS_RTOL


def test_the_table_says_ratio_range_and_whether_the_result_was_the_same(measured, tmp_path):
    text = frameworks.table(measured)
    lines = text.splitlines()
    assert lines[0].startswith("| training step | native | hvgpu | hvgpu / native (median of "
                               "3 pairs, range) |")
    slower = next(x for x in lines if x.startswith("| fake slower |"))
    assert "yes (weights 0.0e+00, losses 0.0e+00)" in slower
    drift = next(x for x in lines if x.startswith("| fake drift |"))
    assert "**failed**: final weights differ" in drift and "| **no** (weights" in drift
    assert "Quick run" in text and f"within {frameworks.WEIGHTS_RTOL:.0e}" in text
    page = tmp_path / "performance.md"
    page.write_text("a\n<!-- frameworks-table -->\nold\n<!-- /frameworks-table -->\nb\n")
    results = tmp_path / "frameworks.json"
    results.write_text(json.dumps(measured))
    with pytest.raises(SystemExit, match="quick run"):
        frameworks.render_page(results, page)
    published = dict(measured, method=dict(measured["method"], quick=False, window_s=2.0))
    results.write_text(json.dumps(published))
    frameworks.render_page(results, page)
    assert "old" not in page.read_text() and "| fake slower |" in page.read_text()


def test_a_row_whose_shim_side_cannot_start_fails_with_its_reason(tmp_path):
    row = frameworks.Training("broken", "tests.bench.no_such_module", "broken", dict(os.environ),
                              dict(os.environ), tmp_path / "logs").start()
    try:
        frameworks.wait_ready([row], timeout=60)
        frameworks.measure([row], 3, 0.01)
    finally:
        row.close()
    e = row.entry()
    assert e["status"] == "failed" and e["failures"][0].startswith("native failed to start")
    assert "No module named" in e["failures"][0]
