"""Builds hvgpu-guest: the guest's C libraries (build_c.GUEST_LIBRARIES), and the guest's
modules without the build-time tools that need the host's files.

Everything else is declared in pyproject.toml.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_c import COMMANDS, GUEST_LIBRARIES  # noqa: E402

# hvgpu.virtio.cgen renders the wire header from the host's jinja2 templates: a VM
# installs the header it made, not the generator.
NOT_SHIPPED = {("hvgpu.virtio", "cgen")}


class GuestModules(build_py):
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if (m[0], m[1]) not in NOT_SHIPPED]


setup(ext_modules=GUEST_LIBRARIES, cmdclass={**COMMANDS, "build_py": GuestModules})
