"""A private mount namespace that holds only the paths an executor may reach:
the confinement where the kernel has no Landlock.

The executor moves into a new mount namespace (inside a new user namespace
when it is not root), builds a root of its own on a tmpfs from bind mounts of
the allowed paths (read-only ones remounted read-only), pivots into it and
detaches the host's root. What is not listed does not exist for it any more.
Unlike Landlock this restricts neither TCP nor signals, and the listed
directories' submounts keep their own flags.

Must run while the process has a single thread (a user namespace requires it,
and the new namespace binds only the calling thread). Must not decide which
paths are allowed (``sandbox`` does); raises OSError when a step fails.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
_KEPT = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME  # statvfs bits = MS bits
_ST_RELATIME = 4096
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_PR_SET_NO_NEW_PRIVS = 38
STAGE = "/tmp"  # where the new root is built; every source is opened before it is covered


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def enter(read, write) -> None:
    """Leave the host's filesystem for a root made of ``read`` (read-only) and
    ``write`` (read-write) paths; missing paths are skipped."""
    if threading.active_count() > 1:
        raise OSError(errno.EINVAL, "a mount namespace needs a single-threaded process")
    if platform.machine() not in _SYS_PIVOT_ROOT:
        raise OSError(errno.ENOSYS, f"no pivot_root number for {platform.machine()}")
    libc = _libc()
    rules = {}
    for path, writable in [*((p, False) for p in read), *((p, True) for p in write)]:
        real = os.path.realpath(path)
        if os.path.exists(real):
            rules[real] = rules.get(real, False) or writable
    links = {os.path.abspath(p): os.readlink(p) for p in [*read, *write] if os.path.islink(p)}
    userns = os.geteuid() != 0
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if userns else 0)), "unshare")
    if userns:
        _map_ids(uid, gid)
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    # opened in the new namespace (a bind's source must be one of its mounts) and
    # before the new root covers STAGE
    sources = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in rules}
    try:
        _check(libc.mount(b"hvgpu-root", STAGE.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                          b"mode=0755"), "tmpfs for the new root")
        try:
            for path in sorted(rules, key=lambda p: (p.count("/"), p)):  # parents first
                _bind(libc, sources[path], path, rules[path])
            for link, target in links.items():
                _symlink(link, target)
            os.chdir(STAGE)
            _check(libc.syscall(_SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
        except OSError:  # leave the host's view as it was, /tmp included
            os.chdir("/")
            libc.umount2(STAGE.encode(), MNT_DETACH)
            raise
        _check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
        os.chdir("/")
        _check(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
                          | MS_NODEV, None), "the new root read-only")
    finally:
        for fd in sources.values():
            os.close(fd)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if userns:  # the capabilities the new user namespace gave: not needed any more
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(libc.syscall(_SYS_CAPSET[platform.machine()], header, data), "capset")


def _map_ids(uid: int, gid: int) -> None:
    """The same uid and gid inside as outside: files keep their owners."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _bind(libc, fd: int, path: str, writable: bool) -> None:
    target = STAGE + path
    if not os.path.lexists(target):  # not already there under a bound parent
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target)
        else:
            open(target, "w").close()
    _check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC,
                      None), f"bind {path}")
    if not writable:
        flags = os.statvfs(target).f_flag
        kept = (flags & _KEPT) | (MS_RELATIME if flags & _ST_RELATIME else 0)
        _check(libc.mount(None, target.encode(), None,
                          MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept, None),
               f"{path} read-only")


def _symlink(link: str, target: str) -> None:
    """A listed path that is a symbolic link (/lib -> usr/lib) stays one."""
    where = STAGE + link
    if not os.path.lexists(where):
        os.makedirs(os.path.dirname(where), exist_ok=True)
        os.symlink(target, where)
