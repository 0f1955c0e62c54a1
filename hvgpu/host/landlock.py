"""Landlock: confine the calling process's filesystem (and TCP) access.

Linux's Landlock LSM (5.13+) lets an unprivileged process give up access to
everything but a list of paths, for itself and every process it starts
later; nothing can lift it again. Three system calls, reached through ctypes
(x86-64 and arm64 numbers), with the rights this kernel's ABI knows.

Used by executors (before they read guest input) and by the NVRTC child
(before it compiles guest source). Must not decide which paths a process
needs: its callers do. Must not fall back silently: a kernel without
Landlock raises :class:`LandlockUnavailable` and the caller chooses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from hvgpu.errors import HvgpuError

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same
# numbers on x86-64 and arm64 (they were added after the tables converged).
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
# ABI 5's IOCTL_DEV is deliberately not handled: CUDA drives /dev/nvidia* by ioctl.

_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_SIGNAL = 1 << 1  # ABI 6: no signals to processes outside the sandbox

READ = EXECUTE | READ_FILE | READ_DIR
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # all a rule on a file may hold


class LandlockUnavailable(HvgpuError):
    """This kernel (or architecture) offers no Landlock."""

    code = "no-landlock"


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI (1, 2, ...); 0 where there is none."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    v = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(v), 0)


def _handled(abi: int) -> int:
    rights = (EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR
              | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM)
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


def restrict(read=(), write=(), *, allow_tcp: bool = False) -> int:
    """From now on this process and its children reach only ``read`` paths (read and
    execute) and ``write`` paths (everything), and, unless ``allow_tcp``, bind or
    connect no TCP port (ABI 4+). Paths that do not exist are skipped.
    Returns the ABI used; raises LandlockUnavailable or OSError."""
    abi = abi_version()
    if abi <= 0:
        raise LandlockUnavailable("this kernel has no Landlock (Linux 5.13+ with "
                                  "lsm=...,landlock)")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled = _handled(abi)
    net = 0 if allow_tcp or abi < 4 else _NET_BIND_TCP | _NET_CONNECT_TCP
    scoped = _SCOPE_SIGNAL if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("<QQQ", handled, net, scoped)
    elif abi >= 4:
        attr = struct.pack("<QQ", handled, net)
    else:
        attr = struct.pack("<Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(_SYS_CREATE, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for paths, rights in ((read, READ), (write, handled)):
            for path in paths:
                _add_path(libc, fd, os.fspath(path), rights & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(fd)
    return abi


def _add_path(libc, ruleset: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = ctypes.create_string_buffer(struct.pack("<Qi", rights, pfd), 12)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                        rule, ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            if e != errno.EINVAL:  # EINVAL: a right this kind of file cannot hold
                raise OSError(e, f"landlock_add_rule({path}): {os.strerror(e)}")
    finally:
        os.close(pfd)
