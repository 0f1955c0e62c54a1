"""bench/frameworks.py without a GPU: how it judges a loss trace, and the README table it
writes from a run (including a workload that failed through the shim)."""

from __future__ import annotations

import json

from bench import frameworks


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


def test_the_readme_table_says_ratio_round_trips_match_and_failures(tmp_path):
    doc = {"when": "2026-12-03 06:45 UTC", "target": 0.9, "loss_rtol": 0.02,
           "machine": {"gpu": "NVIDIA H200", "driver": "580", "cpus": 16, "torch": "2.11"},
           "results": {
               "resnet": {"label": "ResNet", "native": _run([1.0]),
                          "hvgpu": dict(_run([1.0]), throughput=150.0),
                          "ratio": 1.5, "match": True, "max_rel_diff": 0.0},
               "jax": {"label": "JAX", "native": _run([1.0]),
                       "hvgpu": {"error": "exit status -6", "stderr": ""}}}}
    results = tmp_path / "frameworks.json"
    results.write_text(json.dumps(doc))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- frameworks-table -->\nold\n<!-- /frameworks-table -->\nend\n")
    frameworks.render_readme(results, readme)
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "| ResNet | 100 img/s | 150 img/s | **1.50** | 0.03 | yes (max rel. diff 0.0e+00) |" \
        in text
    assert "| JAX | 100 img/s | fails: exit status -6 | | | |" in text
