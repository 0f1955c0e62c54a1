"""NVRTC in a confined child process: guest CUDA C++ in, a module image out.

The executor never runs NVRTC itself. Each compilation is a short-lived child
(``python -m hvgpu.host.executor.compiler``) that loads libnvrtc, then limits
itself (CPU seconds, address space, no file writes, few descriptors) and,
where the kernel has Landlock, gives up every path but the toolkit's headers
and NVRTC's own directory, before it reads the guest's source. Its working
directory is an empty private one. So a hostile source or option that slips
past ``nvrtc_policy`` still cannot read or write a host file, and a source
that makes NVRTC spin or swell only ends its own child. Nor does its log say
whether a host path exists (why an include could not be opened is cut).

The only module that loads libnvrtc. Must not decide what a guest may ask
(``nvrtc_policy`` does) or cache anything (``compile_cache`` does).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import json
import logging
import os
import re
import resource
import shutil
import site
import struct
import subprocess
import sys
import tempfile

from hvgpu.errors import CompileError
from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

CPU_SECONDS = 60  # per compilation
MEMORY = 8 << 30  # address space of the child
MAX_IMAGE = 256 << 20
_INVALID_SOURCE = P.CUDA_ERROR_INVALID_SOURCE  # what a failed compilation is, as CUDA says
_NVRTC_SUCCESS = 0
_LEN = struct.Struct("<Q")
_warned_unconfined = False


def _site_dirs() -> list[str]:
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def toolkit_home() -> str:
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def find_nvrtc() -> str | None:
    """libnvrtc's path: $HVGPU_NVRTC, the toolkit's lib64, or NVIDIA's wheels."""
    explicit = os.environ.get("HVGPU_NVRTC")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    home = toolkit_home()
    dirs = [os.path.join(home, "lib64"), os.path.join(home, "lib"),
            os.path.join(home, "targets", "x86_64-linux", "lib")]
    for d in _site_dirs():
        dirs += glob.glob(os.path.join(d, "nvidia", "*", "lib"))
    for d in dirs:
        found = sorted(p for p in glob.glob(os.path.join(d, "libnvrtc.so*"))
                       if ".alt." not in p and "builtins" not in p)
        if found:
            return max(found, key=lambda p: (p.count("."), p))
    return None


def include_dirs() -> list[str]:
    """The toolkit's header directories (the only ones a guest's #include can reach)."""
    home = toolkit_home()
    dirs = [os.path.join(home, "include"), os.path.join(home, "targets", "x86_64-linux", "include")]
    nvrtc = find_nvrtc()
    if nvrtc:  # NVIDIA's wheels keep headers beside the library
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(nvrtc)), "include"))
    return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs) if os.path.isdir(d)]


def _load(path: str):
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """'MAJOR.MINOR' of the libnvrtc this host compiles with ('' where there is none)."""
    path = find_nvrtc()
    if not path:
        return ""
    try:
        lib = _load(path)
    except OSError:
        return ""
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != _NVRTC_SUCCESS:
        return ""
    return f"{major.value}.{minor.value}"


# -- the executor's side -------------------------------------------------------

def compile_confined(source: bytes, name: str, options: list[str], headers: dict[str, bytes],
                     arch: str, *, cpu_seconds: int = CPU_SECONDS,
                     memory: int = MEMORY) -> tuple[bytes, str]:
    """(image, log); CompileError (CUDA_ERROR_INVALID_SOURCE) with NVRTC's log on a
    failed compilation, a limit reached or no NVRTC on the host."""
    global _warned_unconfined
    nvrtc = find_nvrtc()
    if nvrtc is None:
        raise CompileError(_INVALID_SOURCE, "this host has no NVRTC (libnvrtc): install the "
                           "CUDA toolkit or nvidia-cuda-nvrtc, or set HVGPU_NVRTC")
    opts = list(options)
    if not any(o.startswith(("-arch", "--gpu-architecture")) for o in opts):
        opts.append(f"--gpu-architecture={arch}")
    includes = include_dirs()
    opts += [f"--include-path={d}" for d in includes]
    meta = {"name": name, "options": opts, "headers": list(headers), "nvrtc": nvrtc,
            "read": includes + [os.path.dirname(nvrtc)], "cpu": cpu_seconds, "memory": memory,
            "sizes": [len(source)] + [len(h) for h in headers.values()]}
    blob = json.dumps(meta).encode()
    request = b"".join([_LEN.pack(len(blob)), blob, bytes(source), *map(bytes, headers.values())])
    workdir = tempfile.mkdtemp(prefix="hvgpu-nvrtc-")
    try:
        proc = subprocess.run([sys.executable, "-m", "hvgpu.host.executor.compiler"],
                              input=request, capture_output=True, cwd=workdir,
                              timeout=cpu_seconds * 2 + 30, env=_child_env())
    except subprocess.TimeoutExpired:
        raise CompileError(_INVALID_SOURCE, "compilation did not finish within "
                           f"{cpu_seconds * 2 + 30} s "
                           "and was stopped") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = proc.stdout
    if proc.returncode != 0 or len(out) < _LEN.size:
        raise CompileError(_INVALID_SOURCE, _why_child_failed(proc.returncode, cpu_seconds, memory,
                                                  proc.stderr))
    n, = _LEN.unpack_from(out)
    reply = json.loads(out[_LEN.size:_LEN.size + n])
    image = out[_LEN.size + n:]
    if not reply.get("confined") and not _warned_unconfined:
        _warned_unconfined = True
        log.warning("NVRTC runs without Landlock here (%s): only hvgpu's checks of options "
                    "and #include stand between guest source and host files",
                    reply.get("confinement"))
    build_log = _without_host_facts(reply["log"])
    if not reply["ok"]:
        raise CompileError(_INVALID_SOURCE, build_log or f"NVRTC error {reply.get('status')}")
    return image, build_log


