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


def test_only_tests_both_sides_reached_are_compared():
    nat = {"a::t1": "passed", "a::t2": "failed", "a::t3": "passed"}
    hv = {"a::t1": "passed", "a::t2": "passed"}  # cut short before t3
    differ, one_side = compat.compare(nat, hv)
    assert differ == {"a::t2": {"native": "failed", "hvgpu": "passed"}}
    assert one_side == ["a::t3"]


def test_a_run_cut_short_still_gives_what_pytest_printed(tmp_path):
    log = tmp_path / "fft.log"
    log.write_text(
        "cupy_tests/fft_tests/test_fft.py::TestFft::test_fft[_param_0] PASSED [  1%]\n"
        "cupy_tests/fft_tests/test_fft.py::test_plan FAILED                [  2%]\n"
        "cupy_tests/fft_tests/test_fft.py::TestFft::test_ifft SKIPPED (no) [  3%]\n"
        "!!!!!!! KeyboardInterrupt !!!!!!!\n")
    got = compat.verbose_outcomes(log)
    assert got == {"cupy_tests.fft_tests.test_fft.TestFft::test_fft[_param_0]": "passed",
                   "cupy_tests.fft_tests.test_fft::test_plan": "failed",
                   "cupy_tests.fft_tests.test_fft.TestFft::test_ifft": "skipped"}
    for tid in got:  # and a differing test is found again by its node id
        assert compat.junit_id_to_node(tid).startswith("cupy_tests/fft_tests/test_fft.py::")
    assert compat.junit_id_to_node("cupy_tests.fft_tests.test_fft.TestFft::test_x[1]") == \
        "cupy_tests/fft_tests/test_fft.py::TestFft::test_x[1]"
