"""The source of the guest's C client library, ``libhvgpu-client.so.1``: ``client.c``
here and the shim's own ``wire.c``, ``region_lane.c``, ``region.c`` and ``pcopy.c``
(build_c.py). It is built into ``hvgpu/guest/shim/`` and loaded by
``hvgpu.guest.client``; nothing here is imported at run time."""
