"""Builds the guest's libcuda.so.1 shim as part of every install of hvgpu.

Everything else is declared in pyproject.toml. The shim is plain C (no
Python API), compiled by setuptools' build_ext because that is what pip runs
on every install, so a user never compiles it by hand. Without a C compiler
the install still succeeds; `hvgpu-guest run` then says the shim is missing.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM = "hvgpu.guest.shim.libcuda"
SHIM_DIR = os.path.join("hvgpu", "guest", "shim")
SOURCES = ["wire.c", "state.c", "device.c", "memory.c", "module.c", "stream.c", "dark.c",
           "proc.c", "stubs.c"]


class BuildShim(build_ext):
    """Names the shim libcuda.so.1 (not a Python extension's name) and links it as one."""

    def get_ext_filename(self, fullname):
        name = super().get_ext_filename(fullname)
        if fullname.split(".")[-1] == SHIM.split(".")[-1]:  # asked with and without the package
            return os.path.join(os.path.dirname(name), "libcuda.so.1")
        return name

    def get_export_symbols(self, ext):
        return [] if ext.name == SHIM else super().get_export_symbols(ext)

    def build_extension(self, ext):
        if ext.name == SHIM:
            # A driver library, not a CPython module: no Python headers or libpython.
            self.compiler.include_dirs = []
            self.compiler.library_dirs = []
        super().build_extension(ext)


setup(
    ext_modules=[Extension(
        SHIM,
        sources=[os.path.join(SHIM_DIR, s) for s in SOURCES],
        depends=[os.path.join(SHIM_DIR, h) for h in
                 ("shim.h", "hvgpu_wire.h", "driver_api.def", "implemented.def")],
        extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall"],
        extra_link_args=["-Wl,-soname,libcuda.so.1", "-pthread"],
        optional=True,
    )],
    cmdclass={"build_ext": BuildShim},
)
