"""hvgpu's C libraries and how they are built: one list for the guest, one for the host.

Two distributions build from this one source tree and import this file from their
setup.py: ``hvgpu`` (the top-level project: host and guest) builds
``GUEST_LIBRARIES + HOST_LIBRARIES``; ``hvgpu-guest`` (guest-dist/hvgpu-guest, the
guest runtime alone) builds ``GUEST_LIBRARIES``. A new guest library is one more
``PlainC`` in ``GUEST_LIBRARIES``: both distributions then build and ship it.

Every library is plain C (no Python API), compiled by setuptools' build_ext
because that is what pip runs on every install, so a user never compiles them by
hand, and loaded with ctypes or by the dynamic loader, never imported by Python.
Their wheels are therefore tagged ``py3-none-<platform>``: one wheel serves every
CPython 3 of that platform.

Without a C compiler the install still succeeds (each library is optional) and
what is then missing says so when used; a library that fails to build is said
loudly at the end of the build, and tests/test_build.py fails where a compiler is
present and a library is missing or older than its sources.

This module is read by setup.py; it must not import hvgpu (the package may not be
importable while it is being built). Run as a script (``python3 build_c.py``) it
builds every library in place, as ``setup.py build_ext --inplace`` does, without
reading pyproject.toml: for a machine that cannot fetch the setuptools that
pyproject.toml's metadata needs (77 or later, for the SPDX licence).
"""

import os
import sys

from setuptools import Extension
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 70.1 has its own; before, the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel can be built here (build_ext --inplace still can)
        bdist_wheel = None

WIRE_INCLUDE = os.path.join("hvgpu", "virtio", "include")
WIRE_HEADER = os.path.join(WIRE_INCLUDE, "hvgpu_wire.h")
FLAGS = ["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall"]


class PlainC(Extension):
    """A C library installed as ``filename`` beside its package's modules.

    ``without`` says what the install lacks when the library did not build."""

    def __init__(self, name, filename, sources, *, without, depends=(), link_args=(),
                 include=()):
        super().__init__(name, sources=list(sources), depends=list(depends) + [WIRE_HEADER],
                         include_dirs=[WIRE_INCLUDE, *include], extra_compile_args=FLAGS,
                         extra_link_args=list(link_args) + ["-pthread"], optional=True)
        self.filename = filename
        self.without = without


SHIM_DIR = os.path.join("hvgpu", "guest", "shim")
SOURCES = ["wire.c", "state.c", "device.c", "context.c", "memory.c", "vmm.c", "pool.c",
           "poolcache.c", "module.c", "launches.c", "occupancy.c", "stream.c", "dark.c",
           "proc.c", "stubs.c", "crash.c", "region.c", "region_lane.c", "pcopy.c", "graph.c",
           "graph_guest.c", "graph_mem.c", "array.c", "managed.c", "ipc.c", "link.c",
           "memops.c"]
SHIM = PlainC(
    "hvgpu.guest.shim.libcuda", "libcuda.so.1",
    [os.path.join(SHIM_DIR, s) for s in SOURCES],
    depends=[os.path.join(SHIM_DIR, h) for h in ("shim.h", "driver_api.def", "implemented.def")],
    link_args=["-Wl,-soname,libcuda.so.1"],
    without="the guest's libcuda.so.1 shim is missing: hvgpu-guest run will refuse to "
            "start programs")

# The VM's NVML (pynvml, nvitop, gpustat, PyTorch's queries), answered by the agent; it
# shares the shim's wire code and sits beside it, so what puts one on the library path
# puts both.
NVML_DIR = os.path.join("hvgpu", "guest", "nvml")
NVML = PlainC(
    "hvgpu.guest.shim.libnvidia_ml", "libnvidia-ml.so.1",
    [os.path.join(NVML_DIR, s) for s in ("nvml.c", "stubs.c")] + [os.path.join(SHIM_DIR,
                                                                              "wire.c")],
    depends=[os.path.join(NVML_DIR, "nvml_api.def"), os.path.join(SHIM_DIR, "shim.h")],
    include=[SHIM_DIR],
    link_args=["-Wl,-soname,libnvidia-ml.so.1"],
    without="NVML tools in the VM (nvidia-ml-py, nvitop, gpustat) will see no GPU")

