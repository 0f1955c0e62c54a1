"""bench/shim_bench.cu without a GPU: built with g++ against a host-memory stand-in for
CUDA and cuBLAS (tests/bench/cuda_stub/), it must speak bench/worker.py's protocol, and
each of its checks must fail when the stand-in is told to lose what a broken lane would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import worker

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / "cuda_stub"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("shim_bench")
    source = (ROOT / "bench" / "shim_bench.cu").read_text()
    # g++ knows no <<<grid, block>>>: the stand-in runs the kernel as a host call.
    (out / "shim_bench.cpp").write_text(re.sub(r"<<<[^>]*>>>", "", source))
    subprocess.run(["g++", "-O1", "-std=c++17", "-Wall", "-Werror", "-Wno-unused-function",
                    f"-I{STUB}", "-o", str(out / "shim_bench"), str(out / "shim_bench.cpp")],
                   check=True)
    return out / "shim_bench"


def _start(exe, tmp_path, fault=None):
    env = dict(os.environ)
    env.pop("STUB_FAULT", None)
    if fault:
        env["STUB_FAULT"] = fault
    return worker.Worker(f"shim_bench-{fault}", [str(exe), "24"], env=env,
                         log=tmp_path / f"{fault}.log").start()


def test_every_window_is_timed_counted_and_checked(exe, tmp_path):
    w = _start(exe, tmp_path)
    try:
        assert w.ready(timeout=60) == {"ready": True, "sgemm_n": 24, "checks": None}
        for row in ("launch", "sgemm", "h2d:100003:pageable", "h2d:5:pinned",
                    "d2h:4093:pageable", "d2h:65537:pinned"):
            reply = w.window(row, 3, 0.01)
            assert reply["check"] is None, (row, reply)
            assert reply["ops"] >= 1 and reply["seconds"] >= 0.01
        assert w.window("launch", 4, 0.0)["ops"] == 1000  # one batch at least
        with pytest.raises(worker.WorkerFailed, match="unknown row"):
            w.window("h2d:12:sideways", 1, 0.01)
        with pytest.raises(worker.WorkerFailed, match="unknown command"):
            w.ask("fly", timeout=10)
    finally:
        w.close()
    assert w.proc.returncode == 0


@pytest.mark.parametrize("fault,row,expect", [
    ("no-h2d", "h2d:70001:pageable", "nothing was copied"),
    ("no-h2d", "d2h:70001:pinned", "host memory after the window"),
    ("short-d2h", "d2h:70001:pageable", "1 of 70001 bytes differ"),
    ("drop-launch", "launch", "of them ran"),
    ("no-sgemm", "sgemm", "nan, the host's dot product"),
])
def test_a_window_whose_work_was_lost_fails_its_check(exe, tmp_path, fault, row, expect):
    w = _start(exe, tmp_path, fault)
    try:
        ready = w.ready(timeout=60)
        copies_broken = fault in ("no-h2d", "short-d2h")
        assert (ready["checks"] is not None) == copies_broken, ready
        if copies_broken:
            assert ready["checks"].startswith("pageable memory: H2D of 1 bytes at offset 0")
        assert expect in w.window(row, 5, 0.01)["check"]
    finally:
        w.close()
