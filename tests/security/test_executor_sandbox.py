"""A compromised executor reaches nothing of the host but what it needs (issue 11).

The executor's GPU is a test double that acts like an attacker with code
execution in the executor (tests/security/hostile_gpu.py): it tries to read
/etc/shadow and the agent's state, list directories, write outside its cache
directory (another VM's cache included), open TCP connections, signal the
agent and run a host program. Every attempt must fail, its own cache
directory must stay writable, and the executor must keep serving.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hvgpu.errors import CudaError
from hvgpu.guest import Connection, Device, ObjectCode
from hvgpu.host import landlock
from hvgpu.host.control_grpc import ControlClient
from tests.conftest import REPO, RunningAgent
from tests.security.hostile_gpu import probe_image, results

HOSTILE = "tests.security.hostile_gpu:HostileDevice"
USER = "hvgpu"
SKIP_NO_LANDLOCK = "this kernel has no Landlock (Linux 5.13+ with lsm=...,landlock)"


@pytest.fixture(scope="session")
def executor_user():
    """The unprivileged user executors run as (created here as install.sh would)."""
    if os.geteuid() != 0:
        pytest.skip("not root: executors run as the agent's own user, there is no uid to drop")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        USER], check=True)
        return pwd.getpwnam(USER)


@pytest.fixture
def shared_tmp():
    """A directory the executor user can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="hvgpu-sandbox-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


LITTER = (REPO / "hvgpu-probe", Path("/tmp/hvgpu-probe"), Path("/usr/lib/hvgpu-probe"),
          Path("/hvgpu-probe"))


@pytest.fixture(autouse=True)
def no_litter():
    """What a failing test's executor managed to write is removed, not left for the next."""
    for path in LITTER:
        path.unlink(missing_ok=True)
    yield
    for path in LITTER:
        path.unlink(missing_ok=True)


@pytest.fixture
def tcp_listener():
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s.getsockname()[1]


def attack(conn: Connection, tmp: Path, agent_pid: int, port: int, own: Path,
           unix=()) -> dict:
    """Ask the hostile double (in the executor behind ``conn``) to try everything."""
    secret = tmp / "secret"
    secret.write_text("the host's\n")
    image = probe_image(
        read=["/etc/shadow", str(tmp / "state" / "slices.db"), str(secret)],
        listdir=["/", "/etc", str(tmp), "/var/lib"],
        write=["/tmp/hvgpu-probe", str(REPO / "hvgpu-probe"), str(tmp / "state" / "slices.db"),
               str(tmp / "cache" / "vms" / "vm2" / "probe"), str(tmp / "run" / "probe"),
               str(tmp / "reports" / ".." / "probe"), str(own / "probe")],
        unix=list(unix), tcp=port, signal=agent_pid, run=["/bin/true"], python=True)
    with pytest.raises(CudaError) as info:
        ObjectCode.from_cubin(image, connection=conn)
    return results(info.value.detail)


def check(found: dict, own: Path) -> None:
    """Every attempt refused by the kernel (EACCES/EPERM, not a missing file); the
    executor's own cache directory writable and a Python child (NVRTC's) startable:
    the confinement is not just broken."""
    assert found.pop(f"write {own / 'probe'}") == "ALLOWED", found
    assert found.pop("python child") == "ALLOWED", found
    allowed = {k: v for k, v in found.items() if k not in ("pid", "uid", "confinement")
               and not v.startswith("denied: PermissionError")}
    assert not allowed, f"a compromised executor could: {allowed} ({found['confinement']})"


def status_of(pid: int) -> dict:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def keeps_serving(address: str) -> None:
    with Connection(address) as conn:
        dev = Device(connection=conn)
        dev.allocate(1 << 20).close()
        assert dev.mem_info()[1] == dev.total_memory


