"""The shim's parallel copy (shim/pcopy.c): a chunk split among threads is still the
whole chunk, at every size, whatever the number of threads.

pcopy.c is linked alone into cuda/pcopy_check.c, so the split is tested without a
lane or an agent; the copies through the whole shim are tests/guest/test_copy_properties.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SHIM = HERE.parents[1] / "hvgpu/guest/shim"
INCLUDE = HERE.parents[1] / "hvgpu/virtio/include"
KiB, MiB = 1 << 10, 1 << 20

# Around the size below which one thread copies alone (2 MiB), and sizes whose share
# per thread is already 4 KiB-aligned with a remainder: n / parts rounds down to an
# aligned share, so a split that aligned n / parts lost the last n % parts bytes.
SIZES = [0, 1, 4095, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1, 4 * MiB + 1, 4 * MiB + 2, 4 * MiB + 3,
         6 * MiB + 1, 6 * MiB + 2, 8 * MiB - 1, 8 * MiB, 12 * MiB + 3, 10 * MiB + 1,
         7 * MiB + 3, 8 * MiB + 12345]


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("pcopy") / "pcopy_check"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-pthread", f"-I{INCLUDE}",
                    "-o", str(exe), str(HERE / "cuda/pcopy_check.c"), str(SHIM / "pcopy.c")],
                   check=True, timeout=120)
    return exe


@pytest.mark.parametrize("threads", ["1", "2", "3", "4", "5", "16"])
def test_every_byte_of_a_split_copy_lands_and_nothing_beyond(checker, threads):
    out = subprocess.run([str(checker), *map(str, SIZES)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, HVGPU_COPY_THREADS=threads))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{n} wrong=0 guards=ok" for n in SIZES]
