"""bench/checks.py: a copy that did nothing, or did part of its job, fails its check.

HostSide is a stand-in for a device: its memory is NumPy arrays, and each fault it can
be given is one a broken lane could have."""

from __future__ import annotations

import numpy as np
import pytest

from bench import checks


class HostSide:
    """Device memory in host arrays. ``fault``: None, "no-h2d", "no-d2h", "short"
    (the last byte is not copied), "shifted" (one byte late), "spill" (one byte too many),
    "stale" (a source already sent from the same address and size is not sent again)."""

    def __init__(self, fault=None):
        self.fault = fault
        self.sent = {}

    def alloc(self, n):
        return np.zeros(n, dtype=np.uint8)

    def memset(self, dev, byte):
        dev[:] = byte

    def h2d(self, dev, offset, host):
        host = np.asarray(host)
        if self.fault == "no-h2d":
            return
        key = (host.__array_interface__["data"][0], host.size)
        if self.fault == "stale" and key in self.sent:
            host = self.sent[key]
        self.sent[key] = host.copy()
        n = host.size - (self.fault == "short")
        start = offset + (self.fault == "shifted")
        dev[start:start + n] = host[:n]
        if self.fault == "spill":
            dev[offset + host.size] = 0

    def d2h(self, host, dev, offset):
        if self.fault == "no-d2h":
            return
        host[:] = dev[offset:offset + host.size]

    def sync(self):
        pass


def test_fresh_patterns_never_hold_the_poison_and_differ_from_seed_to_seed():
    a, b = checks.fresh(3 * checks.PERIOD + 5, 1), checks.fresh(3 * checks.PERIOD + 5, 2)
    assert a.size == 3 * checks.PERIOD + 5 and a.dtype == np.uint8
    assert checks.POISON not in a and checks.POISON not in b
    assert np.mean(a != b) > 0.99
    assert np.array_equal(checks.fresh(4093, 7), checks.fresh(4093, 7))
    assert checks.fresh(1, 3).size == 1


def test_first_difference_says_how_many_bytes_differ_and_names_the_poison():
    want = checks.fresh(100, 0)
    assert checks.first_difference(want.copy(), want) is None
    got = want.copy()
    got[10:] = checks.POISON
    problem = checks.first_difference(got, want)
    assert problem.startswith("90 of 100 bytes differ, the first at byte 10: 0xff")
    assert "nothing was copied" in problem
    assert "99 bytes" in checks.first_difference(want[:99], want)
    assert checks.first_difference(bytes(want), bytearray(want)) is None


def _buffers():
    host = np.empty(checks.CHECK_BYTES + 2 * checks.GUARD, dtype=np.uint8)
    back = np.empty_like(host)
    return host, back


def test_every_odd_size_passes_on_a_working_side():
    side = HostSide()
    host, back = _buffers()
    assert checks.odd_sizes(side, side.alloc(checks.CHECK_BYTES), host, back, seed=1) is None
    assert any(size % 4096 and size > 8 << 20 for size, _ in checks.CHECK_CASES)
    assert any(offset % 2 for _, offset in checks.CHECK_CASES)


@pytest.mark.parametrize("fault,what", [("no-h2d", "H2D"), ("no-d2h", "H2D"),
                                        ("short", "H2D"), ("shifted", "H2D"),
                                        ("spill", "H2D")])
def test_a_copy_that_did_nothing_or_part_of_its_job_fails(fault, what):
    side = HostSide(fault)
    host, back = _buffers()
    problem = checks.odd_sizes(side, side.alloc(checks.CHECK_BYTES), host, back, seed=1)
    assert problem and problem.startswith(what), problem


def test_a_d2h_that_writes_past_its_destination_fails():
    class Spilling(HostSide):
        def d2h(self, host, dev, offset):
            host[:] = dev[offset:offset + host.size]
            base = host.base if host.base is not None else host
            end = host.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            base[end + host.size] = 0  # one byte past the end

    side = Spilling()
    host, back = _buffers()
    problem = checks.roundtrip(side, side.alloc(4096), host, back, 100, 3, seed=5)
    assert problem and problem.startswith("D2H of 100 bytes from offset 3"), problem


def test_the_same_bytes_left_from_an_earlier_repetition_fail_a_later_one():
    side = HostSide()
    dev = side.alloc(1 << 16)
    host, back = _buffers()
    assert checks.roundtrip(side, dev, host, back, 4093, 0, seed=1) is None
    side.fault = "no-h2d"  # the device still holds repetition 1's bytes, but is poisoned first
    assert checks.roundtrip(side, dev, host, back, 4093, 0, seed=2)
    stale = HostSide("stale")  # sends what it sent from that address before
    assert checks.roundtrip(stale, dev, host, back, 4093, 0, seed=1) is None
    assert "H2D" in checks.roundtrip(stale, dev, host, back, 4093, 0, seed=2)


def test_the_launch_counter_must_count_every_launch_from_a_start_that_moves():
    start = checks.counter_start(3)
    assert start != checks.counter_start(4)
    assert checks.counter((start + 5000) & 0xFFFFFFFF, start, 5000) is None
    assert "4999 of them ran" in checks.counter((start + 4999) & 0xFFFFFFFF, start, 5000)
    assert "0 of them ran" in checks.counter(start, start, 5000)
    near_wrap = 0xFFFFFFFF - 10
    assert checks.counter(100 - 11, near_wrap, 100) is None


def test_a_product_full_of_the_float_poison_fails():
    ref = np.arange(1.0, 17.0).reshape(4, 4)
    assert checks.matrix(ref.astype(np.float32), ref, 1e-4) is None
    nan = np.full((4, 4), np.nan, dtype=np.float32)
    assert "relative error nan" in checks.matrix(nan, ref, 1e-4)
    assert checks.matrix(np.zeros((4, 4), np.float32), ref, 1e-4)