@pytest.mark.parametrize("route", ["slice", "host-local"])
def test_a_compromised_executor_reaches_nothing_of_the_host(shared_tmp, tcp_listener, route):
    if landlock.abi_version() == 0:
        pytest.skip(SKIP_NO_LANDLOCK + "; the mount namespace test covers this host")
    running = RunningAgent(shared_tmp, HOSTILE, slices=True, vms=("vm1", "vm2"))
    try:
        control = ControlClient(running.control)
        control.call("attach", vm="vm1", mem="40M")
        control.call("attach", vm="vm2", mem="40M")
        control.close()
        keeps_serving(running.vm_address("vm2"))  # vm2's executor owns its cache directory
        address = running.vm_address("vm1") if route == "slice" else running.address
        own = shared_tmp / "cache" / ("vms/vm1" if route == "slice" else "local")
        with Connection(address) as conn:
            found = attack(conn, shared_tmp, os.getpid(), tcp_listener, own)
            assert found["confinement"].startswith("Landlock"), found["confinement"]
            check(found, own)
            assert status_of(found["pid"])["NoNewPrivs"] == "1"
            Device(connection=conn).allocate(1 << 20).close()  # the same session goes on
        keeps_serving(address)
        assert not any(path.exists() for path in LITTER)
    finally:
        running.stop()



AGENT = """
import sys, threading
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.conftest import RunningAgent
try:
    agent = RunningAgent(Path({tmp!r}), {device!r}, slices=True, vms=("vm1", "vm2"),
                         executor_user={user!r}, confine={confine!r})
except Exception as exc:
    print("failed:", exc, flush=True)
    sys.exit(1)
print("ready", flush=True)
threading.Event().wait()
"""


def start_agent(tmp: Path, user: str | None, confine: str = "auto") -> subprocess.Popen:
    """An agent in a process of its own (its pid is the one executors must not signal)."""
    script = AGENT.format(repo=str(REPO), tmp=str(tmp), device=HOSTILE, user=user,
                          confine=confine)
    proc = subprocess.Popen([*reachable_prefix(user), sys.executable, "-c", script],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        proc.wait()
        pytest.fail(f"the agent did not start: {line or 'no output'}")
    return proc


def reachable_prefix(user: str | None) -> list[str]:
    """What to run the agent under so that ``user`` can reach the interpreter and the
    repository: nothing where it already can; else a private mount namespace in
    which each directory that blocks it (/root, 0700, holding a pyenv) is a 0711
    tmpfs holding only the entries needed. The host is left as it was."""
    if user is None:
        return []
    blocked: dict[str, set[str]] = {}
    needed = {os.path.realpath(p) for p in (sys.executable, sys.prefix, sys.base_prefix, REPO,
                                            *sys.path) if p and os.path.exists(p)}
    for path in needed:
        parts = Path(path).parts
        for i in range(1, len(parts)):
            parent = Path(*parts[:i])
            if not os.stat(parent).st_mode & 0o001:
                blocked.setdefault(str(parent), set()).add(parts[i])
                break
    if not blocked:
        return []
    if shutil.which("unshare") is None:
        pytest.skip(f"user {user} cannot reach {sorted(blocked)} and there is no unshare(1)")
    q = shlex.quote
    script = ["set -e"]
    for parent, children in blocked.items():
        script.append("t=$(mktemp -d)")
        script += [f"mkdir $t/{q(c)} && mount --rbind {q(parent + '/' + c)} $t/{q(c)}"
                   for c in children]
        script.append(f"mount -t tmpfs -o mode=0711 hvgpu-test {q(parent)}")
        script += [f"mkdir {q(parent + '/' + c)} && mount --move $t/{q(c)} {q(parent + '/' + c)}"
                   f" && rmdir $t/{q(c)}" for c in children]
        script.append("rmdir $t")
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "sh"]


def test_executors_run_unprivileged_and_confined(executor_user, shared_tmp, tcp_listener):
    agent = start_agent(shared_tmp, USER)
    try:
        control = ControlClient(str(shared_tmp / "control.sock"))
        control.call("attach", vm="vm1", mem="40M")
        control.call("attach", vm="vm2", mem="40M")
        control.close()
        keeps_serving(f"unix://{shared_tmp}/vm2.sock")
        own = shared_tmp / "cache" / "vms" / "vm1"
        with Connection(f"unix://{shared_tmp}/vm1.sock") as conn:
            assert own.stat().st_uid == executor_user.pw_uid
            found = attack(conn, shared_tmp, agent.pid, tcp_listener, own,
                           unix=[str(shared_tmp / "control.sock")])
            check(found, own)
            st = status_of(found["pid"])
            assert st["Uid"].split() == [str(executor_user.pw_uid)] * 4, st["Uid"]
            assert st["Gid"].split() == [str(executor_user.pw_gid)] * 4, st["Gid"]
            assert "0" not in st["Groups"].split()
            assert st["NoNewPrivs"] == "1"
            assert int(st["CapEff"], 16) == int(st["CapPrm"], 16) == 0
            Device(connection=conn).allocate(1 << 20).close()
        keeps_serving(f"unix://{shared_tmp}/vm1.sock")
    finally:
        agent.kill()  # its executors end on their lifeline
        agent.wait()


