"""What of the host an executor process can still reach once it confines itself.

An executor parses guest modules and runs NVRTC on guest source, so it is
treated as compromisable. Before it reads any guest input it confines itself,
in two steps:

1. :func:`enter`, while the process has one thread, before the GPU is opened:
   Landlock over everything the driver's start may touch (:func:`startup_paths`);
   where the kernel has no Landlock, a private mount namespace that holds only
   those paths, with just a few files of /etc (:func:`namespace_paths`: it is
   the only layer then); where neither can be had, only the empty working
   directory the agent gave it. Every thread the driver starts later inherits
   this layer.
2. :func:`narrow`, once the GPU is open and the driver's libraries are loaded:
   a second Landlock layer over what serving needs (:func:`serving_paths`).
   Landlock binds the calling thread and the threads and processes it starts
   afterwards (sessions, the NVRTC child); threads the driver started before
   keep only the first layer.

Both layers deny TCP (Landlock ABI 4+) and, on ABI 6+, signals to processes
outside the sandbox; ``landlock.restrict`` sets no_new_privs.

The path lists are plain tuples here so that they are easy to extend; the
final rule set is logged at DEBUG. Must not decide anything about guests, and
must not fall back silently: :func:`describe` says what is in force.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import sysconfig
from dataclasses import dataclass, field

from hvgpu.host import landlock
from hvgpu.host.executor import mountns

log = logging.getLogger(__name__)

MODES = ("auto", "namespace", "none")  # none: tests and debugging only

# Read (and execute): the dynamic loader's places, what CUDA reads about the
# machine, the time zone (log lines of child processes).
SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/local/nvidia",
               "/etc/ld.so.cache", "/etc/localtime", "/proc", "/sys")
# Read and write: the GPU's device nodes (globbed once the driver has created
# them), the usual character devices, /dev/shm (MPS clients share memory there).
DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/null", "/dev/zero", "/dev/full",
           "/dev/urandom", "/dev/random", "/dev/shm")
# What the driver's start may also touch, before it has run (step 1 only).
STARTUP_READ = ("/usr", "/lib", "/lib64", "/opt", "/etc")
STARTUP_WRITE = ("/dev",)
# A mount namespace is the only layer where there is no Landlock: of /etc it
# holds only what name lookups and the driver may read, never /etc/shadow.
NAMESPACE_ETC = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/nvidia")
TOOLKIT_DEFAULT = "/usr/local/cuda"
JIT_CACHE, TMP = "cuda-jit", "tmp"  # under the executor's own cache directory

_in_force = "not confined yet"
_layers: list[str] = []


@dataclass
class Paths:
    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.read, self.write = _unique(self.read), _unique(self.write)


def _unique(paths) -> list[str]:
    seen, out = set(), []
    for p in paths:
        if p and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def python_paths() -> list[str]:
    """The interpreter, its standard library and every importable place, and hvgpu."""
    import hvgpu

    paths = [os.path.realpath(sys.executable), os.path.dirname(hvgpu.__file__)]
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if prefix not in ("/", "/usr", "/usr/local"):  # a system prefix: the libdirs suffice
            paths.append(prefix)
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        paths.append(sysconfig.get_path(name))
    paths += [p for p in sys.path if p and os.path.abspath(p) != "/"]
    return [p for p in paths if p and os.path.exists(p)]


def toolkit_paths() -> list[str]:
    """The CUDA toolkit (NVRTC, its headers) and the dynamic loader's extra places."""
    paths = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), TOOLKIT_DEFAULT]
    paths += os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    return [p for p in paths if p and os.path.abspath(p) != "/" and os.path.exists(p)]


def device_paths() -> list[str]:
    found = []
    for pattern in DEVICES:
        found += sorted(glob.glob(pattern)) if "*" in pattern else [pattern]
    return [p for p in found if os.path.exists(p)]


def private_dirs(cache_dir: str | None) -> None:
    """Point the driver's JIT cache and temporary files into the executor's own cache
    directory (its home and /tmp are out of reach). Call before the GPU is opened."""
    if not cache_dir:
        os.environ.setdefault("CUDA_CACHE_DISABLE", "1")
        return
    for name, var in ((JIT_CACHE, "CUDA_CACHE_PATH"), (TMP, "TMPDIR")):
        path = os.path.join(cache_dir, name)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            log.warning("cannot create %s: %s", path, exc)
            continue
        os.environ[var] = path


