"""The shim's acceptance on a GPU: unmodified programs print the same natively and through it.

Each CUDA C++ program under cuda/ is built twice (nvcc's default static cudart
and -cudart=shared), run once against the real driver and once with only the
shim's libcuda.so.1 reachable, talking to a real agent; their outputs must be
identical. CuPy runs the same way. HVGPU_SHIM_REPORT=DIR keeps what each
printed (the GPU machine's run is reported from there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import toolkit
from hvgpu.guest.shim import library

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent / "cuda"
NVCC = toolkit.nvcc()
PROGRAMS = ["vector_add", "matmul_tiled", "streams_events", "copies_memset", "cublas_sgemm",
            "func_attributes", "kernel_printf", "textures_surfaces"]


def _report(name: str, text: str) -> None:
    out = os.environ.get("HVGPU_SHIM_REPORT")
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, name).write_text(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    out = tmp_path_factory.mktemp("programs")
    cublas = toolkit.cublas()
    exes, libdirs = {}, []
    for name in PROGRAMS:
        extra = []
        if name == "cublas_sgemm":
            if cublas is None:
                continue
            extra = [f"-I{cublas[0]}", f"-L{cublas[1]}", "-lcublas", f"-Xlinker=-rpath={cublas[1]}"]
            libdirs.append(cublas[1])
        for cudart in ("static", "shared"):
            exe = out / f"{name}_{cudart}"
            flags = ["-cudart=shared"] if cudart == "shared" else []
            subprocess.run([NVCC, "-arch=sm_90", *flags, "-o", str(exe), str(HERE / f"{name}.cu"),
                            *extra], check=True, timeout=600)
            exes[f"{name}_{cudart}"] = exe
    cubin = out / "extra_kernel.cubin"
    subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-o", str(cubin), str(HERE / "extra_kernel.cu")],
                   check=True, timeout=300)
    exe = out / "extra_launch"
    # Linked against the shim by name (libcuda.so.1); natively the real driver answers it.
    subprocess.run([NVCC, "-o", str(exe), str(HERE / "extra_launch.cu"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True, timeout=300)
    exes["extra_launch"] = exe
    return exes, str(cubin), libdirs


def _run(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return proc


def _native_env():
    env = dict(os.environ)
    env.pop("HVGPU_AGENT", None)
    cudart = Path(NVCC).resolve().parents[1] / "lib64"
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(cudart), env.get("LD_LIBRARY_PATH", "")])
    return env


def _shim_env(agent):
    env = _native_env()
    env["HVGPU_AGENT"] = agent.address
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(library().parent), env["LD_LIBRARY_PATH"]])
    return env


@pytest.mark.parametrize("program", [f"{p}_{c}" for p in PROGRAMS for c in ("static", "shared")]
                         + ["extra_launch"])
def test_program_prints_the_same_through_the_shim(built, program, gpu_agent):
    exes, cubin, _ = built
    if program not in exes:
        pytest.skip("cuBLAS headers/libraries not found")
    args = [str(exes[program])] + ([cubin] if program == "extra_launch" else [])
    native = _run(args, _native_env())
    shimmed = _run(args, _shim_env(gpu_agent))
    _report(f"{program}.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"{program}: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()}")
    assert native.returncode == 0, native.stdout + native.stderr
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert shimmed.stdout == native.stdout


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_steady_steps_make_no_round_trip_through_the_shim_but_their_own_sync(built, cudart,
                                                                           gpu_agent):
    from tests.guest.test_shim_cache import added, shim_stats

    exe = str(built[0][f"func_attributes_{cudart}"])
    env = dict(_shim_env(gpu_agent), HVGPU_SHIM_STATS="1")
    outs = [_run([exe, steps], env) for steps in ("1", "5")]
    _report(f"func_attributes_stats_{cudart}.txt", "\n".join(o.stdout + o.stderr for o in outs))
    for out in outs:
        assert out.returncode == 0, out.stdout + out.stderr
    sync, oneway = added(*(shim_stats(out.stderr) for out in outs))
    print(f"func_attributes_{cudart}: 4 more steps added round trips {sync}, one-way {oneway}")
    assert sync == {"STREAM_SYNCHRONIZE": 4}


def test_cupy_runs_unmodified_through_the_shim(gpu_agent):
    pytest.importorskip("cupy")
    script = [sys.executable, str(HERE / "cupy_check.py")]
    native = _run(script, _native_env())
    shimmed = _run(script, _shim_env(gpu_agent))
    _report("cupy.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"cupy: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()} "
          f"| {shimmed.stderr.strip()[-300:]}")
    assert native.returncode == 0, native.stderr
    assert shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout == native.stdout
    mapped = shimmed.stderr.strip().splitlines()[-1].split(": ", 1)[1].split()
    assert mapped == [str(library())], f"the real driver was mapped too: {mapped}"


def test_one_program_uses_two_vgpus_through_the_shim(built, tmp_path):
    """multi_device.cu on a VM with two vGPUs, each served by its own executor."""
    from hvgpu.host.inventory import read_gpus
    from tests.conftest import RunningAgent

    exe = tmp_path / "multi_device"
    subprocess.run([NVCC, "-arch=sm_90", "-o", str(exe), str(HERE / "multi_device.cu")],
                   check=True, timeout=300)
    agent = RunningAgent(tmp_path, None, slices=True, vms=("vm1", "vm1#1"), gpus=read_gpus)
    try:
        # one GPU here: both vGPUs named onto it; on a multi-GPU host placement spreads them
        agent.api.attach("vm1", "2G", gpu=0 if len(read_gpus()) == 1 else None, count=2)
        env = _native_env()
        env["HVGPU_AGENT"] = ",".join(agent.vm_address(v) for v in ("vm1", "vm1#1"))
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(library().parent), env["LD_LIBRARY_PATH"]])
        shimmed = _run([str(exe)], env)
        pids = {s["device"]: [e["pid"] for e in s["executors"]] for s in agent.api.status()}
    finally:
        agent.stop()
    _report("multi_device.txt", f"shim (rc {shimmed.returncode}):\n{shimmed.stdout}"
            f"{shimmed.stderr}\nexecutors by device: {pids}")
    print(f"multi_device: shim: {shimmed.stdout.strip()} | executors {pids} | "
          f"{shimmed.stderr.strip()[-400:]}")
    assert shimmed.returncode == 0, shimmed.stdout + shimmed.stderr
    assert "devices=2 current=1 y0_on=0 out[1]=6.0 out[last]=393210.0 mismatches=0 " \
        "uva_mismatches=0" in shimmed.stdout
    assert "is an address on device" not in shimmed.stderr  # each vGPU its own addresses
    assert pids[0] and pids[1] and pids[0] != pids[1]


def test_torch_distributed_nccl_at_world_size_one_runs_through_the_shim(gpu_agent):
    pytest.importorskip("torch")
    script = [sys.executable, str(HERE / "ddp_one.py")]
    native = _run(script, _native_env())
    shimmed = _run(script, _shim_env(gpu_agent))
    _report("ddp_one.txt", f"native (rc {native.returncode}):\n{native.stdout}{native.stderr}"
            f"\nshim (rc {shimmed.returncode}):\n{shimmed.stdout}{shimmed.stderr}")
    print(f"ddp: native: {native.stdout.strip()} | shim: {shimmed.stdout.strip()} "
          f"| {shimmed.stderr.strip()[-600:]}")
    assert native.returncode == 0, native.stderr
    assert shimmed.returncode == 0, shimmed.stderr[-3000:]
    assert shimmed.stdout == native.stdout
