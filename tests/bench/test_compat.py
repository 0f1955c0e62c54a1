"""bench/compat.py: which programs needed what the shim refused, from its results."""

from __future__ import annotations

import json

from bench import compat


def test_needed_by_gathers_every_refused_entry_point_with_the_programs_that_called_it(tmp_path):
    samples = tmp_path / "compat-samples.json"
    samples.write_text(json.dumps({"suite": "cuda-samples", "commit": "c94ff366aed18c79", "samples": {
        "ptxjit": {"hvgpu": {"rc": 1, "not_implemented": ["cuLinkCreate"]}},
        "vectorAdd": {"hvgpu": {"rc": 0}},
        "jitLto": {"verdict": "not built"},
        "linker": {"hvgpu": {"rc": 1, "not_implemented": ["cuLinkCreate", "cuLinkAddData"]}}}}))
    cupy = tmp_path / "compat-cupy.json"
    cupy.write_text(json.dumps({"suite": "cupy-tests", "commit": "6b6d95", "packages": {
        "fft": {"hvgpu": {"not_implemented": ["cuLinkCreate"]}}}}))
    doc = compat.needed_by([samples, cupy])
    assert doc["from"] == ["cuda-samples c94ff366aed1", "cupy-tests 6b6d95"]
    assert doc["needed_by"] == {
        "cuLinkAddData": ["cuda-samples/linker"],
        "cuLinkCreate": ["cuda-samples/linker", "cuda-samples/ptxjit", "cupy-tests/fft"]}


def test_the_shipped_file_is_what_the_kept_results_give():
    results = sorted((compat.ROOT / "bench" / "results").glob("compat-*.json"))
    assert json.loads(compat.NEEDED_BY.read_text()) == compat.needed_by(results)
