"""The device-memory lock across the executors of one GPU: a measurement excludes
every release and allocation of the others, releases do not exclude each other,
and a holder that never lets go delays the others by the bound only."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

from hvgpu.host.executor.device_memory import DeviceMemoryLock

GPU = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def _lock(tmp_path, wait: float = 10.0) -> DeviceMemoryLock:
    lock = DeviceMemoryLock(wait)
    assert lock.attach(tmp_path, GPU)
    return lock


def _in_thread(fn) -> tuple[threading.Thread, list[float]]:
    done: list[float] = []

    def run():
        fn()
        done.append(time.monotonic())

    t = threading.Thread(target=run)
    t.start()
    return t, done


def test_a_release_in_another_executor_waits_for_a_measurement(tmp_path):
    measuring, releasing = _lock(tmp_path), _lock(tmp_path)  # two executors' own files
    with measuring.measuring():
        t, done = _in_thread(lambda: releasing.__enter__() and releasing.__exit__())
        time.sleep(0.3)
        assert done == []  # still waiting
        ended = time.monotonic()
    t.join(5)
    assert done and done[0] >= ended


def test_a_measurement_waits_for_a_release_under_way(tmp_path):
    measuring, releasing = _lock(tmp_path), _lock(tmp_path)
    with releasing:
        def measure():
            with measuring.measuring():
                pass
        t, done = _in_thread(measure)
        time.sleep(0.3)
        assert done == []
        ended = time.monotonic()
    t.join(5)
    assert done and done[0] >= ended


def test_releases_of_two_executors_go_on_together(tmp_path):
    one, two = _lock(tmp_path), _lock(tmp_path)
    with one:
        start = time.monotonic()
        with two:
            pass
        assert time.monotonic() - start < 0.5


def test_other_gpus_are_not_held_up(tmp_path):
    one = _lock(tmp_path)
    other = DeviceMemoryLock()
    assert other.attach(tmp_path, "GPU-ffffffff-0405-0607-0809-0a0b0c0d0e0f")
    with one.measuring():
        start = time.monotonic()
        with other.measuring():
            pass
        assert time.monotonic() - start < 0.5


def test_a_holder_that_never_lets_go_delays_the_others_by_the_bound_only(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    lock = _lock(tmp_path, wait=0.5)
    wedged = os.open(lock.shared_with, os.O_RDWR)
    fcntl.flock(wedged, fcntl.LOCK_EX)  # another executor, stopped inside its measurement
    try:
        for _ in range(2):
            start = time.monotonic()
            with lock:
                pass
            assert 0.4 < time.monotonic() - start < 3
        assert sum("past" in r.getMessage() for r in caplog.records) == 1  # said once
    finally:
        os.close(wedged)


def test_nested_holds_keep_the_outer_mode(tmp_path):
    lock, other = _lock(tmp_path, wait=0.2), _lock(tmp_path, wait=0.2)
    with lock:  # shared
        with lock.measuring():  # raised to exclusive for its span
            assert not _can(other, fcntl.LOCK_SH)
        assert _can(other, fcntl.LOCK_SH)  # shared again
        assert not _can(other, fcntl.LOCK_EX)
    assert _can(other, fcntl.LOCK_EX)  # let go
    with lock.measuring():
        with lock:  # a release inside a measurement: still exclusive
            assert not _can(other, fcntl.LOCK_SH)
        assert not _can(other, fcntl.LOCK_SH)


def test_without_a_lock_file_the_process_lock_still_holds(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    lock = DeviceMemoryLock()
    assert not lock.attach(tmp_path / "missing", GPU)
    assert lock.shared_with == "" and "cannot be opened" in caplog.text
    with lock.measuring():
        t, done = _in_thread(lambda: lock.__enter__() and lock.__exit__())
        time.sleep(0.2)
        assert done == []  # another thread of this executor waits
    t.join(5)
    assert done


def _can(lock: DeviceMemoryLock, mode: int) -> bool:
    fd = os.open(lock.shared_with, os.O_RDWR)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
