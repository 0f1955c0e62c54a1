"""Launches the driver refuses are refused at the call; synchronisations wait.

cuda/launch_limits.cu, built with nvcc's static and shared cudart, launches with
configurations past the device's limits (block and grid dimensions, threads per block,
shared memory per block, zero sizes, a function's own limits) and prints the status of
each at the call; then it synchronises (device, stream, event) after a 300 ms kernel
and a refused launch. Through the shim each refusal must come at the call, with the
status the driver gives, from limits the guest already holds: sent one-way, it would
surface only at a later call, after the program went on as if the kernel ran.

In CI against the GPU test double; on the GPU machine natively and through the shim,
line for line, and each synchronisation waits as long as natively.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bench import toolkit
from tests.guest.test_shim_cache import shim_stats

HERE = Path(__file__).parent
NVCC = toolkit.nvcc()
KERNEL_MS = 300


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    out = tmp_path_factory.mktemp("limits")
    built = {}
    for cudart in ("static", "shared"):
        exe = out / f"launch_limits_{cudart}"
        subprocess.run([NVCC, "-arch=sm_90", *(["-cudart=shared"] if cudart == "shared" else []),
                        "-o", str(exe), str(HERE / "cuda/launch_limits.cu")], check=True,
                       capture_output=True, timeout=300)
        built[cudart] = exe
    return built


def _run(exe, mode: str, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run([str(exe), mode], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    return out


def _statuses(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if not line.startswith("ms ")]


def _times(stdout: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^ms (\w+) (\S+)$", stdout, re.M)}


def _shim(agent) -> dict:
    from tests.guest.test_shim_gpu import _shim_env
    return dict(_shim_env(agent), HVGPU_SHIM_STATS="1")


REFUSED = ["threads 1025", "block x 2048", "block z 65", "block 32x32x2", "grid y 65536",
           "grid z 65536", "grid 0", "block 0", "grid 1x0x1", "shared 1 MiB",
           "matmul shared 45000 without the attribute", "matmul shared 24000 past it"]
ACCEPTED = ["matmul shared 16000 within it", "noop 1024 threads", "noop 32x32x1",
            "noop grid y 65535"]


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_a_launch_past_a_limit_is_refused_at_the_call_and_never_sent(programs, cudart,
                                                                     fake_agent):
    out = _run(programs[cudart], "limits", _shim(fake_agent))
    status = dict(line.rsplit(": ", 1) for line in _statuses(out.stdout))
    assert {name: status[name] != "0" for name in REFUSED} == {name: True for name in REFUSED}
    assert {name: status[name] for name in ACCEPTED} == {name: "0" for name in ACCEPTED}
    assert status["set max dynamic shared 20000"] == "0"
    # nothing refused reached the executor, so nothing is left to report later
    assert status["synchronize"] == "0"
    assert shim_stats(out.stderr)["LAUNCH_KERNEL"] == (0, len(ACCEPTED))


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_after_a_refused_launch_every_synchronisation_succeeds(programs, cudart, fake_agent):
    out = _run(programs[cudart], "waits", _shim(fake_agent))
    lines = _statuses(out.stdout)
    assert [re.sub(r"launch \d+", "launch N", line) for line in lines] == [
        f"{how}: bad launch N, synchronize 0, then the stream 0"
        for how in ("device", "stream", "event")]
    assert all(re.search(r"launch [1-9]", line) for line in lines)


def test_an_asynchronous_error_surfaces_at_the_synchronisation_once_the_work_is_done(
        programs, fake_agent):
    out = _run(programs["static"], "deferred", _shim(fake_agent))
    # the memset of memory nobody allocated goes one-way; its error comes with the
    # synchronisation, which has waited for the kernel: the stream is idle after it
    assert _statuses(out.stdout) == [
        "deferred: memset 0, synchronize 1 (one of them failed), then the stream 0"]


@pytest.mark.gpu
@pytest.mark.parametrize("program", ["static limits", "shared limits", "static waits",
                                     "shared waits", "static bounded"])
def test_refusals_and_waits_are_the_drivers(programs, program, gpu_agent):
    """On the GPU machine: the same status at each call natively and through the shim,
    and each synchronisation waits for the 300 ms kernel as long as natively."""
    from tests.guest.test_shim_gpu import _native_env, _report

    cudart, mode = program.split()
    native = _run(programs[cudart], mode, _native_env())
    shimmed = _run(programs[cudart], mode, _shim(gpu_agent))
    _report(f"launch_limits_{cudart}_{mode}.txt", f"native:\n{native.stdout}\n"
            f"shim:\n{shimmed.stdout}{shimmed.stderr[-3000:]}")
    print(f"launch_limits {program}: native {native.stdout!r} | shim {shimmed.stdout!r}")
    assert _statuses(shimmed.stdout) == _statuses(native.stdout)
    waited, native_waited = _times(shimmed.stdout), _times(native.stdout)
    assert set(waited) == set(native_waited)
    for how, ms in waited.items():
        assert ms >= 0.9 * KERNEL_MS, f"{how} returned after {ms} ms, before the kernel ended"


@pytest.mark.gpu
def test_a_deferred_error_is_told_by_a_synchronisation_that_waited(programs, gpu_agent):
    """Natively the memset fails at the call; through hvgpu it is one-way, so its error
    comes with the synchronisation (README: errors of one-way calls), which still waits."""
    from tests.guest.test_shim_gpu import _native_env, _report

    native = _run(programs["static"], "deferred", _native_env())
    shimmed = _run(programs["static"], "deferred", _shim(gpu_agent))
    _report("launch_limits_deferred.txt", f"native:\n{native.stdout}\nshim:\n{shimmed.stdout}")
    print(f"deferred: native {native.stdout!r} | shim {shimmed.stdout!r}")
    line = _statuses(shimmed.stdout)[0]
    assert re.fullmatch(r"deferred: memset 0, synchronize [1-9]\d* \(one of them failed\), "
                        r"then the stream 0", line), line
    assert _times(shimmed.stdout)["deferred"] >= 0.9 * KERNEL_MS
