"""CUDA arrays, 2D/3D copies, texture and surface objects through the shim
(hvgpu/guest/shim/array.c) against the GPU test double: the bytes a program copies
through an array come back as they went, a kernel reads the array through the
texture object value it holds, a graph built by hand copies pageable memory to and
from an array at each launch, and what CUDA refuses is refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hvgpu.guest.shim import library

HERE = Path(__file__).parent


def test_arrays_copies_and_objects_through_the_shim(fake_agent, tmp_path):
    exe = tmp_path / "arrays"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "cuda/arrays_driver.c"),
                    f"-L{library().parent}", "-l:libcuda.so.1"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HVGPU_AGENT=fake_agent.address,
                                  LD_LIBRARY_PATH=str(library().parent)))
    assert "FAILED" not in out.stdout, out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [w for name in (
        "array_create", "array_descriptor", "alloc_pitch", "pitched_2d_through_array",
        "array_sub_rectangle", "past_the_array_refused", "volume_box", "one_row_forms",
        "texture_object", "kernel_reads_texture", "surface_object", "objects_destroyed",
        "second_destroy_refused", "graph_copy_nodes", "mipmap_level", "destroyed", "destroyed_array_unknown")
        for w in (name, "ok")]
    assert "not implemented" not in out.stderr
