"""hvgpu-guest, the in-VM command, against an agent with the GPU test double."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

import pytest

from hvgpu.guest.cli import main, shm_text
from hvgpu.guest.region import ENV_SYSFS
from tests.conftest import FAKE_DEVICE, REPO, RunningAgent
from tests.guest.fake_sysfs import MiB, add_device


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    running.api.attach("vm1", "256M", "25%", allow_time_shared=True)
    yield running
    running.stop()


def test_info_lists_the_vgpu_as_the_slice(agent, capsys):
    assert main(["--agent", agent.vm_address("vm1"), "info"]) == 0
    out = capsys.readouterr().out
    assert "this VM: vm1" in out
    assert "vGPU 0: hvgpu fake GPU, 256 MiB (0 MiB in use), compute 25%" in out
    assert main(["--agent", agent.vm_address("vm1"), "info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpus"][0]["memory_total"] == 256 << 20 and d["gpus"][0]["compute_share"] == 25


def test_info_says_whether_a_shared_memory_device_is_there_and_mappable(agent, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv(ENV_SYSFS, str(tmp_path))
    assert main(["--agent", agent.vm_address("vm1"), "info"]) == 0
    assert "shared memory: no device in this VM" in capsys.readouterr().out
    bar = add_device(tmp_path, "0000:00:03.0", size=16 * MiB)
    os.chmod(bar, 0o666)  # mappable by anyone, root or not
    assert main(["--agent", agent.vm_address("vm1"), "info"]) == 0
    out = capsys.readouterr().out
    assert "shared memory: device 0000:00:03.0, 16 MiB, readable and writable by this user" in out
    assert main(["--agent", agent.vm_address("vm1"), "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shm"] == [
        {"address": "0000:00:03.0", "resource": str(bar), "size": 16 << 20, "accessible": True}]
    # As a user outside the device's group sees it:
    line, = shm_text([{"address": "0000:00:03.0", "resource": str(bar), "size": 16 << 20,
                       "accessible": False}])
    assert f"not accessible to this user ({bar}: as root, `hvgpu-guest install`, " \
           "then join group hvgpu)" in line


def test_smi_view(agent, capsys):
    assert main(["--agent", agent.vm_address("vm1"), "smi"]) == 0
    out = capsys.readouterr().out
    assert "vGPU of vm1" in out and "/ 256 MiB" in out and "compute     25%" in out


def test_smi_takes_json_as_every_listing_does(agent, capsys):
    assert main(["--agent", agent.vm_address("vm1"), "smi", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["vm"] == "vm1" and d["gpus"][0]["memory_total"] == 256 << 20


@pytest.mark.parametrize("args", [["coverage"], ["coverage", "--json"],
                                  ["coverage", "--missing"], ["ldconfig"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(args):
    # `hvgpu-guest coverage | head -2` ended in a BrokenPipeError traceback
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: EPIPE every time
    try:
        proc = subprocess.run([sys.executable, "-m", "hvgpu.guest.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 128 + 13  # as a shell reports a program SIGPIPE ended


def test_no_slice_and_no_agent_are_said_plainly(agent, tmp_path, capsys):
    assert main(["--agent", agent.vm_address("vm2"), "info"]) == 1
    assert "no GPU slice is attached to this VM" in capsys.readouterr().err
    assert main(["--agent", f"unix://{tmp_path}/nothing.sock", "info"]) == 1
    err = capsys.readouterr().err
    assert "is the hvgpu agent running" in err and "hvgpu attach VM --mem SIZE" in err


def test_guest_install_pulls_no_host_dependency(tmp_path):
    """Build the wheel, install it alone into an empty venv: hvgpu-guest works."""
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)]
    if subprocess.run(build).returncode != 0:
        # offline (as on the GPU machine): the interpreter's own setuptools
        subprocess.run(build + ["--no-build-isolation"], check=True)
    env_dir = tmp_path / "vm"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index",
                    *map(str, wheels.glob("hvgpu-*.whl"))], check=True)
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert not names & {"libvirt-python", "cupy-cuda12x", "cupy-cuda13x", "nvidia-ml-py",
                        "grpcio", "cuda-bindings", "click", "jinja2", "numpy"}
    out = subprocess.run([str(env_dir / "bin" / "hvgpu-guest"), "--agent",
                          f"unix://{tmp_path}/none.sock", "info"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 1
    assert "hvgpu attach VM --mem SIZE" in out.stderr
    shim = subprocess.run([str(env_dir / "bin" / "hvgpu-guest"), "coverage"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert shim.returncode == 0, shim.stderr  # the wheel carries the built libcuda.so.1
    assert "yes  cuLaunchKernel" in shim.stdout
    burst = subprocess.run([str(py), "-c", "from hvgpu.host.executor import launch_burst; "
                            "print(launch_burst.unavailable_reason() or 'built')"],
                           capture_output=True, text=True, check=True, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert burst.stdout.strip() == "built"  # and the executor's C launch loop
    host = subprocess.run([str(env_dir / "bin" / "hvgpu"), "gpus"], capture_output=True,
                          text=True)
    assert host.returncode == 1 and "pip install 'hvgpu[host]'" in host.stderr
