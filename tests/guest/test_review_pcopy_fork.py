"""Review: the shim's parallel copy in a forked child. The child starts its helpers
anew (in_child: helpers = 0) while the job counter keeps the parent's count, and a new
helper began with seen = 0: it took the parent's last job, still in job_dst / job_src,
for a new one and copied it again, writing into a buffer the program had since reused.
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


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("pcopy") / "pcopy_fork_check"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-pthread", f"-I{INCLUDE}",
                    "-o", str(exe), str(HERE / "cuda/pcopy_fork_check.c"),
                    str(SHIM / "pcopy.c")], check=True, timeout=120)
    return exe


@pytest.mark.parametrize("threads", ["4", "16"])
def test_a_forked_childs_helpers_do_not_replay_the_parents_last_copy(checker, threads):
    out = subprocess.run([str(checker), "20"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HVGPU_COPY_THREADS=threads))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "stale=0"
