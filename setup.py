"""Builds hvgpu's C libraries as part of every install of the ``hvgpu`` distribution.

Everything else is declared in pyproject.toml. The libraries, and how they are
built, are in build_c.py, which the guest distribution (guest-dist/hvgpu-guest)
shares: this one builds the guest's (the ``libcuda.so.1`` shim and its
``libnvidia-ml.so.1``) and the host's
(the executor's loop of one-way frames, ``liblaunch_burst.so``).

Without a C compiler the install still succeeds: ``hvgpu-guest run`` then says
the shim is missing, and the executor serves every frame through its Python
path (and logs that it does).
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_c import COMMANDS, GUEST_LIBRARIES, HOST_LIBRARIES  # noqa: E402

setup(ext_modules=GUEST_LIBRARIES + HOST_LIBRARIES, cmdclass=COMMANDS)
