"""The agent's side of a VM's region: finding and opening its file.

A libvirt VM with ``hvgpu attach --region`` has an ivshmem-plain device whose memory
QEMU keeps in ``/dev/shm/hvgpu-VM`` (names.region_name) (``<shmem name='hvgpu-VM'>``).
Executors open no host file, so the agent opens it for the executor of that VM's slice and
passes the descriptor over the executor lane. Only the file the slice names is
opened, never through a link, and only when it is a regular file of exactly the
slice's size (what QEMU made for the device).

Must not map the file or talk to libvirt.
"""

from __future__ import annotations

import os
import stat

from hvgpu.errors import CudaError
from hvgpu.host.names import VgpuKey, region_name
from hvgpu.virtio import protocol as P


def open_region(region_dir: str, key: VgpuKey, slice_,
                owners: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(fd, size) of the VM's region file; CudaError saying why not. Its owner must be
    root, this process's user or one of ``owners`` (libvirt's QEMU user): /dev/shm is
    world-writable, and a file another user made there first would be shared with
    that user."""
    limit = getattr(slice_, "region", 0) if slice_ is not None else 0
    if not limit:
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                        f"the slice {str(key)!r} has no region (hvgpu attach --region)")
    name = region_name(key)
    path = os.path.join(region_dir, name)
    try:
        dirfd = os.open(region_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, f"{region_dir}: {exc.strerror}") from None
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dirfd)
    except OSError as exc:
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                        f"{path}: {exc.strerror} (is the VM's <shmem name='{name}'> device "
                        "plugged and the VM running?)") from None
    finally:
        os.close(dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, f"{path} is not a regular file")
        if st.st_uid not in {0, os.getuid(), *owners}:
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                            f"{path} belongs to uid {st.st_uid}, not to root or QEMU's user: "
                            "another local user may have made it to share the VM's memory; "
                            "remove it and restart the VM")
        if st.st_size != limit:
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                            f"{path} holds {st.st_size} bytes, the slice's region is "
                            f"{limit}: the VM runs with an older device (restart it)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size
