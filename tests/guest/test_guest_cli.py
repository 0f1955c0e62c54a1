"""hvgpu-guest, the in-VM command, against an agent with the GPU test double."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import venv

import pytest

from hvgpu import __version__
from hvgpu.guest.cli import main, region_text
from hvgpu.guest.client import Connection
from hvgpu.virtio.tuning import ENV_SYSFS_ROOT
from tests.conftest import FAKE_DEVICE, REPO, RunningAgent
from tests.guest.fake_sysfs import MiB, add_device
from tests.wheels import CannotMake, guest_dependency_wheels


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


def test_info_says_whether_a_region_device_is_there_and_mappable(agent, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.setenv(ENV_SYSFS_ROOT, str(tmp_path))
    assert main(["--agent", agent.vm_address("vm1"), "info"]) == 0
    assert "region: no device in this VM" in capsys.readouterr().out
    bar = add_device(tmp_path, "0000:00:03.0", size=16 * MiB)
    os.chmod(bar, 0o666)  # mappable by anyone, root or not
    assert main(["--agent", agent.vm_address("vm1"), "info"]) == 0
    out = capsys.readouterr().out
    assert "region: device 0000:00:03.0, 16 MiB, readable and writable by this user" in out
    assert main(["--agent", agent.vm_address("vm1"), "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["region"] == [
        {"address": "0000:00:03.0", "resource": str(bar), "size": 16 << 20, "accessible": True}]
    # As a user outside the device's group sees it:
    line, = region_text([{"address": "0000:00:03.0", "resource": str(bar), "size": 16 << 20,
                       "accessible": False}])
    assert f"not accessible to this user ({bar}: as root, `hvgpu-guest install`, " \
           "then join group hvgpu)" in line


def test_smi_view(agent, capsys):
    assert main(["--agent", agent.vm_address("vm1"), "smi"]) == 0
    out = capsys.readouterr().out
    assert "VM vm1" in out and "0 MiB / 256 MiB" in out and "|     25% |" in out
    assert "No running processes found" in out  # smi itself is no process of the vGPU
    assert "|      N/A |" in out  # this agent measures no utilisation: said, not made up


def test_smi_box_is_aligned_and_lists_the_vms_processes(agent, capsys):
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_ALLOC", 48 << 20)
        assert main(["--agent", agent.vm_address("vm1"), "smi"]) == 0
        out = capsys.readouterr().out
    lines = out.rstrip("\n").splitlines()
    assert len({len(line) for line in lines}) == 1, out
    assert all(line[0] in "+|" and line[-1] in "+|" for line in lines), out
    row = next(line for line in lines if f" {os.getpid()} |" in line)
    assert "48 MiB" in row and "python" in row, row
    assert "48 MiB / 256 MiB" in out


def test_smi_json_has_processes_and_utilisation(agent, capsys):
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_ALLOC", 16 << 20)
        assert main(["--agent", agent.vm_address("vm1"), "smi", "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["gpus"][0]
    assert g["utilization_gpu"] is None
    assert g["processes"] == [{"pid": os.getpid(), "name": g["processes"][0]["name"],
                               "used_memory": 16 << 20}]


def test_smi_query_gpu_as_csv(agent, capsys):
    with Connection(agent.vm_address("vm1")) as conn:
        conn.call("MEM_ALLOC", 32 << 20)
        assert main(["--agent", agent.vm_address("vm1"), "smi",
                     "--query-gpu=index,name,memory.total,memory.used,memory.free,"
                     "utilization.gpu,uuid,pci.bus_id,driver_version", "--format=csv"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header == ("index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
                      "utilization.gpu [%], uuid, pci.bus_id, driver_version")
    assert row.startswith("0, hvgpu fake GPU, 256 MiB, 32 MiB, 224 MiB, [N/A], GPU-00010203-")
    assert row.endswith(", 00000000:00:00.0, [N/A]")
    assert main(["--agent", agent.vm_address("vm1"), "smi", "--query-gpu=memory.total,count",
                 "--format=csv,noheader,nounits"]) == 0
    assert capsys.readouterr().out == "256, 1\n"


@pytest.mark.parametrize("args, said", [
    (["--query-gpu=index,temperature.gpu", "--format=csv"],
     "unknown field temperature.gpu; a vGPU answers: index, count, name, uuid"),
    (["--query-gpu=index", "--format=xml"], "use --format=csv[,noheader][,nounits]"),
    (["--format=csv"], "--format goes with --query-gpu"),
    (["-l", "0"], "give a number of seconds above 0"),
])
def test_smi_refuses_what_it_cannot_answer(agent, capsys, args, said):
    assert main(["--agent", agent.vm_address("vm1"), "smi", *args]) == 2
    assert said in capsys.readouterr().err


def test_smi_loop_ends_cleanly_on_ctrl_c(agent):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "hvgpu.guest.cli", "--agent",
                             agent.vm_address("vm1"), "smi", "--query-gpu=index,memory.total",
                             "--format=csv", "-l", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        seen = [proc.stdout.readline() for _ in range(3)]  # the header once, then rows
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert seen == ["index, memory.total [MiB]\n", "0, 256 MiB\n", "0, 256 MiB\n"]
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_smi_takes_json_as_every_listing_does(agent, capsys):
    assert main(["--agent", agent.vm_address("vm1"), "smi", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["vm"] == "vm1" and d["gpus"][0]["memory_total"] == 256 << 20


@pytest.mark.parametrize("args", [["coverage"], ["coverage", "--json"],
                                  ["coverage", "--missing"], ["ldconfig"], ["--help"],
                                  ["smi", "--help"], ["man"]])
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


def _guest(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvgpu.guest.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)


ECHO = 'printf "%s\\n" "$0" "$@"; exit 5'  # the program's arguments, then its own status


@pytest.mark.parametrize("line", [
    ["--", "sh", "-c", ECHO, "prog", "--help", "-l", "5", "--", "-h"],
    ["sh", "-c", ECHO, "prog", "--help", "-l", "5", "--", "-h"],  # without -- too
])
def test_run_gives_the_program_every_argument_after_its_name_and_its_exit_status(line):
    # hvgpu-guest's own options (--help, smi's -l) after the program's name are the
    # program's: `hvgpu-guest run -- python3 train.py --help` must not show run's help
    done = _guest("run", *line)
    assert done.returncode == 5, done.stderr
    assert done.stdout.splitlines() == ["prog", "--help", "-l", "5", "--", "-h"]
    assert done.stderr == ""


def test_run_puts_the_shim_first_and_passes_the_agent(tmp_path):
    done = _guest("--agent", "vsock://9:1", "run", "--", "sh", "-c",
                  'echo "$HVGPU_AGENT"; echo "${LD_LIBRARY_PATH%%:*}"',
                  env=dict(os.environ, PYTHONPATH=str(REPO), LD_LIBRARY_PATH="/elsewhere"))
    assert done.returncode == 0, done.stderr
    agent, first = done.stdout.splitlines()
    assert agent == "vsock://9:1"
    assert first == str(REPO / "hvgpu" / "guest" / "shim")


@pytest.mark.parametrize("line, status, said", [
    ([], 2, "name a command, e.g. hvgpu-guest run -- python3 train.py"),
    (["--"], 2, "name a command"),
    (["--", "/nonexistent/prog"], 127, "cannot run '/nonexistent/prog': No such file"),
    (["--", "--help"], 127, "cannot run '--help'"),  # after --, a name, even this one
    (["-l", "5"], 2, "-l"),  # an option of run's (it has none) before the program: refused
])
def test_run_says_why_it_cannot_run_a_program(line, status, said):
    done = _guest("run", *line)
    assert done.returncode == status and said in done.stderr, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_run_help_is_runs_own():
    done = _guest("run", "--help")
    assert done.returncode == 0 and "hvgpu-guest run" in done.stdout
    assert "libcuda.so.1" in done.stdout and "CMD" in done.stdout


@pytest.mark.parametrize("line, said", [
    (["bogus"], "'bogus'"), (["inf"], "'inf'"), ([], "ommand")])
def test_an_unknown_or_missing_subcommand_is_refused_with_the_list(line, said, capsys):
    assert main(line) == 2
    err = capsys.readouterr().err
    assert said in err
    if line:  # every command named, as the choice
        assert all(name in err for name in ("info", "smi", "run", "coverage", "ldconfig",
                                            "install", "completion", "man")), err


def test_version_and_help_end_with_status_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hvgpu-guest {__version__}\n"
    for line in (["--help"], ["-h"], ["smi", "-h"], ["run", "-h"]):
        assert main(line) == 0
        assert "hvgpu-guest" in capsys.readouterr().out


@pytest.mark.parametrize("loop", ["-1", "nan", "100000"])
def test_smi_refuses_a_loop_that_is_no_number_of_seconds(loop, capsys):
    assert main(["--agent", "unix:///nonexistent.sock", "smi", "-l", loop]) == 2
    assert f"-l {loop}: give a number of seconds above 0" in capsys.readouterr().err


def test_smi_loop_takes_its_value_as_nvidia_smi_does(agent, capsys, monkeypatch):
    def ctrl_c(_seconds):  # the first wait ends as Ctrl-C ends it
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", ctrl_c)
    for form in (["-l0.5"], ["--loop=0.5"], ["-l", "0.5"]):
        assert main(["--agent", agent.vm_address("vm1"), "smi", "--query-gpu=index",
                     "--format=csv,noheader", *form]) == 0
        assert capsys.readouterr().out == "0\n", form


def test_no_slice_and_no_agent_are_said_plainly(agent, tmp_path, capsys):
    assert main(["--agent", agent.vm_address("vm2"), "info"]) == 1
    assert "no GPU slice is attached to this VM" in capsys.readouterr().err
    assert main(["--agent", f"unix://{tmp_path}/nothing.sock", "info"]) == 1
    err = capsys.readouterr().err
    assert "is the hvgpu agent running" in err and "hvgpu attach VM --mem SIZE" in err


def test_guest_install_pulls_click_alone(tmp_path):
    """Build the wheel, install it into an empty venv with click's wheel alone beside it
    (no index, as in a VM without network): hvgpu-guest works."""
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)]
    if subprocess.run(build).returncode != 0:
        # offline (as on the GPU machine): the interpreter's own setuptools
        subprocess.run(build + ["--no-build-isolation"], check=True)
    env_dir = tmp_path / "vm"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    links = tmp_path / "links"
    try:
        guest_dependency_wheels(links)
    except CannotMake as exc:
        pytest.skip(f"no wheel of the guest's dependencies: {exc}")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(links), *map(str, wheels.glob("hvgpu-*.whl"))], check=True)
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], check=True,
                            capture_output=True, text=True).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "click" in names
    assert not names & {"libvirt-python", "cupy-cuda12x", "cupy-cuda13x", "nvidia-ml-py",
                        "grpcio", "cuda-bindings", "jinja2", "numpy"}
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


def test_coverage_names_the_programs_that_needed_an_entry_point_still_refused(monkeypatch,
                                                                             capsys):
    import hvgpu.guest.shim as shim

    rows = shim.coverage()
    refused = next(api for api, _, ok in rows if not ok)
    built = next(api for api, _, ok in rows if ok)
    monkeypatch.setattr(shim, "needed_by", lambda: {
        refused: ["cuda-samples/someSample", "cupy-tests/fft"], built: ["cuda-samples/old"]})
    assert main(["coverage", "--missing"]) == 0
    out = capsys.readouterr().out
    assert f"no   {refused}  needed by cuda-samples/someSample, cupy-tests/fft\n" in out
    assert "cuda-samples/old" not in out  # implemented since: no longer a reason
    assert main(["coverage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["needed_by"] == {
        refused: ["cuda-samples/someSample", "cupy-tests/fft"]}
