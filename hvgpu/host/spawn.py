"""How the agent starts an executor process: as which user, with which
environment, working directory, cache directory and lifeline.

Executors parse guest modules and run NVRTC on guest source, so they are
treated as compromisable: they run as a dedicated unprivileged user (no
capabilities), get an environment stripped of the agent's own variables, an
empty working directory, a cache directory of their VM's own, and the read
end of a pipe whose write end only the agent holds (the executor ends itself
when it reads EOF: an executor never outlives the agent, even after kill -9).
The executor then confines itself (``executor/sandbox.py``).

Must not decide which executors run or talk to them (``agent.py`` does), and
must not confine them.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hvgpu
from hvgpu.errors import HvgpuError
from hvgpu.host.names import cache_dir_name

log = logging.getLogger(__name__)

DEFAULT_USER = "hvgpu"
CREATE_USER = "useradd --system --no-create-home --shell /usr/sbin/nologin {name}"
# The agent's environment may hold secrets; an executor gets only these.
ENV_NAMES = {"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH"}
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "__NV", "HVGPU_", "PYTHON", "COV_CORE_")


class ExecutorUserError(HvgpuError):
    """The executor user cannot be used."""

    code = "executor-user"


@dataclass(frozen=True)
class ExecutorUser:
    """Who executors run as; ``switch`` is False when they run as the agent's own user."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    switch: bool = False

    def popen_args(self) -> dict:
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def __str__(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


def resolve_user(name: str | None) -> ExecutorUser:
    """The identity executors get. ``None``: the agent's own user (tests, demos).

    As root, a missing user is an error that says how to create it; ``root``
    keeps executors as root (the caller logs that they are not confined by uid).
    Not as root there is nothing to drop: executors run as the agent's user."""
    uid, gid = os.geteuid(), os.getegid()
    own = ExecutorUser(_user_name(uid), uid, gid)
    if name is None or uid != 0 or name == "root":
        return own
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise ExecutorUserError(
            f"no user {name!r} to run executors as: create it with "
            f"`{CREATE_USER.format(name=name)}`"
            + (" (install.sh does, run as root)" if name == DEFAULT_USER else "")
            + ", or start the agent with --executor-user root to run executors as root, "
            "unconfined by uid") from None
    if pw.pw_uid == 0:
        return own
    groups = [pw.pw_gid]
    try:
        groups = os.getgrouplist(name, pw.pw_gid)
    except OSError:
        pass
    extra = tuple(sorted({g for g in groups if g != pw.pw_gid}))
    return ExecutorUser(name, pw.pw_uid, pw.pw_gid, extra, switch=True)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def default_run_dir() -> str:
    """/run/hvgpu for root, $XDG_RUNTIME_DIR/hvgpu (or /tmp/hvgpu-UID) otherwise."""
    if os.geteuid() == 0:
        return "/run/hvgpu"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return str(Path(runtime) / "hvgpu") if runtime else f"/tmp/hvgpu-{os.geteuid()}"


class Lifeline:
    """A pipe whose write end only the agent holds (close-on-exec, never passed on):
    every executor gets the read end and sees EOF once the agent is gone."""

    def __init__(self):
        self.read_fd, self._write_fd = os.pipe()  # both close-on-exec

    def close(self) -> None:
        for fd in (self._write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.read_fd = self._write_fd = -1


class Launcher:
    """Starts executor processes with the identity and directories they may use."""

    def __init__(self, user: str | None, run_dir: str | None, cache_dir: str | None):
        """``run_dir`` None: a private one of this launcher's, removed by close()."""
        self.requested = user
        self.user = resolve_user(None)  # until prepare() resolves the one asked for
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="hvgpu-run-"))
        self.workdir = self.run_dir / "empty"
        self.gpu_locks = self.run_dir / "gpu-locks"
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.lifeline = Lifeline()

    def prepare(self, env: dict | None = None) -> None:
        """Resolve the executor user, create the directories executors need and check
        that user can start one (with ``env``, the agent's extra environment for
        executors); raises ExecutorUserError with what to fix."""
        self.user = resolve_user(self.requested)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o711)  # executors traverse it to their MPS pipes, list nothing
        self.workdir.mkdir(exist_ok=True)
        os.chmod(self.workdir, 0o555)  # empty, and nobody's to fill
        self.own_dir(self.gpu_locks, 0o700)  # executor/device_memory.py: one file per GPU
        if self.cache_dir is not None:
            (self.cache_dir / "vms").mkdir(parents=True, exist_ok=True)
            for d in (self.cache_dir, self.cache_dir / "vms"):
                os.chmod(d, 0o711)  # traversed to each VM's own; VM names not listed
        if self.user.switch:
            self._check_reachable(env or {})

    def describe(self) -> str:
        if self.user.switch:
            return f"as user {self.user}, no capabilities"
        if os.geteuid() != 0:
            return f"as the agent's own user {self.user} (the agent is not root: nothing to drop)"
        if self.requested == "root":
            return "as ROOT: an executor is not confined by uid (--executor-user root)"
        return f"as the agent's own user {self.user}"

    def cache_for(self, vm: str | None) -> str | None:
        """The cache directory of one VM's executors (``None``: host-local ones), owned by
        the executor user and reachable by no other VM's executor."""
        if self.cache_dir is None:
            return None
        path = self.cache_dir / ("local" if vm is None else f"vms/{cache_dir_name(vm)}")
        self.own_dir(path, 0o700)
        return str(path)

    def own_dir(self, path: Path, mode: int) -> None:
        """Create ``path`` (if needed) as the executor user's, with ``mode``."""
        path.mkdir(parents=True, exist_ok=True)
        if self.user.switch:
            os.chown(path, self.user.uid, self.user.gid, follow_symlinks=False)
        os.chmod(path, mode, follow_symlinks=False)

    def group_dir(self, path: Path) -> None:
        """Create ``path`` (if needed) shared between the agent and the executor user:
        the MPS daemon (the agent's user) and the MPS server it starts for executors
        (the executor user) both write there."""
        path.mkdir(parents=True, exist_ok=True)
        if self.user.switch:
            os.chown(path, os.geteuid(), self.user.gid, follow_symlinks=False)
            os.chmod(path, 0o2770, follow_symlinks=False)
        else:
            os.chmod(path, 0o700, follow_symlinks=False)

    def environment(self, *extra: dict) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        for more in extra:
            env.update(more)
        # The same hvgpu as the agent's, whatever the executor's working directory.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(hvgpu.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        # nothing in an executor may need the agent's home or a passwd lookup
        env.update(HOME=str(self.workdir), USER=self.user.name, LOGNAME=self.user.name)
        return env

    def popen(self, args: list[str], fd: int, env: dict) -> subprocess.Popen:
        """``python -m hvgpu.host.executor ARGS`` inheriting ``fd`` and the lifeline."""
        cmd = [sys.executable, "-m", "hvgpu.host.executor", *args,
               "--lifeline", str(self.lifeline.read_fd)]
        return subprocess.Popen(cmd, pass_fds=(fd, self.lifeline.read_fd), env=env,
                                cwd=self.workdir, stdin=subprocess.DEVNULL,
                                **self.user.popen_args())

    def _check_reachable(self, env: dict) -> None:
        """The executor user must be able to run the interpreter and import hvgpu."""
        try:
            probe = subprocess.run([sys.executable, "-c", "import hvgpu.host.executor.__main__"],
                                   env=self.environment(env), cwd=self.workdir, capture_output=True,
                                   text=True, timeout=120, stdin=subprocess.DEVNULL,
                                   **self.user.popen_args())
            why = "" if probe.returncode == 0 else \
                (probe.stderr.strip().splitlines() or [f"status {probe.returncode}"])[-1]
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
        if not why:
            return
        found = first_blocked(self.user, needed_paths())
        if found is not None:
            raise ExecutorUserError(f"user {self.user.name!r} cannot start an executor with "
                                    f"{sys.executable} ({why}): {found}")
        raise ExecutorUserError(
            f"user {self.user.name!r} cannot start an executor with {sys.executable} "
            f"({why}): install hvgpu where that user can read and execute it (every "
            "directory above the venv and above the Python it was made from must be "
            "searchable, e.g. /opt/hvgpu, not /root), or start the agent with "
            "--executor-user root (unconfined by uid)")

    def close(self) -> None:
        self.lifeline.close()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


