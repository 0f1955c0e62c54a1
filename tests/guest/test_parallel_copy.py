"""hvgpu.guest.parallel_copy: a large copy split among threads is still the copy."""

import ctypes
import os
import threading

import pytest

from hvgpu.guest import parallel_copy
from hvgpu.virtio import tuning as T

MiB = 1 << 20


@pytest.mark.parametrize("n", [0, 1, 4095, 2 * MiB - 1, 2 * MiB, 8 * MiB + 12345, 33 * MiB + 7])
@pytest.mark.parametrize("threads", ["1", "3", "4", ""])
def test_every_byte_lands_and_nothing_beyond_the_range(monkeypatch, n, threads):
    monkeypatch.setenv("HVGPU_COPY_THREADS", threads)
    src = bytearray(os.urandom(n))
    dst = bytearray(b"\xa5" * (n + 2))
    s = (ctypes.c_char * max(n, 1)).from_buffer(src) if n else None
    d = (ctypes.c_char * (n + 2)).from_buffer(dst)
    parallel_copy.copy(ctypes.addressof(d) + 1, ctypes.addressof(s) if s else 0, n)
    assert dst[1:n + 1] == src
    assert dst[0] == 0xA5 and dst[n + 1] == 0xA5


def test_a_copy_that_finds_the_pool_busy_copies_alone(monkeypatch):
    monkeypatch.setenv("HVGPU_COPY_THREADS", "4")
    n = 16 * MiB
    srcs = [bytearray(os.urandom(n)) for _ in range(4)]
    dsts = [bytearray(n) for _ in range(4)]
    anchors = [((ctypes.c_char * n).from_buffer(s), (ctypes.c_char * n).from_buffer(d))
               for s, d in zip(srcs, dsts)]

    def run(i):
        s, d = anchors[i]
        for _ in range(5):
            parallel_copy.copy(ctypes.addressof(d), ctypes.addressof(s), n)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(s == d for s, d in zip(srcs, dsts))


def test_a_forked_child_copies_with_its_own_pool(monkeypatch):
    monkeypatch.setenv("HVGPU_COPY_THREADS", "3")
    n = 8 * MiB
    src = bytearray(os.urandom(n))
    s = (ctypes.c_char * n).from_buffer(src)
    first = bytearray(n)
    parallel_copy.copy(ctypes.addressof((ctypes.c_char * n).from_buffer(first)),
                       ctypes.addressof(s), n)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the parent's helper threads did not come along
        out = bytearray(n)
        parallel_copy.copy(ctypes.addressof((ctypes.c_char * n).from_buffer(out)),
                           ctypes.addressof(s), n)
        os._exit(0 if out == src else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first == src


def test_the_thread_count_follows_the_setting(monkeypatch):
    monkeypatch.setenv("HVGPU_COPY_THREADS", "2")
    assert parallel_copy.threads() == 2
    monkeypatch.setenv("HVGPU_COPY_THREADS", "0")
    assert parallel_copy.threads() == 1
    monkeypatch.setenv("HVGPU_COPY_THREADS", "many")
    assert 1 <= parallel_copy.threads() <= T.PARALLEL_COPY_THREADS
