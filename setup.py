"""Builds hvgpu's two C libraries as part of every install.

Everything else is declared in pyproject.toml. Both are plain C (no Python
API), compiled by setuptools' build_ext because that is what pip runs on
every install, so a user never compiles them by hand:

- the guest's ``libcuda.so.1`` shim;
- the host executor's loop of one-way frames (``liblaunch_burst.so``, loaded with
  ctypes).

Without a C compiler the install still succeeds: ``hvgpu-guest run`` then says
the shim is missing, and the executor serves every frame through its Python
path (and logs that it does).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM = "hvgpu.guest.shim.libcuda"
SHIM_DIR = os.path.join("hvgpu", "guest", "shim")
SOURCES = ["wire.c", "state.c", "device.c", "memory.c", "vmm.c", "pool.c", "poolcache.c",
           "module.c", "stream.c", "dark.c", "proc.c", "stubs.c", "crash.c", "region.c",
           "shared.c", "pcopy.c", "graph.c",
           "graph_guest.c"]
BURST = "hvgpu.host.executor.liblaunch_burst"
# extension name -> file name: C libraries, not CPython modules
PLAIN_C = {SHIM: "libcuda.so.1", BURST: "liblaunch_burst.so"}


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
        super().build_extension(ext)


FLAGS = ["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall"]

setup(
    ext_modules=[
        Extension(
            SHIM,
            sources=[os.path.join(SHIM_DIR, s) for s in SOURCES],
            depends=[os.path.join(SHIM_DIR, h) for h in
                     ("shim.h", "hvgpu_wire.h", "driver_api.def", "implemented.def")],
            extra_compile_args=FLAGS,
            extra_link_args=["-Wl,-soname,libcuda.so.1", "-pthread"],
            optional=True,
        ),
        Extension(
            BURST,
            sources=[os.path.join("hvgpu", "host", "executor", "launch_burst.c")],
            extra_compile_args=FLAGS,
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildPlainC},
)