# NVRTC says why an include could not be opened: "Permission denied" where Landlock
# kept an existing file from it, nothing where there is no such file. A guest would
# learn from that which host paths exist; every such line ends at the file's name.
_OPEN_FAILED = re.compile(r'(cannot open source file ".*?")[^\n]*')


def _without_host_facts(build_log: str) -> str:
    return _OPEN_FAILED.sub(r"\1", build_log)


def _child_env() -> dict:
    keep = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "HVGPU_NVRTC",
            "VIRTUAL_ENV", "LANG")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # The same hvgpu as this process's, however it was found (an executor gets it on
    # PYTHONPATH; a session run in-process may have it only on sys.path).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _why_child_failed(code: int, cpu_seconds: int, memory: int, stderr: bytes) -> str:
    import signal

    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"compilation exceeded its CPU-time limit of {cpu_seconds} s"
    text = stderr.decode(errors="replace").strip().splitlines()
    if code == -signal.SIGABRT or any("bad_alloc" in t or "MemoryError" in t for t in text):
        return f"compilation ran out of its memory limit ({memory >> 20} MiB)"
    return f"the compiler process failed ({code}): {text[-1] if text else 'no message'}"


# -- the child -----------------------------------------------------------------

def _read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise SystemExit("short request")
    return data


def _limit(cpu: int, memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # NVRTC writes no file, ever
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def _confine(read: list[str]) -> tuple[bool, str]:
    from hvgpu.host import landlock

    try:
        abi = landlock.restrict(read=read)
    except landlock.LandlockUnavailable as exc:
        return False, str(exc)
    except OSError as exc:
        return False, f"Landlock refused: {exc}"
    return True, f"Landlock ABI {abi}"


def _builtins_next_to(path: str) -> None:
    """Load libnvrtc-builtins now: NVRTC opens it during compilation, after confinement."""
    for p in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
        if ".alt." not in p:
            try:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def main() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    n, = _LEN.unpack(_read_exact(stdin, _LEN.size))
    meta = json.loads(_read_exact(stdin, n))
    parts = [_read_exact(stdin, size) for size in meta["sizes"]]
    source, headers = parts[0], parts[1:]
    lib = _load(meta["nvrtc"])
    _builtins_next_to(meta["nvrtc"])
    _limit(meta["cpu"], meta["memory"])
    confined, how = _confine(meta["read"])

    prog = ctypes.c_void_p()
    names = [h.encode() for h in meta["headers"]]
    hdr_src = (ctypes.c_char_p * max(len(headers), 1))(*headers)
    hdr_names = (ctypes.c_char_p * max(len(names), 1))(*names)
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), source, meta["name"].encode(),
                                    len(headers), hdr_src, hdr_names)
    build_log, image = "", b""
    if status == _NVRTC_SUCCESS:
        opts = [o.encode() for o in meta["options"]]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * max(len(opts), 1))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value or 1)
        lib.nvrtcGetProgramLog(prog, buf)
        build_log = buf.value.decode(errors="replace").strip()
        if status == _NVRTC_SUCCESS:
            image = _image(lib, prog)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if status != _NVRTC_SUCCESS and not build_log:
        build_log = lib.nvrtcGetErrorString(status).decode(errors="replace")
    if len(image) > MAX_IMAGE:
        status, image, build_log = -1, b"", f"the compiled image exceeds {MAX_IMAGE >> 20} MiB"
    reply = json.dumps({"ok": status == _NVRTC_SUCCESS, "status": status, "log": build_log,
                        "confined": confined, "confinement": how}).encode()
    stdout.write(_LEN.pack(len(reply)) + reply + image)
    stdout.flush()
    return 0


def _image(lib, prog) -> bytes:
    """The cubin, or PTX where a virtual architecture was asked for."""
    size = ctypes.c_size_t()
    if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == _NVRTC_SUCCESS and size.value:
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, buf)
        return buf.raw
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.raw


if __name__ == "__main__":
    sys.exit(main())