def namespace_attack(conn: Connection, tmp: Path, own: Path) -> dict:
    """What a mount namespace must stop: the same files (they no longer exist for the
    executor, or are read-only); it restricts neither TCP nor signals."""
    image = probe_image(
        read=["/etc/shadow", str(tmp / "state" / "slices.db"), str(tmp / "secret"),
              "/var/lib", "/root"],
        listdir=["/home", "/var"],
        write=["/tmp/hvgpu-probe", str(REPO / "hvgpu-probe"), str(tmp / "state" / "slices.db"),
               str(tmp / "cache" / "vms" / "vm2" / "probe"), str(tmp / "run" / "probe"),
               "/usr/lib/hvgpu-probe", "/hvgpu-probe", str(own / "probe")], python=True)
    (tmp / "secret").write_text("the host's\n")
    seen = probe_image(listdir=[str(tmp), "/"])
    with pytest.raises(CudaError) as info:
        ObjectCode.from_cubin(image, connection=conn)
    found = results(info.value.detail)
    if found["confinement"].startswith("working directory only"):
        pytest.skip(f"no Landlock fallback works here: {found['confinement']}")
    assert found["confinement"].startswith("mount namespace"), found["confinement"]
    assert found.pop(f"write {own / 'probe'}") == "ALLOWED", found
    assert found.pop("python child") == "ALLOWED", found
    allowed = {k: v for k, v in found.items() if k not in ("pid", "uid", "confinement")
               and not v.startswith("denied")}
    assert not allowed, f"a compromised executor could: {allowed} ({found['confinement']})"
    with pytest.raises(CudaError) as info:  # directories on the way to allowed paths: no more
        ObjectCode.from_cubin(seen, connection=conn)
    listed = results(info.value.detail)
    assert not {"secret", "state", "control.sock"} & set(_names(listed[f"listdir {tmp}"]))
    assert not {"home", "var", "srv", "mnt", "boot"} & set(_names(listed["listdir /"]))
    return found


def _names(result: str) -> list[str]:
    return json.loads(result.partition(" ")[2]) if result.startswith("ALLOWED ") else []


def test_without_landlock_a_mount_namespace_confines(shared_tmp):
    running = RunningAgent(shared_tmp, HOSTILE, slices=True, vms=("vm1", "vm2"),
                           confine="namespace")
    try:
        control = ControlClient(running.control)
        control.call("attach", vm="vm1", mem="40M")
        control.call("attach", vm="vm2", mem="40M")
        control.close()
        keeps_serving(running.vm_address("vm2"))
        own = shared_tmp / "cache" / "vms" / "vm1"
        with Connection(running.vm_address("vm1")) as conn:
            namespace_attack(conn, shared_tmp, own)
            Device(connection=conn).allocate(1 << 20).close()
        keeps_serving(running.vm_address("vm1"))
        assert not any(path.exists() for path in LITTER)
    finally:
        running.stop()


def test_without_landlock_an_unprivileged_executor_gets_a_user_and_mount_namespace(
        executor_user, shared_tmp):
    agent = start_agent(shared_tmp, USER, confine="namespace")
    try:
        control = ControlClient(str(shared_tmp / "control.sock"))
        control.call("attach", vm="vm1", mem="40M")
        control.call("attach", vm="vm2", mem="40M")
        control.close()
        keeps_serving(f"unix://{shared_tmp}/vm2.sock")
        own = shared_tmp / "cache" / "vms" / "vm1"
        with Connection(f"unix://{shared_tmp}/vm1.sock") as conn:
            found = namespace_attack(conn, shared_tmp, own)
            st = status_of(found["pid"])
            assert st["Uid"].split() == [str(executor_user.pw_uid)] * 4, st["Uid"]
            assert st["NoNewPrivs"] == "1" and int(st["CapEff"], 16) == 0
        keeps_serving(f"unix://{shared_tmp}/vm1.sock")
    finally:
        agent.kill()
        agent.wait()
