"""Builds hvgpu's two C libraries as part of every install.

Everything else is declared in pyproject.toml. Both are plain C (no Python
API), compiled by setuptools' build_ext because that is what pip runs on
every install, so a user never compiles them by hand:

- the guest's ``libcuda.so.1`` shim, and its ``libnvidia-ml.so.1`` (NVML, sources
  in hvgpu/guest/nvml/, sharing the shim's wire.c), built beside it so that what
  puts the shim on the library path puts both;
- the host executor's loop of one-way frames (``liblaunch_burst.so``, loaded with
  ctypes).

Both take the wire layout from one generated header,
``hvgpu/virtio/include/hvgpu_wire.h`` (``python -m hvgpu.virtio.cgen``).

Without a C compiler the install still succeeds: ``hvgpu-guest run`` then says
the shim is missing, and the executor serves every frame through its Python
path (and logs that it does). A library that fails to build is said loudly at
the end of the build, and tests/test_build.py fails where a compiler is present
and a library is missing or older than its sources.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM = "hvgpu.guest.shim.libcuda"
SHIM_DIR = os.path.join("hvgpu", "guest", "shim")
WIRE_INCLUDE = os.path.join("hvgpu", "virtio", "include")
WIRE_HEADER = os.path.join(WIRE_INCLUDE, "hvgpu_wire.h")
SOURCES = ["wire.c", "state.c", "device.c", "context.c", "memory.c", "vmm.c", "pool.c",
           "poolcache.c", "module.c", "launches.c", "occupancy.c", "stream.c", "dark.c",
           "proc.c", "stubs.c", "crash.c", "region.c", "shared.c", "pcopy.c", "graph.c",
           "graph_guest.c"]
NVML = "hvgpu.guest.shim.libnvidia_ml"
NVML_DIR = os.path.join("hvgpu", "guest", "nvml")
NVML_SOURCES = [os.path.join(NVML_DIR, s) for s in ("nvml.c", "stubs.c")] + [
    os.path.join(SHIM_DIR, "wire.c")]
BURST = "hvgpu.host.executor.liblaunch_burst"
# extension name -> file name: C libraries, not CPython modules
PLAIN_C = {SHIM: "libcuda.so.1", NVML: "libnvidia-ml.so.1", BURST: "liblaunch_burst.so"}


class BuildPlainC(build_ext):
    """Names each library as its loader expects (not a Python extension's name) and
    links it without Python."""

    def _plain(self, fullname):
        return next((n for n in PLAIN_C if n == fullname or n.endswith("." + fullname)), None)

    def get_ext_filename(self, fullname):
        name = super().get_ext_filename(fullname)
        plain = self._plain(fullname)  # asked with and without the package
        return os.path.join(os.path.dirname(name), PLAIN_C[plain]) if plain else name

    def get_export_symbols(self, ext):
        return [] if ext.name in PLAIN_C else super().get_export_symbols(ext)

    def build_extension(self, ext):
        if ext.name in PLAIN_C:
            # No Python headers or libpython.
            self.compiler.include_dirs = []
            self.compiler.library_dirs = []
        try:
            super().build_extension(ext)
        except Exception as exc:
            # build_ext turns an optional extension's failure into one warning line among
            # many; it is kept here to be said again, loudly, once the build is done.
            if ext.optional:
                self.failed.append((ext.name, str(exc) or type(exc).__name__))
            raise

    failed: list = []

    def run(self):
        self.failed = []
        super().run()
        for name, why in self.failed:
            # Optional: an install without them still works, slower (the launch loop)
            # or without the guest's CUDA library (the shim). Said where it is seen.
            bar = "!" * 72
            sys.stderr.write(f"\n{bar}\nhvgpu: {PLAIN_C.get(name, name)} FAILED TO BUILD "
                             f"({name}): {why}\n"
                             + ("the guest's libcuda.so.1 shim is missing: hvgpu-guest run "
                                "will refuse to start programs\n" if name == SHIM else
                                "NVML tools in the VM (nvidia-ml-py, nvitop, gpustat) will "
                                "see no GPU\n" if name == NVML else
                                "the executor will serve every frame through its slower "
                                "Python path\n")
                             + f"{bar}\n\n")



FLAGS = ["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall"]

setup(
    ext_modules=[
        Extension(
            SHIM,
            sources=[os.path.join(SHIM_DIR, s) for s in SOURCES],
            depends=[os.path.join(SHIM_DIR, h) for h in
                     ("shim.h", "driver_api.def", "implemented.def")] + [WIRE_HEADER],
            include_dirs=[WIRE_INCLUDE],
            extra_compile_args=FLAGS,
            extra_link_args=["-Wl,-soname,libcuda.so.1", "-pthread"],
            optional=True,
        ),
        Extension(
            NVML,
            sources=NVML_SOURCES,
            depends=[os.path.join(NVML_DIR, "nvml_api.def"), os.path.join(SHIM_DIR, "shim.h"),
                     WIRE_HEADER],
            include_dirs=[WIRE_INCLUDE, SHIM_DIR],
            extra_compile_args=FLAGS,
            extra_link_args=["-Wl,-soname,libnvidia-ml.so.1", "-pthread"],
            optional=True,
        ),
        Extension(
            BURST,
            sources=[os.path.join("hvgpu", "host", "executor", "launch_burst.c")],
            depends=[WIRE_HEADER],
            include_dirs=[WIRE_INCLUDE],
            extra_compile_args=FLAGS,
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildPlainC},
)
