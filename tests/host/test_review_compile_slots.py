"""Review: CompileSlots' lock files are a bound, not a precondition of compiling. The
compile cache compiles on when its directory cannot be written (it logs and goes on);
the slots must too, and must not leak the descriptors they opened: an OSError out of
slot() is no CudaError, so the session closed the guest's connection as an executor bug.
"""

from __future__ import annotations

import os

from hvgpu.host.executor.admission import CompileSlots


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_cache_path_that_is_no_directory_still_compiles(tmp_path):
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_bytes(b"")  # mkdir and the lock files fail (not a directory)
    slots = CompileSlots(not_a_dir)
    with slots.slot(1.0):
        pass
    assert slots.waiting == 0


def test_a_lock_file_that_cannot_be_opened_leaks_no_descriptor(tmp_path):
    slots = CompileSlots(tmp_path, slots=2)
    (tmp_path / ".compile-slot-1").mkdir()  # opening it O_RDWR fails (EISDIR)
    before = _open_fds()
    for _ in range(3):
        try:
            with slots.slot(1.0):
                pass
        except Exception:
            pass
    assert _open_fds() == before