def serving_paths(cache_dir: str | None, extra_read=(), extra_write=()) -> Paths:
    """What an executor needs once its GPU is open."""
    mps = [os.environ.get(v) for v in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")]
    # cuInit writes under the process's own /proc entry (on the H200 it failed with
    # 304 until /proc/<pid> was writable); its own entries only, never /proc/sys.
    own_proc = os.path.realpath("/proc/self")
    return Paths(read=[*python_paths(), *toolkit_paths(), *SYSTEM_READ, *extra_read],
                 write=[*device_paths(), *(p for p in mps if p), cache_dir or "", own_proc,
                        *extra_write])


def startup_paths(serving: Paths) -> Paths:
    """What the driver's start may touch as well."""
    return Paths(read=[*serving.read, *STARTUP_READ], write=[*serving.write, *STARTUP_WRITE])


def namespace_paths(serving: Paths) -> Paths:
    """What a mount namespace holds: the driver's start and serving, in one layer."""
    return Paths(read=[*serving.read, *(p for p in STARTUP_READ if p != "/etc"), *NAMESPACE_ETC],
                 write=[*serving.write, *STARTUP_WRITE])


def enter(serving: Paths, mode: str = "auto") -> str:
    """Step 1 (the process must still have one thread), given what serving will need.
    Returns what is in force."""
    paths = startup_paths(serving)
    if mode == "none":
        return _record("none: --confine none (tests and debugging only)")
    abi = landlock.abi_version() if mode == "auto" else 0
    if abi > 0:
        try:
            abi = landlock.restrict(paths.read, paths.write)
        except OSError as exc:
            log.error("Landlock failed (%s); trying a mount namespace", exc)
        else:
            _log_rules("Landlock, first layer", paths)
            _layers.append("landlock")
            return _record(_landlock_words(abi, paths, "startup"))
    elif mode == "auto":
        log.info("this kernel has no Landlock; trying a mount namespace")
    paths = namespace_paths(serving)
    try:
        mountns.enter(paths.read, paths.write)
    except OSError as exc:
        log.warning("no mount namespace either (%s): only the empty working directory", exc)
        return _record(f"working directory only (no Landlock; no mount namespace: {exc}): "
                       "the executor's uid is all that confines it")
    _log_rules("mount namespace", paths)
    _layers.append("namespace")
    return _record(f"mount namespace ({len(paths.read)} paths read-only, "
                   f"{len(paths.write)} writable; TCP and signals not restricted)")


def narrow(paths: Paths) -> str:
    """Step 2: once the GPU is open. Returns what is in force."""
    if _layers[-1:] != ["landlock"]:
        return _in_force
    try:
        abi = landlock.restrict(paths.read, paths.write)
    except OSError as exc:
        log.error("the second Landlock layer failed (%s); the first stays", exc)
        return _in_force
    _log_rules("Landlock, second layer", paths)
    _layers.append("landlock")
    return _record(_landlock_words(abi, paths, "serving"))


def describe() -> str:
    return _in_force


def _landlock_words(abi: int, paths: Paths, stage: str) -> str:
    return (f"Landlock ABI {abi} ({stage} rules: {len(paths.read)} paths read-only, "
            f"{len(paths.write)} writable; TCP {'denied' if abi >= 4 else 'not restricted'}; "
            f"signals {'scoped' if abi >= 6 else 'not restricted'})")


def _log_rules(what: str, paths: Paths) -> None:
    log.debug("%s: read %s; write %s", what, " ".join(paths.read), " ".join(paths.write))


def _record(words: str) -> str:
    global _in_force
    _in_force = words
    return words


def available(mode: str = "auto") -> str:
    """What an executor started now would get, for the agent's start log."""
    if mode == "none":
        return "nothing (--confine none: tests and debugging only)"
    abi = landlock.abi_version() if mode == "auto" else 0
    if mode == "namespace":
        return "a private mount namespace where one can be made (--confine namespace)"
    if abi > 0:
        return (f"Landlock ABI {abi}, two layers (TCP "
                f"{'denied' if abi >= 4 else 'not restricted'}; signals "
                f"{'scoped' if abi >= 6 else 'not restricted'})")
    return ("no Landlock on this kernel: a private mount namespace where one can be made, "
            "else only an empty working directory (each executor logs which)")
