"""The guest's libcuda.so.1 shim: where the built library is, and what it implements.

Its NVML counterpart, libnvidia-ml.so.1, is built into this directory too, so
whatever puts the shim on the library path puts NVML there with it; so is
libhvgpu-client.so.1, the Python API's client, made of the shim's own wire and
region lane (hvgpu/guest/client.py loads it).

The C sources beside this file are compiled into ``libcuda.so.1`` at install
time (setup.py). This module only finds the library and reads its coverage
table through ctypes; it must not load it into a process that runs CUDA work
(that is what ``hvgpu-guest run`` is for).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

from hvgpu.errors import HvgpuError

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libcuda.so.1"
NVML_LIBRARY = HERE / "libnvidia-ml.so.1"  # built beside it (sources: hvgpu/guest/nvml/)
# The Python API's client (hvgpu/guest/client.py loads it), built from the shim's wire.c,
# region_lane.c, region.c and pcopy.c with client.c: not the shim itself (client.c says why).
CLIENT_LIBRARY = HERE / "libhvgpu-client.so.1"


class ShimMissing(HvgpuError):
    """The install had no C compiler, so the shim was not built."""

    code = "shim-missing"


def library() -> Path:
    if not LIBRARY.exists():
        raise ShimMissing(
            f"the hvgpu libcuda.so.1 shim is not built ({LIBRARY} is missing): install a C "
            "compiler (e.g. apt install gcc) and reinstall hvgpu-guest (pip install "
            "--force-reinstall --no-deps hvgpu-guest; hvgpu where that is what is installed)")
    return LIBRARY


def coverage() -> list[tuple[str, str, bool]]:
    """(API name, exported symbol, implemented) for every driver entry point cuda.h names."""
    lib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_LOCAL)
    fn = lib.hvgpu_shim_coverage
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                   ctypes.POINTER(ctypes.c_int)]
    rows, i = [], 0
    api, symbol, implemented = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
    while fn(i, ctypes.byref(api), ctypes.byref(symbol), ctypes.byref(implemented)):
        rows.append((api.value.decode(), symbol.value.decode(), bool(implemented.value)))
        i += 1
    return rows


def needed_by() -> dict[str, list[str]]:
    """Entry points not implemented that programs of the external suites called
    (bench/compat.py needed-by writes the file): API name -> the programs."""
    path = Path(__file__).with_name("needed_by.json")
    try:
        return json.loads(path.read_text()).get("needed_by", {})
    except (OSError, ValueError):
        return {}
