"""What kernels print reaches the program's own stdout, where the synchronisation was.

tests/guest/cuda/kernel_says.c runs through the shim against the GPU test double,
whose `say` kernel prints at the next synchronisation as a kernel's printf does; the
Python API's connection writes it to its process's stdout the same way.
"""

from __future__ import annotations

import os
import struct
import subprocess

from hvgpu.guest.client import Connection
from hvgpu.guest.shim import library

HERE = os.path.dirname(__file__)
PTX = b".version 8.0\n.target sm_90\n.visible .entry say(\n .param .u32 v\n)\n{\n ret;\n}\n\0"


def test_a_program_through_the_shim_prints_what_its_kernel_printed_in_its_place(
        fake_agent, tmp_path):
    exe = tmp_path / "kernel_says"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-o", str(exe),
                    os.path.join(HERE, "cuda/kernel_says.c"), f"-L{library().parent}",
                    "-l:libcuda.so.1"], check=True, timeout=120)
    env = dict(os.environ, HVGPU_AGENT=fake_agent.address, LD_LIBRARY_PATH=str(library().parent))
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "host: before\nkernel says 7\nkernel says 8\nhost: after\n"


def test_the_python_api_prints_what_its_kernel_printed(fake_agent, capfd):
    with Connection(fake_agent.address) as conn:
        (module,) = conn.call("MODULE_LOAD_DATA", payload=PTX)
        (function,) = conn.call("MODULE_GET_FUNCTION", module, "say")
        conn.launch(function, (1, 1, 1), (1, 1, 1), 0, 0, struct.pack("<ii", 3, 1))
        assert capfd.readouterr().out == ""  # nothing until a synchronisation
        conn.call("CTX_SYNCHRONIZE")
        assert capfd.readouterr().out == "kernel says 3\n"
