"""How a guest uses the wire: the numbers its two clients share.

A guest speaks the data lane through the ``libcuda.so.1`` shim (C) or through
``hvgpu.guest`` (Python); both coalesce one-way frames, give up on a silent
agent, stage large copies through a region and copy on a few threads the
same way, and read the same environment variables. They take those numbers from
here: Python imports them, and the C header (``python -m hvgpu.virtio.cgen``)
carries each name in :data:`C_CONSTANTS` as ``HVGPU_<name>``.

None of this is on the wire: the agent accepts whatever a guest chooses within
the protocol's limits (``protocol``). Pure data: must not import anything but
``protocol``.
"""

from __future__ import annotations

from hvgpu.virtio import protocol as P

# Environment variables both clients read.
ENV_AGENT = "HVGPU_AGENT"  # the agent's address(es), one per vGPU
ENV_TIMEOUT = "HVGPU_TIMEOUT"  # seconds of silence before giving up (0: never)
ENV_COPY_THREADS = "HVGPU_COPY_THREADS"  # threads that share one large copy
ENV_SYSFS_ROOT = "HVGPU_SYSFS_ROOT"  # where sysfs is, to find the VM's region device

DEFAULT_TIMEOUT = 60.0  # seconds of silence from the agent before giving up
MIN_TIMEOUT = 2.0  # a shorter timeout is raised to this: it must outlast a progress frame
assert MIN_TIMEOUT > P.PROGRESS_EVERY

BATCH_BYTES = 64 << 10  # coalesced one-way frames leave once this much has gathered

# Staged copies through a region (the region lane).
STAGE_MIN = 1 << 20  # pageable copies from this size are staged; smaller go on the socket
STAGE_CHUNK = 8 << 20  # a staged copy moves this much per slot
STAGE_SLOTS = 2  # slots a staged copy alternates between

# The guest's side of a staged chunk, copied on several threads.
PARALLEL_COPY_MIN = 2 << 20  # below this, one memcpy is quicker than waking helpers
PARALLEL_COPY_ALIGN = 4096  # each thread's part starts on this boundary
PARALLEL_COPY_THREADS = 4  # threads per copy by default (fewer on fewer CPUs)
PARALLEL_COPY_MAX_THREADS = 16  # HVGPU_COPY_THREADS is cut to this

# name -> C type of what the C header carries (cgen), as HVGPU_<name> ("i32": a plain
# int literal; "u64" where sizes are computed with it).
C_CONSTANTS = (
    ("ENV_AGENT", "str"), ("ENV_TIMEOUT", "str"), ("ENV_COPY_THREADS", "str"),
    ("ENV_SYSFS_ROOT", "str"),
    ("DEFAULT_TIMEOUT", "f64"), ("MIN_TIMEOUT", "f64"),
    ("BATCH_BYTES", "i32"),
    ("STAGE_MIN", "u64"), ("STAGE_CHUNK", "u64"), ("STAGE_SLOTS", "i32"),
    ("PARALLEL_COPY_MIN", "u64"), ("PARALLEL_COPY_ALIGN", "u64"),
    ("PARALLEL_COPY_THREADS", "i32"), ("PARALLEL_COPY_MAX_THREADS", "i32"),
)
