"""How a benchmark proves that what it timed was done: fresh data, poisoned destinations.

A copy that did nothing must fail its check. So before a copy is timed or checked its
destination is filled with POISON, a byte that fresh() never produces, and its source
gets a pattern fresh() draws from the repetition's own seed; the check compares the
destination with that pattern. Stale bytes from an earlier repetition (another seed),
the poison itself, a short copy, a copy at the wrong offset or one that spills past its
end all differ from what is expected. Sizes are odd on purpose (CHECK_CASES): a lane
that moves whole 4 KiB pages or 8 MiB chunks shows itself at the ragged end.

The round-trip check drives a *side* through four calls, so the same check runs on
native CUDA, on hvgpu's Python API and on tests' host-memory double:

    side.memset(dev, byte)       fill the whole device buffer
    side.h2d(dev, offset, host)  host.nbytes bytes into the device buffer at offset
    side.d2h(host, dev, offset)  host.nbytes bytes from the device buffer at offset
    side.sync()                  wait for everything asked so far

NumPy only; must not import CUDA, CuPy or hvgpu.
"""

from __future__ import annotations

import numpy as np

POISON = 0xFF
PERIOD = 65521  # prime: a pattern that never lines up with a page or a chunk
GUARD = 16  # bytes around a copy's destination that must still hold the poison after it

# (size, offset into the device buffer): 1 byte, odd sizes either side of a 4 KiB page,
# a 64 KiB socket frame, 1 MiB, and across the lane's 8 MiB staging chunks.
CHECK_CASES = [(1, 0), (3, 1), (4093, 0), (4099, 7), (65537, 5), ((1 << 20) + 7, 0),
               ((8 << 20) + 4099, 3), ((24 << 20) + 1, 0)]
CHECK_BYTES = max(size + offset for size, offset in CHECK_CASES) + GUARD


def fresh(n: int, seed: int) -> np.ndarray:
    """n bytes of a pattern drawn from ``seed``, never POISON (0..254 only)."""
    block = np.random.default_rng(seed).integers(0, POISON, min(n, PERIOD), dtype=np.uint8)
    return np.resize(block, n) if n > PERIOD else block


def first_difference(got, want) -> str | None:
    """None when the bytes are equal; else how many differ and the first of them."""
    got = np.frombuffer(got, dtype=np.uint8) if not isinstance(got, np.ndarray) else got
    want = np.frombuffer(want, dtype=np.uint8) if not isinstance(want, np.ndarray) else want
    if got.size != want.size:
        return f"{got.size} bytes where {want.size} were expected"
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return None
    i = int(bad[0])
    what = " (the poison: nothing was copied there)" if got[i] == POISON else ""
    return (f"{bad.size} of {want.size} bytes differ, the first at byte {i}: "
            f"0x{int(got[i]):02x}, expected 0x{int(want[i]):02x}{what}")


def roundtrip(side, dev, host: np.ndarray, back: np.ndarray, size: int, offset: int,
              seed: int) -> str | None:
    """Copy fresh bytes into a poisoned device buffer at ``offset`` and read them back
    into poisoned host memory; None when every byte, and the poison around them on
    both sides, is as expected. ``host`` and ``back`` hold at least size + 2*GUARD
    and offset + size + GUARD bytes; ``dev`` at least offset + size + GUARD."""
    want = fresh(size, seed)
    src = host[:size]
    src[:] = want
    side.memset(dev, POISON)
    side.h2d(dev, offset, src)
    side.sync()
    whole = back[:offset + size + GUARD]
    whole[:] = POISON ^ 0x5A  # not the device's poison: a D2H that did nothing shows
    side.d2h(whole, dev, 0)
    expect = np.full(offset + size + GUARD, POISON, dtype=np.uint8)
    expect[offset:offset + size] = want
    problem = first_difference(whole, expect)
    if problem:
        return f"H2D of {size} bytes at offset {offset}, read back: {problem}"
    framed = back[:size + 2 * GUARD]
    framed[:] = POISON
    side.d2h(framed[GUARD:GUARD + size], dev, offset)
    expect = np.full(size + 2 * GUARD, POISON, dtype=np.uint8)
    expect[GUARD:GUARD + size] = want
    problem = first_difference(framed, expect)
    if problem:
        return f"D2H of {size} bytes from offset {offset}: {problem}"
    return None


def odd_sizes(side, dev, host: np.ndarray, back: np.ndarray, seed: int,
              cases=CHECK_CASES) -> str | None:
    """roundtrip() at every odd size and offset, each with its own seed; the first failure."""
    for k, (size, offset) in enumerate(cases):
        problem = roundtrip(side, dev, host, back, size, offset, seed * 1000 + k)
        if problem:
            return problem
    return None


# The kernel whose launches are timed: it adds k to a counter, so that counter() can tell
# whether every launch ran (bench/shim_bench.cu has the same kernel).
TICK = r"""
extern "C" __global__ void tick(unsigned int* n, int k) {
    if (threadIdx.x == 0) atomicAdd(n, (unsigned int)k);
}
"""
LAUNCH_BATCH = 1000  # launches between two looks at the clock


def counter(got: int, start: int, launches: int) -> str | None:
    """A kernel that adds 1 to a 32-bit counter per launch, set to ``start`` before them."""
    want = (start + launches) & 0xFFFFFFFF
    if got == want:
        return None
    return (f"the launch counter reads {got} after {launches} launches from {start}, "
            f"not {want}: {(got - start) & 0xFFFFFFFF} of them ran")


def counter_start(seed: int) -> int:
    """Where a window's launch counter starts: differs from window to window, so a
    counter left by an earlier window cannot pass for this one's."""
    return (seed * 7919 + 12345) & 0xFFFFFFFF


def matrix(got: np.ndarray, ref: np.ndarray, rtol: float) -> str | None:
    """A product against its reference: relative Frobenius error (NaN, the poison of
    float memory, counts as infinitely wrong)."""
    err = float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))
    if err <= rtol:
        return None
    return f"relative error {err:.3g} against the reference (allowed {rtol:g})"