# -- why the executor user cannot reach Python or hvgpu ----------------------------------

_SEARCH, _READ = 0o1, 0o4  # a permission class's bits: x, r
_MAX_LINKS = 40  # as the kernel follows them (ELOOP past that)


def needed_paths() -> list[tuple[str, str, int]]:
    """What an executor opens to start: (what it is, path, bits it needs on it)."""
    needed = [("the Python interpreter", sys.executable, _SEARCH),
              ("Python's standard library", sysconfig.get_path("stdlib"), _READ | _SEARCH),
              ("the hvgpu package", os.path.dirname(os.path.abspath(hvgpu.__file__)),
               _READ | _SEARCH)]
    for name in ("purelib", "platlib"):
        needed.append(("the installed Python packages", sysconfig.get_path(name),
                       _READ | _SEARCH))
    return [(what, path, bits) for what, path, bits in needed if path]


def _class_of(st: os.stat_result, user: ExecutorUser) -> tuple[str, int]:
    """Which of the mode's classes applies to ``user`` ('u', 'g' or 'o') and its bits."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == user.uid:
        return "u", (mode >> 6) & 7
    if st.st_gid == user.gid or st.st_gid in user.groups:
        return "g", (mode >> 3) & 7
    return "o", mode & 7


def _walk(path: str, user: ExecutorUser, bits: int) -> tuple[str, os.stat_result, int] | None:
    """The first place on ``path`` that ``user`` is refused by its mode bits, walked as
    the kernel walks it: every directory on the way needs search (x), every symbolic
    link is followed from where it lies, and the end needs ``bits``. (place, its stat,
    the bits missing); None when nothing refuses (or the path does not exist: that is
    another error)."""
    parts = [p for p in path.split("/") if p]
    current, links = "/", 0
    try:
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            st = os.stat(current)
            if not _class_of(st, user)[1] & _SEARCH:
                return current, st, _SEARCH
            if name == "..":
                current = os.path.dirname(current)
                continue
            step = os.path.join(current, name)
            if stat.S_ISLNK(os.lstat(step).st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return None
                target = os.readlink(step)
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    current = "/"
                continue
            current = step
        st = os.stat(current)
    except OSError:
        return None
    missing = bits & ~_class_of(st, user)[1]
    return (current, st, missing) if missing else None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def first_blocked(user: ExecutorUser, needed: list[tuple[str, str, int]]) -> str | None:
    """Where and why ``user`` cannot reach what an executor needs (needed_paths()), and
    what would fix it, in words; None when the mode bits let it reach all of it (ACLs,
    a security module or a mount option may still refuse)."""
    if user.uid == 0:
        return None
    for what, path, bits in needed:
        found = _walk(path, user, bits)
        if found is None:
            continue
        place, st, missing = found
        who, _ = _class_of(st, user)
        letters = "".join(c for bit, c in ((_READ, "r"), (_SEARCH, "x")) if missing & bit)
        real = os.path.realpath(path)
        shown = real if real == os.path.normpath(path) else f"{path}, really {real},"
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        cls = {"u": "its owner", "g": "in its group", "o": "neither its owner nor in its group"}
        text = (f"{what} is {shown} and user {user.name!r} ({cls[who]}) may not "
                f"{'pass through' if letters == 'x' and kind == 'directory' else 'use'} "
                f"the {kind} {place}{'' if place == real else ' on its way'} (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, owner "
                f"{_owner(st.st_uid)}). Fix one of: `chmod {who}+{letters} {place}`")
        if kind == "directory" and letters == "x":
            text += " (lets it pass through, not list)"
        under = place if kind == "directory" else os.path.dirname(place)
        if what == "the hvgpu package":
            text += f"; hvgpu installed outside {under} (such as in /opt/hvgpu)"
        else:
            text += (f"; a venv made from a Python outside {under} (/usr/bin/python3 -m venv "
                     "/opt/hvgpu; `venv --copies` is not enough: the standard library stays "
                     "with the Python it was made from)")
        return text + "; or --executor-user root (executors then unconfined by uid)"
    return None
