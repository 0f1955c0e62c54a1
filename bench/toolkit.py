"""Where the CUDA toolkit's pieces are, for the benchmarks and the GPU tests that build CUDA C++."""

from __future__ import annotations

import glob
import os
import shutil
import sysconfig


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return default if os.path.exists(default) else None


def cublas() -> tuple[str, str] | None:
    """(include dir, lib dir) of cuBLAS: the toolkit's, else the nvidia-cublas wheel's."""
    purelib = sysconfig.get_paths()["purelib"]
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    roots += glob.glob(os.path.join(purelib, "nvidia", "*"))
    roots += glob.glob(os.path.join(purelib, "nvidia", "*", "*"))
    for root in roots:
        inc = os.path.join(root, "include")
        for lib in ("lib64", "lib"):
            libdir = os.path.join(root, lib)
            if os.path.exists(os.path.join(inc, "cublas_v2.h")) and \
                    glob.glob(os.path.join(libdir, "libcublas.so*")):
                return inc, libdir
    return None