# The Python API's client (hvgpu/guest/client.py loads it with ctypes): the shim's own
# framing, HELLO, coalescing, region lane, staging and copies, in a library whose
# soname is not libcuda.so.1 (client.c says why).
CLIENT_DIR = os.path.join("hvgpu", "guest", "clientlib")
CLIENT_SOURCES = ["wire.c", "region_lane.c", "region.c", "pcopy.c"]  # of the shim's
CLIENT = PlainC(
    "hvgpu.guest.shim.libhvgpu_client", "libhvgpu-client.so.1",
    [os.path.join(CLIENT_DIR, "client.c")] + [os.path.join(SHIM_DIR, s) for s in CLIENT_SOURCES],
    depends=[os.path.join(SHIM_DIR, "shim.h")],
    include=[SHIM_DIR],
    link_args=["-Wl,-soname,libhvgpu-client.so.1"],
    without="the guest's Python API (hvgpu.guest) cannot reach the agent: it raises an "
            "error saying so")

EXECUTOR_DIR = os.path.join("hvgpu", "host", "executor")
BURST = PlainC(
    "hvgpu.host.executor.liblaunch_burst", "liblaunch_burst.so",
    [os.path.join(EXECUTOR_DIR, "launch_burst.c")],
    depends=[os.path.join(EXECUTOR_DIR, "launch_burst.h")],  # generated, as the wire header
    without="the executor will serve every frame through its slower Python path")

# Everything a VM needs: both distributions build these.
GUEST_LIBRARIES = [SHIM, NVML, CLIENT]
# The host's alone: only the hvgpu distribution builds these.
HOST_LIBRARIES = [BURST]


class BuildPlainC(build_ext):
    """Names each library as its loader expects (not a Python extension's name) and
    links it without Python."""

    failed: list = []

    def _plain(self, fullname):
        # asked with and without the package
        return next((e for e in self.extensions if isinstance(e, PlainC)
                     and (e.name == fullname or e.name.endswith("." + fullname))), None)

    def get_ext_filename(self, fullname):
        name = super().get_ext_filename(fullname)
        plain = self._plain(fullname)
        return os.path.join(os.path.dirname(name), plain.filename) if plain else name

    def get_export_symbols(self, ext):
        return [] if isinstance(ext, PlainC) else super().get_export_symbols(ext)

    def build_extension(self, ext):
        if isinstance(ext, PlainC):
            # No Python headers or libpython.
            self.compiler.include_dirs = []
            self.compiler.library_dirs = []
        try:
            super().build_extension(ext)
        except Exception as exc:
            # build_ext turns an optional extension's failure into one warning line among
            # many; it is kept here to be said again, loudly, once the build is done.
            if ext.optional:
                self.failed.append((ext, str(exc) or type(exc).__name__))
            raise

    def run(self):
        self.failed = []
        super().run()
        for ext, why in self.failed:
            # Optional: an install without them still works, without what they give.
            bar = "!" * 72
            sys.stderr.write(f"\n{bar}\nhvgpu: {getattr(ext, 'filename', ext.name)} FAILED TO "
                             f"BUILD ({ext.name}): {why}\n{getattr(ext, 'without', '')}\n"
                             f"{bar}\n\n")


COMMANDS = {"build_ext": BuildPlainC}

if bdist_wheel is not None:
    class BdistWheelAnyPython(bdist_wheel):
        """A platform wheel for every CPython 3: its C parts never link Python."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False  # it carries machine code: tagged with the platform

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    COMMANDS["bdist_wheel"] = BdistWheelAnyPython


def build_in_place(libraries) -> int:
    """Build ``libraries`` beside their sources (from the current directory, the top of
    the tree); 1 when one that should build did not."""
    from setuptools import Distribution

    dist = Distribution({"ext_modules": libraries, "cmdclass": COMMANDS,
                         "script_name": "build_c.py"})
    command = dist.get_command_obj("build_ext")
    command.inplace = True
    dist.run_command("build_ext")
    return 1 if command.failed else 0


if __name__ == "__main__":
    os.chdir(os.path.dirname(os.path.realpath(__file__)))  # the top of the source tree
    sys.exit(build_in_place(GUEST_LIBRARIES + HOST_LIBRARIES))
