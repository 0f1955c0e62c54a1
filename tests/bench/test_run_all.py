"""bench/run_all.py's guard rails, which act before any GPU work: what is not publishable
needs --quick, and unknown rows are refused."""

from __future__ import annotations

import sys

import pytest

from bench import run_all


@pytest.mark.parametrize("argv,message", [
    (["--seconds", "0.5"], "need --quick"),
    (["--pairs", "2"], "need --quick"),
    (["--rows", "warp_speed"], "unknown row"),
])
def test_what_would_not_be_believable_is_refused_before_anything_runs(monkeypatch, tmp_path,
                                                                      argv, message):
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--out", str(tmp_path), *argv])
    with pytest.raises(SystemExit, match=message):
        run_all.main()
    assert not (tmp_path / "logs").exists()


def test_the_docstring_gives_the_commands_to_run_on_the_gpu_machine():
    doc = run_all.__doc__
    assert "python3 bench/run_all.py --out bench/results" in doc
    assert "python3 bench/run_all.py --out /tmp/hvgpu-quick --quick" in doc
    assert "--render bench/results/data_lane.json docs/performance.md" in doc
