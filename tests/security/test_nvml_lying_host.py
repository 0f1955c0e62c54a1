"""The guest NVML library against a lying host: short replies and a racing first use."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from hvgpu.guest.shim import NVML_LIBRARY
from tests.security.nvml_lying_agent import LyingAgent

HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "guest", "cuda")


def _build(tmp_path, name):
    exe = tmp_path / name
    subprocess.run(["gcc", "-g", "-O1", "-pthread", "-o", str(exe), os.path.join(HERE, name + ".c"),
                    f"-L{NVML_LIBRARY.parent}", "-l:libnvidia-ml.so.1",
                    f"-Wl,-rpath,{NVML_LIBRARY.parent}"], check=True)
    return str(exe)


def _s(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


BASE = {
    "DEVICE_GET_COUNT": lambda n, b: struct.pack("<i", 1),
    "DEVICE_GET_UUID": lambda n, b: _s(bytes(range(16))),
    "DEVICE_GET_ATTRIBUTES": lambda n, b: _s(b"\0" * 4 * 76),
}


def test_concurrent_first_use_overflows_the_callers_name_buffer(tmp_path):
    # The first GET_NAME says "a"; every later one (the other threads' learn()) says a
    # 95-character name or "a" again, a few ms apart, while finished threads loop on
    # nvmlDeviceGetName(h, buf, 2).
    def name(n, body):
        text = b"a" if n % 2 else b"L" * 95
        return (0.0 if n == 1 else 0.005, _s(text))

    uuid = lambda n, b: (0.5 if n == 1 else 0.0, _s(bytes(range(16))))
    agent = LyingAgent(str(tmp_path / "a.sock"), {**BASE, "DEVICE_GET_NAME": name,
                                                  "DEVICE_GET_UUID": uuid})
    exe = _build(tmp_path, "nvml_race")
    env = dict(os.environ, HVGPU_AGENT=agent.address)
    seen = []
    for attempt in range(5):
        proc = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=120)
        seen.append(proc.stdout.strip())
        if proc.returncode != 0:
            break
    agent.close()
    print(agent.calls)
    assert all(line == "no overflow seen" for line in seen), seen


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind")
@pytest.mark.parametrize("short", ["attributes", "answers"])
def test_short_replies_are_not_read_past_their_end(tmp_path, short):
    """Replies shorter than their fixed part (the attributes' own length field, empty
    bodies for memory, utilisation and the driver's version) are refused, never read
    past their end: valgrind sees no uninitialised read, and no number is made up."""
    empty = lambda n, b: b""
    answers = {**BASE, "DEVICE_GET_NAME": lambda n, b: _s(b"lying")}
    if short == "attributes":
        answers["DEVICE_GET_ATTRIBUTES"] = lambda n, b: b"\1\2"  # shorter than its length
    else:
        answers.update(VGPU_UTILIZATION=empty, SLICE_INFO=empty, DRIVER_GET_VERSION=empty)
    agent = LyingAgent(str(tmp_path / "a.sock"), answers)
    exe = _build(tmp_path, "nvml_short")
    env = dict(os.environ, HVGPU_AGENT=agent.address)
    proc = subprocess.run(["valgrind", "--error-exitcode=9", "--track-origins=yes", exe],
                          env=env, capture_output=True, text=True, timeout=300)
    agent.close()
    print(proc.stdout)
    print(proc.stderr[-6000:])
    assert proc.returncode == 0, "valgrind: uninitialised reads (see stderr above)"
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    if short == "attributes":
        assert lines["handle"] != "0"  # the device's facts could not be learnt: no handle
    else:
        assert lines["handle"] == "0"
        for what in ("util", "mem", "driver"):
            assert not lines[what].startswith("r=0"), lines  # an error, not a number
