"""Driver entry points the other samples do not call, through the libcuda.so.1 shim
against the agent with the GPU test double: cuda/misc_driver.c sets context flags and
shared memory banks, asks about execution affinity, a function's module and loading
state, loads a library from a file and launches through the deprecated launch API,
records and waits for the context's work, asks the device about 1D textures and atomics,
arrays about their memory and encodes im2col tensor maps; in its `hostile` mode it
passes NULL, forged and out-of-range arguments."""

from __future__ import annotations

import pytest

from tests.guest.test_shim_vmm import build, run

FLAGS = ("-Wno-deprecated-declarations",)  # it calls the deprecated launch API on purpose


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("misc_driver"), "misc_driver", FLAGS)


def test_misc_driver_entry_points_run_through_the_shim(exe, fake_agent):
    out = run(exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "context flags: scheduling 4\n"
        "context flags 3: 1\n"
        "shared memory banks: 1\n"
        "set eight-byte banks: 0\n"
        "shared memory banks then: 1\n"
        "function banks: 0\n"
        "execution affinity: supported 0, context's 224\n"
        "properties: threads per block as attribute yes, warp as attribute yes\n"
        "function's module: the one loaded yes\n"
        "found by name: loaded 1\n"
        "after cuFuncLoad: loaded 1\n"
        "cuLaunchGrid: sum 28666\n"
        "cuLaunchGridAsync: sum 53236\n"
        "cuLaunch: sum 54760\n"
        "library kernel's module: the library's yes\n"
        "library from a file: sum 28666\n"
        "a file that is not there: 301\n"
        "cuCtxRecordEvent: 0\n"
        "after the event: sum 28666\n"
        "cuCtxWaitEvent: 0\n"
        "cuCtxRecordEvent while capturing: 900\n"
        "cuCtxResetPersistingL2Cache: 0\n"
        "1D linear texture: at most 268435456 floats, 268435456 float4s\n"
        "host atomics: 0, add 0x1f, cas 0x1f, float add 0x18\n"
        "peer atomics with itself: 101\n"
        "array's memory requirements: 0\n"
        "mipmapped array's memory requirements: 0\n"
        "im2col tensor map: 0\n"
        "address replaced: 0, map changed yes\n"
        "unaligned address: 1\n"
        "misc_driver: ok\n")
    assert "not implemented" not in out.stderr


def test_hostile_misc_arguments_are_refused(exe, fake_agent):
    out = run(exe, fake_agent.address, "hostile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("hostile: bad functions, shapes, offsets, sizes, "
                                           "flags and paths refused")


@pytest.fixture(scope="module")
def batch_exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("batch_copies"), "batch_copies", FLAGS)


def test_batches_of_copies_prefetches_and_sync_memops_run_through_the_shim(batch_exe,
                                                                           fake_agent):
    """cuda/batch_copies.c: cuMemcpyBatchAsync (13's form and 12.8's, with failIdx),
    cuMemcpy3DBatchAsync between host memory, an array and pitched device memory,
    batches of managed prefetches and discards, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS."""
    out = run(batch_exe, fake_agent.address)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == (
        "cuMemcpyBatchAsync: there and back same, same\n"
        "CUDA 12.8's form: same\n"
        "cuMemcpy3DBatchAsync: array same, pitched rows same\n"
        "cuMemPrefetchBatchAsync: 0\n"
        "a prefetched byte: 5\n"
        "cuMemDiscardBatchAsync: 0\n"
        "cuMemDiscardAndPrefetchBatchAsync: 0\n"
        "sync memops before: 0\n"
        "sync memops set: 1\n"
        "copied with sync memops: same\n"
        "batch_copies: ok\n")
    assert "not implemented" not in out.stderr


def test_hostile_batches_are_refused_whole(batch_exe, fake_agent):
    out = run(batch_exe, fake_agent.address, "hostile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("hostile: batches refused whole, foreign arrays, "
                                           "dma-buf refused")
