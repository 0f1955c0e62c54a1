"""bench/worker.py: a process asked for one window at a time, and what happens when it
fails to start, fails a command, says too much, or stops answering."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from bench import worker

ROOT = Path(__file__).resolve().parents[2]


def _worker(tmp_path, mode):
    return worker.Worker(mode, [sys.executable, "-m", "tests.bench.fake_worker", mode], cwd=ROOT,
                         log=tmp_path / "logs" / f"{mode}.log").start()


def test_a_worker_gets_ready_answers_windows_and_quits(tmp_path):
    w = _worker(tmp_path, "noisy-stdout")
    try:
        assert w.ready(timeout=60) == {"ready": True, "pid_note": "fake"}
        reply = w.window("count", 7, 0.01)
        assert reply["seed"] == 7 and reply["ops"] % 1000 == 0 and reply["ops"] >= 1000
        with pytest.raises(worker.WorkerFailed, match="RuntimeError: the kernel faulted"):
            w.window("boom", 8, 0.01)
        assert w.window("count", 9, 0.0)["seed"] == 9  # still there after a failed command
    finally:
        w.close()
    assert w.proc.returncode == 0
    log = w.log.read_text()
    assert "a library's banner on stdout" in log and "RuntimeError" in log


def test_a_worker_that_dies_before_it_is_ready_says_why(tmp_path):
    w = _worker(tmp_path, "die-early")
    with pytest.raises(worker.WorkerFailed, match=r"exited with status 3: cannot start: no GPU"):
        w.ready(timeout=60)
    with pytest.raises(worker.WorkerFailed, match="exited"):
        w.window("count", 1, 0.01)
    w.close()


def test_a_worker_that_stops_answering_is_ended(tmp_path):
    w = _worker(tmp_path, "hang")
    w.ready(timeout=60)
    with pytest.raises(worker.WorkerFailed, match="took more than"):
        w.ask("window count 1 0.01", timeout=0.5)
    assert w.proc.poll() is not None
    w.close()


def test_serve_answers_unknown_commands_and_stops_at_quit():
    out = io.StringIO()
    worker.serve({"echo": lambda *words: {"words": list(words)}}, {"kind": "t"},
                 stdin=io.StringIO("echo a b\n\nnope\nquit\necho never\n"), stdout=out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines == [{"ready": True, "kind": "t"}, {"words": ["a", "b"]},
                     {"error": "unknown command 'nope'"}]
